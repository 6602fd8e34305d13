#!/usr/bin/env python3
"""Cold warms of one configuration, side by side: compile workers spawned (each imports torch and
Triton itself) against workers forked from one server process that imported them once, at
several pool sizes; then the same warm again and `verify`, as processes, on the warm cache.

Every cold warm is a fresh process with its own empty cache; the rows alternate start methods
so that a change in the machine's load falls on both. Ratios are printed from this one run.

    python scripts/bench_warm.py --model deepseek-r1 --tp 8 --target gfx942 --workers 4,8,16
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

STARTS = ("spawn", "forkserver")


def timed(command: list[str], env: dict[str, str]) -> tuple[float, dict]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if result.returncode not in (0, 1) or not result.stdout.strip():
        sys.exit(f"command failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-3000:]}")
    return seconds, json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="deepseek-r1")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--target", default="gfx942")
    parser.add_argument("--family", action="append", default=[], help="only these families (repeatable)")
    parser.add_argument("--workers", default=str(len(os.sched_getaffinity(0))), metavar="N,N,...")
    parser.add_argument("--repeat", type=int, default=1, help="cold warms per start method and pool size")
    args = parser.parse_args()

    selection = ["--model", args.model, "--tp", str(args.tp), "--target", args.target]
    selection += [word for family in args.family for word in ("--family", family)]
    counts = [int(n) for n in args.workers.split(",") if n]
    rows: dict[tuple[str, int], list[tuple[float, dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as scratch:
        run = 0
        for workers in counts:
            for _ in range(args.repeat):
                for start in STARTS:
                    run += 1
                    cache = Path(scratch) / f"cache-{run}"
                    env = {**os.environ, "KPRECOMPILE_WORKER_START": start}
                    command = [sys.executable, "-m", "kprecompile", "warm", *selection, "--jobs", str(workers)]
                    rows.setdefault((start, workers), []).append(
                        timed([*command, "--cache-dir", str(cache), "--json"], env)
                    )
        warm_cache = Path(scratch) / f"cache-{run}"
        again_seconds, again = timed(
            [sys.executable, "-m", "kprecompile", "warm", *selection, "--cache-dir", str(warm_cache), "--json"],
            dict(os.environ),
        )
        verify_seconds, verified = timed(
            [sys.executable, "-m", "kprecompile", "verify", *selection, "--cache-dir", str(warm_cache), "--json"],
            dict(os.environ),
        )

    print(
        f"{args.model} tp{args.tp} {args.target}{' ' + ','.join(args.family) if args.family else ''}: "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    print(f"{'workers':>7}  {'start':<10} {'wall s':>7} {'trace s':>8} {'compile s':>9} {'compiled':>8} {'failed':>6}")
    for workers in counts:
        for start in STARTS:
            for seconds, report in rows[(start, workers)]:
                print(
                    f"{workers:7d}  {start:<10} {seconds:7.1f} {report['trace_seconds']:8.1f} "
                    f"{report['compile_seconds']:9.1f} {report['compiled']:8d} {report['failed']:6d}"
                )
        spawned = min(seconds for seconds, _ in rows[("spawn", workers)])
        forked = min(seconds for seconds, _ in rows[("forkserver", workers)])
        print(f"{workers:7d}  spawn / forkserver, best of each: {spawned / forked:.2f}x")
    cached = f"{again['cached']} cached, {again['compiled']} compiled"
    print(f"warm again (every file checked): {again_seconds:.2f} s ({cached})")
    print(f"verify: {verify_seconds:.2f} s (warm: {verified['warm']})")
    if any(report["failed"] for row in rows.values() for _, report in row):
        sys.exit("a cold warm failed kernels")


if __name__ == "__main__":
    main()
