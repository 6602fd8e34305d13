#!/usr/bin/env python3
"""What checking served bytes adds to `preload`, side by side with loading them unchecked.

Warms the configuration first (reusing `--cache-dir` when it is already warm), then, alternating
in one run, preloads the whole plan in fresh processes (as a serving process does after
`activate`): with kprecompile's checks as they run (the default: a stat per file where every
file is as the warm's whole check left it, `cache/checked.py`), with every file hashed (that
memo not used), and with the check switched off (the binaries loaded as found, which is what a
server without kprecompile's manager does), each switched inside the benchmark's child process
only. Prints medians and their ratios.

    python scripts/bench_preload.py --model deepseek-r1 --tp 8 --target gfx942
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import json, sys, time
import kprecompile
from kprecompile.cache import served
from kprecompile.warmup.preload import preload
from kprecompile.serve.runtime import activate
from kprecompile.inputs.targets import resolve_target
if sys.argv[5] == "unchecked":
    served.SERVED.problem = lambda *args: None
if sys.argv[5] == "hashed":
    served.SERVED.checked = lambda *args: None
layout = activate(sys.argv[1])
model = kprecompile.load_model(sys.argv[2])
serving = kprecompile.ServingParams(tensor_parallel_size=int(sys.argv[3]))
started = time.perf_counter()
request = kprecompile.Request(model, serving, kprecompile.select(model))
report = preload(request, layout, target=resolve_target(sys.argv[4]))
print(json.dumps({"seconds": time.perf_counter() - started, "loaded": report.loaded, "compiled": report.compiled}))
"""


def preload_once(cache: Path, args: argparse.Namespace, mode: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(cache), args.model, str(args.tp), args.target, mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="deepseek-r1")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--target", default="gfx942")
    parser.add_argument("--cache-dir", type=Path, default=None, help="reuse this cache (warmed if needed)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-preload-") as scratch:
        cache = args.cache_dir or Path(scratch) / "cache"
        selection = ["--model", args.model, "--tp", str(args.tp), "--target", args.target, "--cache-dir", str(cache)]
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kprecompile", "warm", *selection], check=True, stdout=subprocess.DEVNULL)
        print(f"warm (setup): {time.perf_counter() - started:.1f} s")
        runs: dict[str, list[dict]] = {"checked": [], "hashed": [], "unchecked": []}
        for _ in range(args.runs):
            for mode in runs:
                runs[mode].append(preload_once(cache, args, mode))
    for mode, results in runs.items():
        if any(result["compiled"] for result in results):
            sys.exit(f"{mode}: a preload compiled kernels; the cache is not warm")
    checked, hashed, unchecked = (
        statistics.median(result["seconds"] for result in runs[mode]) for mode in ("checked", "hashed", "unchecked")
    )
    kernels = runs["checked"][0]["loaded"]
    print(f"preload of {kernels} kernels, median of {args.runs} fresh processes each:")
    print(f"  checked (a stat per file, unchanged since the warm's whole check): {checked:.3f} s")
    print(f"  hashed (sha256 of every file loaded):                           {hashed:.3f} s")
    print(f"  unchecked:                                                      {unchecked:.3f} s")
    print(f"  checked / unchecked: {checked / unchecked:.2f}x (+{checked - unchecked:.3f} s)")
    print(f"  hashed / unchecked: {hashed / unchecked:.2f}x (+{hashed - unchecked:.3f} s)")


if __name__ == "__main__":
    main()
