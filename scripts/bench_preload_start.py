#!/usr/bin/env python3
"""What loading the planned kernels adds to a server's start: after the weights, or beside them.

On a GPU host with vLLM's Python (`scripts/vllm_carry.py`; the kernels are vLLM's own Triton
ones). Bakes, with no GPU visible, Llama-3.1-8B under TRITON_ATTN, DeepSeek-V2-Lite under
TRITON_MLA (`vllm_e2e.py`'s configurations) and the 128 configurations at scale (four GQA models,
tensor-parallel sizes 1 to 8, KV caches in the model dtype and FP8, blocks of 16 and 32 tokens,
64 and 256 sequences). Then, alternating in fresh processes with the GPU, a start as vLLM's
worker makes it: the weights (`--weights-gb` read from a file, tensor by tensor as vLLM's loader
copies them to the GPU), and the kernels

- `none`: not loaded ahead (each loads from the cache on its first call, as without preload),
- `after`: loaded after the weights, in the start's own thread (the plugin until 2026-12-04),
- `beside`: loaded in a thread from when the model is built (`start_preload`), joined after the
  weights (the plugin joins before vLLM processes them),
- `triton` (with `--triton`): the same kernels loaded after the weights by Triton alone
  (`JITFunction.preload` and the module and launcher load, Triton's own cache manager, nothing
  checked, Triton's key hashed as Triton does in a fresh process): what Triton itself pays,
  which kprecompile's `after` is measured against (reported, never a failure).

With `--profile DIR`, one more `after` start per plan, after the runs and outside their medians,
loads under cProfile and writes what it spent to `DIR/<plan>-after.txt`.

Prints the first start after the bake (where Triton builds its launchers), then per plan and
mode the start's median seconds, what each adds to `none`, the wait at the join, and for the two
single configurations the first engine step after the start (vLLM's own impl, as `vllm_e2e.py
--serve` runs it) against its steady state (goal: at most 2x + 5 ms).

    python scripts/bench_preload_start.py [--weights-gb 8] [--runs 3] [--plans llama,v2-lite,scale]
        [--triton] [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_e2e import (  # noqa: E402 - the script's own directory
    BATCHED_TOKENS,
    GQA_MODEL,
    MAX_NUM_SEQS,
    MLA_MODEL,
    MODEL_LEN,
    scale_configurations,
    selection_for,
    vllm_platform,
)

MODES = ("none", "after", "beside")
SINGLE = {"llama": (GQA_MODEL, "TRITON_ATTN"), "v2-lite": (MLA_MODEL, "TRITON_MLA")}
TENSOR_BYTES = 64 << 20  # a large layer's weight


def configurations(plan: str):
    """(model, serving, backend) of each configuration a plan's start loads."""
    from kprecompile.inputs.models import load_model
    from kprecompile.inputs.serving import ServingParams

    if plan in SINGLE:
        model, backend = SINGLE[plan]
        yield (
            load_model(model),
            ServingParams(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=BATCHED_TOKENS, max_model_len=MODEL_LEN),
            backend,
        )
        return
    for model, serving in scale_configurations(sequences=(64, 256)):
        yield model, serving, "TRITON_ATTN"


def bake(cache: Path, plan: str, target_name: str) -> dict:
    """Plan every configuration, compile the union with one pool, record each manifest (no GPU)."""
    from kprecompile.cache.layout import CacheLayout
    from kprecompile.inputs.targets import TARGETS
    from kprecompile.selection.request import Request
    from kprecompile.warmup.planning import plan as plan_kernels
    from kprecompile.warmup.pool import compile_jobs
    from kprecompile.warmup.warming import warm

    target = TARGETS[target_name]
    layout = CacheLayout.of(cache)
    requests = [Request(m, s, selection_for(m, b, target), (target,)) for m, s, b in configurations(plan)]
    jobs, entries = {}, 0
    for request in requests:
        result = plan_kernels(request)
        jobs.update((job.key, job) for job in result.jobs)
        entries += len(result.jobs)
    failed = [outcome for outcome in compile_jobs(tuple(jobs.values()), layout) if outcome.error]
    for request in requests:
        warm(request, layout)
    return {"configurations": len(requests), "kernels": len(jobs), "entries": entries, "failed": len(failed)}


