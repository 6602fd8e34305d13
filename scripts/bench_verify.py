#!/usr/bin/env python3
"""How fast `verify` answers on a warm cache, side by side with `warm` finding it warm.

Warms the configuration first (reusing `--cache-dir` when it is already warm), then times in
one run:

1. `kprecompile verify` as a fresh process (what a readiness probe or a CI step runs), wall;
2. `kprecompile.verify()` in-process, as a serving process calls it (torch and Triton
   already imported), first call and later calls;
3. the same with `deep=True` (every file's sha256);
4. `kprecompile warm` as a fresh process on the same warm cache, for comparison.

    python scripts/bench_verify.py --model deepseek-r1 --tp 8 --target gfx942
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_process(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="deepseek-r1")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--target", default="gfx942")
    parser.add_argument("--cache-dir", type=Path, default=None, help="reuse this cache (warmed if needed)")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-verify-") as scratch:
        cache = args.cache_dir or Path(scratch) / "cache"
        selection = ["--model", args.model, "--tp", str(args.tp), "--target", args.target, "--cache-dir", str(cache)]
        command = [sys.executable, "-m", "kprecompile"]
        started = time.perf_counter()
        subprocess.run([*command, "warm", *selection], check=True, stdout=subprocess.DEVNULL)
        print(f"warm (setup): {time.perf_counter() - started:.1f} s")
        if subprocess.run([*command, "verify", *selection], stdout=subprocess.DEVNULL).returncode != 0:
            sys.exit("the cache is not warm after warm")

        cli = [timed_process([*command, "verify", *selection]) for _ in range(args.runs)]
        warm_again = [timed_process([*command, "warm", *selection]) for _ in range(args.runs)]

        import kprecompile
        from kprecompile.inputs.settings import cache_layout
        from kprecompile.inputs.targets import resolve_target

        model = kprecompile.load_model(args.model)
        serving = kprecompile.ServingParams(tensor_parallel_size=args.tp)
        targets = [resolve_target(args.target)]
        layout = cache_layout(cache)

        def in_process(deep: bool = False) -> tuple[float, int]:
            started = time.perf_counter()
            report = kprecompile.verify(
                kprecompile.Request(model, serving, kprecompile.select(model), tuple(targets)), layout, deep=deep
            )
            assert report.warm, report
            return time.perf_counter() - started, report.targets[0].kernels

        first, kernels = in_process()
        later = [in_process()[0] for _ in range(args.runs)]
        deep, _ = in_process(deep=True)

    median = statistics.median
    print(f"{args.model} tp{args.tp} {args.target}: {kernels} kernels, {args.runs} runs each, medians")
    print(f"verify, fresh process (wall)  : {median(cli):6.3f} s  (min {min(cli):.3f})")
    print(f"verify, in-process, first     : {first:6.3f} s")
    print(f"verify, in-process, later     : {median(later):6.3f} s  (min {min(later):.3f})")
    print(f"verify --deep, in-process     : {deep:6.3f} s")
    print(
        f"warm on the warm cache (wall) : {median(warm_again):6.3f} s  ({median(warm_again) / median(cli):.1f}x verify)"
    )


if __name__ == "__main__":
    main()
