#!/usr/bin/env python3
"""`plan` with vLLM against the cost of importing the vLLM modules it needs, side by side.

For each case, alternating in fresh processes: importing what the plan needs (torch, Triton,
kprecompile, vLLM's engine arguments, the backend's module, vLLM's model loader and the module of
the model's class, under the target's platform: the plan builds the model's layers with vLLM's
own classes, then traces the backend), then `kprecompile plan` on a new cache (the first: vLLM
builds the layers and selects the backend in the plan's process, and the answers are
remembered) and again on that cache, the trace split over the CPUs (the default) and in one
process (KPRECOMPILE_TRACE_WORKERS=1). Prints medians and each plan's ratio to the import.

    python scripts/bench_plan.py [--runs 3] [--vllm-version 0.12.0] [--cases llama-aiter-fa,r1,v2-lite]

With `--vllm-version`, the release `kprecompile engine install` put in KPRECOMPILE_ENGINES_DIR;
without, the vLLM installed in this environment.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "llama-aiter-fa": (
        ["--model", "llama-3.1-8b-instruct", "--target", "gfx942", "--attention-backend", "ROCM_AITER_FA"],
        "gfx942",
        "vllm.v1.attention.backends.rocm_aiter_fa",
        "vllm.model_executor.models.llama",
    ),
    "llama-triton-attn": (
        ["--model", "llama-3.1-8b-instruct", "--target", "gfx942", "--engine", "vllm"]
        + ["--attention-backend", "TRITON_ATTN", "--max-model-len", "32768"],
        "gfx942",
        "vllm.v1.attention.backends.triton_attn",
        "vllm.model_executor.models.llama",
    ),
    "r1": (
        ["--model", "deepseek-r1", "--tp", "8", "--target", "gfx942"],
        "gfx942",
        "vllm.v1.attention.backends.mla.rocm_aiter_mla",
        "vllm.model_executor.models.deepseek_v2",
    ),
    "v2-lite": (
        ["--model", "deepseek-v2-lite", "--engine", "vllm", "--attention-backend", "TRITON_MLA", "--target", "gfx942"]
        + ["--max-model-len", "8192", "--max-num-seqs", "64"],
        "gfx942",
        "vllm.v1.attention.backends.mla.triton_mla",
        "vllm.model_executor.models.deepseek_v2",
    ),
}

IMPORT = """
import sys
from kprecompile.vllm.install import use_engine
if sys.argv[1] != "-":
    use_engine(sys.argv[1])
from kprecompile.inputs.targets import TARGETS
from kprecompile.platforms.triton_driver import active_target
from kprecompile.tracing.libraries import import_library_module
with active_target(TARGETS[sys.argv[2]]):
    import_library_module(sys.argv[3])
    import_library_module("vllm.engine.arg_utils")
    import_library_module("vllm.model_executor.model_loader.utils")
    import_library_module(sys.argv[4])
import os
os._exit(0)  # as `kprecompile` ends (`cli.run`): the interpreter's teardown is not importing
"""


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if result.returncode:
        sys.exit(f"{' '.join(command[:6])}... failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--vllm-version", default=None)
    parser.add_argument("--cases", default="llama-aiter-fa,r1,v2-lite")
    arguments = parser.parse_args()
    version = ["--vllm-version", arguments.vllm_version] if arguments.vllm_version else []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    one = {**env, "KPRECOMPILE_TRACE_WORKERS": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as scratch:
        for name in arguments.cases.split(","):
            args, target, module, model_module = CASES[name]
            times: dict[str, list[float]] = {"import": [], "first": [], "again": [], "again, one process": []}
            for run in range(arguments.runs):
                cache = Path(scratch) / f"{name}-{run}"
                plan = [sys.executable, "-m", "kprecompile", "plan", *args, *version, "--cache-dir", str(cache)]
                importing = [sys.executable, "-c", IMPORT, arguments.vllm_version or "-", target, module, model_module]
                times["import"].append(timed(importing, env))
                times["first"].append(timed(plan, env))
                times["again"].append(timed(plan, env))
                times["again, one process"].append(timed(plan, one))
            medians = {mode: statistics.median(values) for mode, values in times.items()}
            imports = medians["import"]
            print(f"{name} ({' '.join(args)}), medians of {arguments.runs}:")
            for mode, seconds in medians.items():
                ratio = "" if mode == "import" else f"  {seconds / imports:.2f}x the import"
                print(f"  {mode:20s} {seconds:6.2f} s{ratio}", flush=True)


if __name__ == "__main__":
    main()
