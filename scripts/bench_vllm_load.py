"""What the vLLM plugin adds to model loading, against vLLM's own sequence, side by side.

    python scripts/bench_vllm_load.py --model deepseek-r1 --tp 8 --target gfx942 --weight-loading-seconds 40

Two fresh processes, each with an empty cache, one after the other:

- today: weight loading (a sleep of the stated length), then vLLM's FP8 BMM pre-compilation
  loop as `process_weights_after_loading` runs it (m = 1..1024, the W_K and W_V products, the
  loop's own tensors, AITER's wrapper as `rocm_aiter_ops.triton_fp8_bmm` calls it), compiling
  each new kernel serially in the process;
- plugin: the background warm starts when the model is built (the plugin's
  `background.start`, same request: the configuration's FP8 BMM and MLA decode kernels), the
  weights load (the same sleep), the warm is joined, then the same loop, which finds its kernels
  in the cache.

Kernels are compiled for the target under the cross-compile driver (the loop ends each call at
the refused launch), so the figures are compile and load times, on any host. Reported: each
sequence's wall time and what it adds to weight loading.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def import_wrapper(target):
    """torch and AITER's FP8 BMM module, imported as a vLLM worker has them before loading weights."""
    from kprecompile.platforms.triton_driver import active_target
    from kprecompile.shapes.fp8_bmm import WRAPPER_MODULE, WRAPPER_NAME
    from kprecompile.tracing.libraries import import_library_module

    with active_target(target):
        return getattr(import_library_module(WRAPPER_MODULE), WRAPPER_NAME)


def loop(bmm, heads: int, nope: int, lora: int, v_dim: int, target, max_m: int = 1024) -> tuple[float, int]:
    """vLLM's load-time loop on meta tensors: seconds and kernels compiled."""
    import torch
    from triton import knobs

    from kprecompile.errors import LaunchRefusedError
    from kprecompile.platforms.triton_driver import active_target

    compiled = []
    started = time.perf_counter()
    with active_target(target), knobs.compilation.scope():
        knobs.compilation.listener = lambda **event: compiled.append(event["cache_hit"])
        scale = torch.empty((), dtype=torch.float32, device="meta")
        w_k = torch.empty((heads, lora, nope), dtype=target.fp8_dtype, device="meta")
        w_v = torch.empty((heads, v_dim, lora), dtype=target.fp8_dtype, device="meta")
        for m in range(1, max_m + 1):
            for weight, k in ((w_k, nope), (w_v, lora)):
                x = torch.empty((heads, m, k), dtype=torch.bfloat16, device="meta")
                try:
                    bmm(x, weight, scale, group_size=128, transpose_bm=True)
                except LaunchRefusedError:
                    pass  # compiled (or loaded); the launch itself needs the GPU
    return time.perf_counter() - started, compiled.count(False)


def child(mode: str, args: argparse.Namespace, cache_dir: str) -> dict:
    from kprecompile.inputs.models import load_model
    from kprecompile.inputs.serving import ServingParams
    from kprecompile.inputs.targets import TARGETS
    from kprecompile.selection.engines import select
    from kprecompile.selection.request import Request
    from kprecompile.serve.runtime import activate
    from kprecompile.serve.vllm import background

    started = time.perf_counter()
    layout = activate(cache_dir)
    target = TARGETS[args.target]
    model = load_model(args.model)
    serving = ServingParams(tensor_parallel_size=args.tp, max_num_seqs=args.max_num_seqs)
    heads = model.num_attention_heads // args.tp
    mla = model.mla
    result: dict = {"mode": mode}
    bmm = import_wrapper(target)
    warm = None
    if mode == "plugin":
        request = Request(model, serving, select(model, "vllm", "ROCM_AITER_MLA"), (target,))
        warm = background.start(
            request, _config_dict(model.source, args.model), str(layout.root), (), workers=args.jobs, rank=0, ranks=1
        )
    time.sleep(args.weight_loading_seconds)
    loaded = time.perf_counter()
    if warm is not None:
        report, errors, waited = warm.join()
        if report is None:
            raise SystemExit(f"background warm failed: {errors}")
        result.update(warm_seconds=report["seconds"], warm_kernels=report["kernels"], waited_seconds=waited)
    loop_seconds, compiles = loop(
        bmm, heads, mla.qk_nope_head_dim, mla.kv_lora_rank, mla.v_head_dim, target, args.max_num_seqs
    )
    result.update(
        loop_seconds=loop_seconds,
        loop_compiles=compiles,
        after_weights_seconds=time.perf_counter() - loaded,
        total_seconds=time.perf_counter() - started,
    )
    return result


def _config_dict(source: str, name: str) -> dict:
    """The config.json the model was loaded from (a file, or the preset)."""
    from importlib import resources

    if Path(source).is_file():
        return json.loads(Path(source).read_text())
    return json.loads((resources.files("kprecompile.inputs.presets") / f"{name}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="deepseek-r1")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--target", default="gfx942")
    parser.add_argument("--weight-loading-seconds", type=float, default=40.0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=1024,
        help="vLLM's loop runs m = 1..1024; smaller for a quick check (the warm plans as many)",
    )
    parser.add_argument("--child", choices=("today", "plugin"))
    parser.add_argument("--cache-dir")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args, args.cache_dir)))
        return
    results = {}
    environment = {**os.environ, "VLLM_ROCM_USE_AITER": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    for mode in ("today", "plugin"):
        with tempfile.TemporaryDirectory(prefix=f"kprecompile-bench-{mode}-") as cache:
            command = [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--cache-dir",
                cache,
                "--model",
                args.model,
                "--tp",
                str(args.tp),
                "--target",
                args.target,
                "--jobs",
                str(args.jobs),
                "--max-num-seqs",
                str(args.max_num_seqs),
                "--weight-loading-seconds",
                str(args.weight_loading_seconds),
            ]
            started = time.perf_counter()
            output = subprocess.run(command, env=environment, capture_output=True, text=True, check=True).stdout
            results[mode] = {
                **json.loads(output.strip().splitlines()[-1]),
                "wall_seconds": time.perf_counter() - started,
            }
    weights = args.weight_loading_seconds
    today, plugin = results["today"], results["plugin"]
    print(json.dumps(results, indent=1))
    print(
        f"{args.model} tp {args.tp} on {args.target}, weight loading {weights:.0f} s, {args.jobs} workers:\n"
        f"  today:  loop after the weights {today['after_weights_seconds']:.1f} s "
        f"({today['loop_compiles']} kernels compiled serially): adds {today['after_weights_seconds'] / weights:.0%}\n"
        f"  plugin: background warm {plugin['warm_seconds']:.1f} s ({plugin['warm_kernels']} kernels) beside the "
        f"weights, waited {plugin['waited_seconds']:.1f} s, loop {plugin['loop_seconds']:.1f} s "
        f"({plugin['loop_compiles']} compiled): adds {plugin['after_weights_seconds'] / weights:.1%}"
    )


if __name__ == "__main__":
    main()
