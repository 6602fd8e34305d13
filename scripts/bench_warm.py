#!/usr/bin/env python3
"""Cold warms of one configuration, side by side: compile workers spawned (each imports torch and
Triton itself) against workers forked from one server process that imported them once, at
several pool sizes, optionally against another checkout of kprecompile (`--against`, the code
before a change); then the same warm again and `verify`, as processes, on the warm cache.

Every cold warm is a fresh process with its own empty cache; the rows alternate start methods
(and checkouts) so that a change in the machine's load falls on all. Ratios are printed from
this one run.

    python scripts/bench_warm.py --model deepseek-r1 --tp 8 --target gfx942 --workers 8,16 --against ../base
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTS = ("spawn", "forkserver")


def timed(command: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, dict]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
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
    parser.add_argument("--starts", default=",".join(STARTS), metavar="METHOD,...", help="start methods to compare")
    parser.add_argument("--against", type=Path, help="another checkout of kprecompile, run the same way")
    parser.add_argument("--hot", type=int, default=5, help="warm-again and verify runs (the median is shown)")
    args = parser.parse_args()

    selection = ["--model", args.model, "--tp", str(args.tp), "--target", args.target]
    selection += [word for family in args.family for word in ("--family", family)]
    counts = [int(n) for n in args.workers.split(",") if n]
    starts = [start for start in args.starts.split(",") if start]
    checkouts = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
    module = [sys.executable, "-m", "kprecompile"]
    rows: dict[tuple[str, str, int], list[tuple[float, dict]]] = {}
    hot: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as scratch:
        run = 0
        warm_caches = {}
        for workers in counts:
            for _ in range(args.repeat):
                for start in starts:
                    for label, checkout in checkouts.items():
                        run += 1
                        cache = Path(scratch) / f"cache-{run}"
                        env = {**os.environ, "KPRECOMPILE_WORKER_START": start}
                        command = [*module, "warm", *selection, "--jobs", str(workers), "--cache-dir", str(cache)]
                        rows.setdefault((label, start, workers), []).append(timed([*command, "--json"], env, checkout))
                        warm_caches[label] = cache
        # The hot paths, alternating checkouts, each on the cache it warmed last.
        for _ in range(args.hot):
            for label, checkout in checkouts.items():
                cache = ["--cache-dir", str(warm_caches[label]), "--json"]
                for command in ("warm", "verify"):
                    seconds, _ = timed([*module, command, *selection, *cache], dict(os.environ), checkout)
                    hot.setdefault(label, {}).setdefault(command, []).append(seconds)
        deep_seconds, deep = timed(
            [*module, "verify", *selection, "--deep", "--cache-dir", str(warm_caches["this"]), "--json"],
            dict(os.environ),
        )

    print(
        f"{args.model} tp{args.tp} {args.target}{' ' + ','.join(args.family) if args.family else ''}: "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    header = f"{'workers':>7}  {'code':<8} {'start':<10} {'wall s':>7} {'trace s':>8} {'compile s':>9}"
    print(f"{header} {'compiled':>8} {'failed':>6}")
    for workers in counts:
        for label in checkouts:
            for start in starts:
                for seconds, report in rows[(label, start, workers)]:
                    print(
                        f"{workers:7d}  {label:<8} {start:<10} {seconds:7.1f} {report['trace_seconds']:8.1f} "
                        f"{report['compile_seconds']:9.1f} {report['compiled']:8d} {report['failed']:6d}"
                    )
        best = {key: min(seconds for seconds, _ in row) for key, row in rows.items() if key[2] == workers}
        if len(starts) == 2:
            for label in checkouts:
                ratio = best[(label, starts[0], workers)] / best[(label, starts[1], workers)]
                print(f"{workers:7d}  {label:<8} {starts[0]} / {starts[1]}, best of each: {ratio:.2f}x")
        if args.against:
            for start in starts:
                ratio = best[("against", start, workers)] / best[("this", start, workers)]
                print(f"{workers:7d}  against / this, {start}, best of each: {ratio:.2f}x")
    for label in checkouts:
        figures = ", ".join(
            f"{command} {statistics.median(times):.2f} s (of {len(times)}: {min(times):.2f} to {max(times):.2f})"
            for command, times in hot[label].items()
        )
        print(f"hot paths, {label}, median: {figures}")
    print(f"verify --deep (every file hashed), this: {deep_seconds:.2f} s (warm: {deep['warm']})")
    if any(report["failed"] for row in rows.values() for _, report in row):
        sys.exit("a cold warm failed kernels")


if __name__ == "__main__":
    main()