def start(cache: Path, plan: str, mode: str, weights: Path, profile: Path | None = None) -> dict:
    """One server start in this process (GPU visible); its figures as a dict."""
    import torch

    vllm_platform()
    from kprecompile.cache.layout import CacheLayout
    from kprecompile.inputs.targets import detect_local_target
    from kprecompile.selection.request import Request
    from kprecompile.serve.monitor import JitMonitor
    from kprecompile.serve.runtime import activate
    from kprecompile.warmup.preload import preload, start_preload

    target = detect_local_target()
    requests = [Request(m, s, selection_for(m, b, target), (target,)) for m, s, b in configurations(plan)]
    if mode == "triton":
        layout = CacheLayout.of(cache)
        jobs = _manifest_jobs(requests, layout, target)
        os.environ["TRITON_CACHE_DIR"] = str(layout.triton_dir)
        from triton import knobs

        knobs.cache.dir = str(layout.triton_dir)
    else:
        layout = activate(cache)
    monitor = JitMonitor("warn").install()

    def load_after() -> list:
        return [preload(request, layout, target=target) for request in requests]

    if profile is not None:
        load_after = _profiled(load_after, profile)
    modules = _host_modules(layout)
    torch.cuda.init()
    started = time.perf_counter()
    if mode == "beside":
        background = (
            start_preload(requests[0], layout, target=target)
            if len(requests) == 1
            else _loading_in_turn(requests, layout, target)
        )
    parameters = _load_weights(torch, weights)
    weights_done = time.perf_counter()
    reports = []
    if mode == "after":
        reports = load_after()
    elif mode == "triton":
        reports = [_triton_alone(jobs)]
    elif mode == "beside":
        reports = background.join() if len(requests) > 1 else [background.join()]
    ready = time.perf_counter()
    figures = {
        "start": ready - started,
        "weights": weights_done - started,
        "waited": ready - weights_done,
        "loaded": sum(report.loaded for report in reports),
        "in_memory": sum(report.in_memory for report in reports),
        "preload_seconds": sum(report.seconds for report in reports),
        "compiles_at_start": len(monitor.compiles),
    }
    if plan in SINGLE:
        from vllm_e2e import TritonAttnCase, TritonMlaCase

        model, serving, backend = next(configurations(plan))
        case = (TritonAttnCase if backend == "TRITON_ATTN" else TritonMlaCase)(model, serving, target)
        with _launch_times() as launches:
            figures["first_ms"] = case.timed(case.first_step)
            figures["steady_ms"] = statistics.median(case.timed(case.first_step) for _ in range(20))
        # Each Triton kernel's first launch against its steady launches (host time: what loading costs).
        figures["kernel_first_ms"] = max(times[0] for times in launches.values())
        figures["kernel_over_goal_ms"] = max(
            times[0] - (2 * statistics.median(times[1:]) + 5) for times in launches.values()
        )
    figures["compiles"] = len(monitor.compiles)
    figures["modules_built"] = len(_host_modules(layout) - modules)
    del parameters
    return figures


def _host_modules(layout) -> set[Path]:
    """The launcher and driver modules Triton built with the host's C compiler into the cache."""
    return set(layout.triton_dir.glob("*/*.so"))


def _manifest_jobs(requests, layout, target) -> list:
    """Each kernel of the configurations' manifests once, in preload's order."""
    from kprecompile.warmup.manifest_key import find_manifest
    from kprecompile.warmup.preload import load_order

    jobs = [job for request in requests for job in find_manifest(request, target, layout, remember=False).manifest.jobs]
    return load_order(jobs)


def _triton_alone(jobs):
    """The kernels loaded as Triton loads a cached kernel, nothing of kprecompile's around it."""
    from types import SimpleNamespace

    from kprecompile.tracing.libraries import resolve_kernel

    started = time.perf_counter()
    for job in jobs:
        resolve_kernel(job.kernel).preload(job.specialization)._init_handles()
    return SimpleNamespace(loaded=len(jobs), in_memory=0, seconds=time.perf_counter() - started)


def _profiled(function, path: Path):
    """`function` run under cProfile, what it spent written to `path` (top functions by own and by
    cumulative time)."""
    import cProfile
    import io
    import pstats

    def profiled(*args, **kwargs):
        profiler = cProfile.Profile()
        try:
            return profiler.runcall(function, *args, **kwargs)
        finally:
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("tottime").print_stats(40)
            stats.sort_stats("cumulative").print_stats(60)
            path.write_text(text.getvalue())

    return profiled


class _launch_times:
    """Host milliseconds of each Triton kernel's launches (`JITFunction.run`), by kernel."""

    def __enter__(self) -> dict[str, list[float]]:
        from triton.runtime.jit import JITFunction

        self.launches: dict[str, list[float]] = {}
        self.original = original = JITFunction.run

        def run(function, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original(function, *args, **kwargs)
            finally:
                elapsed = (time.perf_counter() - started) * 1000
                self.launches.setdefault(function.fn.__qualname__, []).append(elapsed)

        JITFunction.run = run
        return self.launches

    def __exit__(self, *exc: object) -> None:
        from triton.runtime.jit import JITFunction

        JITFunction.run = self.original


class _loading_in_turn:
    """The scale plan's configurations loaded one after another in one thread beside the start
    (`start_preload` loads one configuration)."""

    def __init__(self, requests, layout, target) -> None:
        import torch

        from kprecompile.warmup.preload import preload

        device = torch.cuda.current_device()
        self.reports = []

        def run() -> None:
            torch.cuda.set_device(device)
            self.reports = [preload(request, layout, target=target) for request in requests]

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self):
        self.thread.join()
        return self.reports


