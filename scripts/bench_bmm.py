#!/usr/bin/env python3
"""FP8 BMM precompilation: the engine's serial load-time sweep against `kprecompile warm`.

Three runs, side by side, each a fresh process with its own empty cache:

1. engine sweep: what vLLM's ROCm MLA backend does at weight-load time today: call AITER's
   FP8 BMM wrapper for every m in 1..max-num-seqs, both products, in one process, each new
   specialization compiled by Triton on first sight. Launches are refused by the
   cross-compile driver (there is no GPU), so the figure is compile cost alone.
2. `kprecompile warm`, cold, with all cores.
3. `kprecompile warm` again on the now warm cache.

It also checks that both caches hold the same kernels (the same Triton keys): the plan
covers exactly what the engine compiles. Ratios are printed from this one run.

    python scripts/bench_bmm.py --model deepseek-r1 --tp 8 --target gfx942
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


def engine_sweep(model_spec: str, tp: int, target_name: str, max_num_seqs: int, cache_dir: Path) -> None:
    """Run in a child process: the engine's serial sweep, compiling on first sight."""
    from triton import knobs

    from kprecompile.cache.layout import CacheLayout
    from kprecompile.errors import LaunchRefusedError
    from kprecompile.inputs.models import load_model
    from kprecompile.inputs.serving import ServingParams
    from kprecompile.inputs.targets import TARGETS
    from kprecompile.platforms.triton_driver import active_target
    from kprecompile.shapes.fp8_bmm import FAMILY

    target = TARGETS[target_name]
    # FP8 BMM as AITER's own API calls it: no vLLM release line.
    shapes = FAMILY.enumerate_shapes(
        load_model(model_spec), ServingParams(tensor_parallel_size=tp, max_num_seqs=max_num_seqs), None
    )
    launch = FAMILY.launch
    compiled = []
    with active_target(target), knobs.cache.scope(), knobs.compilation.scope():
        knobs.cache.dir = str(CacheLayout.of(cache_dir).triton_dir)
        knobs.compilation.listener = lambda **event: compiled.append(event["cache_hit"])
        for shape in shapes:
            try:
                launch(shape, target)
            except LaunchRefusedError:
                pass  # compiled (or found in memory); the launch itself needs a GPU
    print(json.dumps({"calls": len(shapes), "compiles": compiled.count(False)}))


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"command failed ({result.returncode}): {' '.join(command)}\n{result.stderr}")
    return seconds, result.stdout


def entries(cache_dir: Path) -> set[str]:
    from kprecompile.cache.layout import CacheLayout

    triton_dir = CacheLayout.of(cache_dir).triton_dir
    return {path.name for path in triton_dir.iterdir() if any(path.glob("__grp__*.json"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="deepseek-r1")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--target", default="gfx942")
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--scaling",
        default="",
        metavar="N,N,...",
        help="also time cold warms with these worker counts, for a pool-scaling table",
    )
    parser.add_argument("--engine-sweep", metavar="CACHE_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_sweep:
        engine_sweep(args.model, args.tp, args.target, args.max_num_seqs, Path(args.engine_sweep))
        return

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-bmm-") as scratch:
        engine_cache, kprecompile_cache = Path(scratch) / "engine", Path(scratch) / "kprecompile"
        selection = [
            "--model",
            args.model,
            "--tp",
            str(args.tp),
            "--target",
            args.target,
            "--max-num-seqs",
            str(args.max_num_seqs),
        ]
        sweep_seconds, sweep_out = timed(
            [sys.executable, __file__, *selection, "--engine-sweep", str(engine_cache)], env
        )
        warm = [
            sys.executable,
            "-m",
            "kprecompile",
            "warm",
            *selection,
            "--family",
            "fp8_bmm",
            "--jobs",
            str(args.jobs),
            "--cache-dir",
            str(kprecompile_cache),
            "--json",
        ]
        cold_seconds, cold_out = timed(warm, env)
        again_seconds, again_out = timed(warm, env)
        sweep, cold, again = json.loads(sweep_out), json.loads(cold_out), json.loads(again_out)
        same = entries(engine_cache) == entries(kprecompile_cache)
        scaling = {}
        for workers in (int(n) for n in args.scaling.split(",") if n):
            cache = Path(scratch) / f"workers-{workers}"
            jobs_at = warm.index("--jobs") + 1
            command = [*warm[:jobs_at], str(workers), *warm[jobs_at + 1 :]]
            command[command.index("--cache-dir") + 1] = str(cache)
            scaling[workers], _ = timed(command, env)

    print(
        f"{args.model} tp{args.tp} {args.target}, m 1..{args.max_num_seqs}, {args.jobs} workers, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    calls, compiles = sweep["calls"], sweep["compiles"]
    print(f"engine sweep, serial, one process : {sweep_seconds:7.1f} s  ({calls} calls, {compiles} compiles)")
    print(f"kprecompile warm, cold            : {cold_seconds:7.1f} s  ({cold['compiled']} compiled)")
    cached = f"{again['compiled']} compiled, {again['cached']} cached"
    print(f"kprecompile warm, again           : {again_seconds:7.2f} s  ({cached})")
    print(f"speedup cold  : {sweep_seconds / cold_seconds:5.1f}x")
    print(f"speedup again : {sweep_seconds / again_seconds:5.0f}x")
    print(f"same kernels in both caches: {same}")
    for workers, seconds in sorted({**scaling, args.jobs: cold_seconds}.items()):
        ratio = sweep_seconds / seconds
        print(f"cold warm with {workers:3d} workers: {seconds:7.1f} s  ({ratio:5.1f}x the serial sweep)")
    if not same or sweep["compiles"] != cold["compiled"]:
        sys.exit("the plan does not match the engine's sweep")


if __name__ == "__main__":
    main()