def _load_weights(torch, weights: Path) -> list:
    """The file's bytes onto the GPU tensor by tensor, as vLLM's default loader copies each
    checkpoint tensor (memory-mapped) into its parameter."""
    import mmap

    parameters = []
    with open(weights, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        host = torch.frombuffer(mapped, dtype=torch.uint8)
        for offset in range(0, len(host), TENSOR_BYTES):
            chunk = host[offset : offset + TENSOR_BYTES]
            parameter = torch.empty(chunk.shape, dtype=torch.uint8, device="cuda")
            parameter.copy_(chunk)
            parameters.append(parameter)
        del host, chunk
    torch.cuda.synchronize()
    return parameters


def _write_weights(path: Path, gigabytes: float) -> None:
    block = os.urandom(TENSOR_BYTES)
    with open(path, "wb") as file:
        for _ in range(int(gigabytes * (1 << 30)) // TENSOR_BYTES):
            file.write(block)


def _child(*arguments: str, hidden: bool = False) -> dict:
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if hidden else {})}
    result = subprocess.run(
        [sys.executable, __file__, *arguments], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode:
        sys.exit(f"{' '.join(arguments[:2])} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights-gb", type=float, default=8.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plans", default="llama,v2-lite,scale")
    parser.add_argument(
        "--child", nargs=4, metavar=("WHAT", "CACHE", "PLAN", "MODE_OR_WEIGHTS"), help=argparse.SUPPRESS
    )
    parser.add_argument("--triton", action="store_true", help="also load the kernels by Triton alone")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="profile each plan's first `after` load into DIR")
    parser.add_argument("--weights", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        what, cache, plan, mode = arguments.child
        result = (
            bake(Path(cache), plan, mode)
            if what == "bake"
            else start(Path(cache), plan, mode, arguments.weights, arguments.profile)
        )
        print(json.dumps(result))
        return
    from kprecompile.inputs.targets import detect_local_target

    target = detect_local_target().name
    if arguments.profile:
        arguments.profile.mkdir(parents=True, exist_ok=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-preload-start-") as scratch:
        weights = Path(scratch) / "weights.bin"
        _write_weights(weights, arguments.weights_gb)
        print(f"weights: {arguments.weights_gb:g} GB in {TENSOR_BYTES >> 20} MiB tensors")
        for plan in arguments.plans.split(","):
            cache = Path(scratch) / plan
            started = time.perf_counter()
            baked = _child("--child", "bake", str(cache), plan, target, hidden=True)
            print(
                f"{plan}: {baked['configurations']} configurations, {baked['entries']} kernels in their manifests "
                f"({baked['kernels']} unique, {baked['failed']} failed) baked with no GPU visible in "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )
            # The first start on a host builds Triton's launchers and driver module (a CPU bake
            # cannot): reported on its own, the runs after it find them.
            first = _child("--child", "start", str(cache), plan, "after", "--weights", str(weights))
            print(
                f"  first start after the bake: {first['start']:.2f} s, {first['modules_built']} launcher and driver "
                f"modules built with the C compiler, kernels loaded in {first['preload_seconds']:.2f} s",
                flush=True,
            )
            modes = MODES + (("triton",) if arguments.triton else ())
            runs = {mode: [] for mode in modes}
            for _ in range(arguments.runs):
                for mode in modes:
                    runs[mode].append(_child("--child", "start", str(cache), plan, mode, "--weights", str(weights)))
            if arguments.profile:
                profile = str(arguments.profile / f"{plan}-after.txt")
                _child("--child", "start", str(cache), plan, "after", "--weights", str(weights), "--profile", profile)
            failed |= _report(plan, runs)
    sys.exit(1 if failed else 0)


def _report(plan: str, runs: dict[str, list[dict]]) -> bool:
    median = {
        mode: {key: statistics.median(run[key] for run in results) for key in results[0]}
        for mode, results in runs.items()
    }
    none = median["none"]["start"]
    failed = False
    for mode in runs:
        figures = median[mode]
        line = f"  {mode:6s} start {figures['start']:.2f} s (weights {figures['weights']:.2f} s"
        if mode != "none":
            line += (
                f", waited {figures['waited']:.2f} s; {figures['loaded']:.0f} loaded + {figures['in_memory']:.0f} "
                f"already in memory in {figures['preload_seconds']:.2f} s): {figures['start'] - none:+.2f} s "
                f"on none, {figures['start'] / none:.2f}x"
            )
        else:
            line += ")"
        if "first_ms" in figures:
            goal = 2 * figures["steady_ms"] + 5
            line += f"; first step {figures['first_ms']:.2f} ms (steady {figures['steady_ms']:.3f} ms"
            line += f", goal {goal:.2f} ms)" if mode != "none" else ")"
            line += f"; slowest first kernel launch {figures['kernel_first_ms']:.2f} ms"
            line += f" ({figures['kernel_over_goal_ms']:+.2f} ms on its 2x steady + 5 ms)"
            failed |= mode in ("after", "beside") and figures["kernel_over_goal_ms"] > 0
        line += f"; compiles {figures['compiles']:.0f}"
        failed |= figures["compiles"] > 0
        print(line, flush=True)
    return failed


if __name__ == "__main__":
    main()
