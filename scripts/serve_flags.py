"""Write kprecompile/vllm/serve_flags.json: every flag `vllm serve` takes in the given releases,
and how many values each reads, from each release's own parser. A builder without vLLM checks a
pasted `vllm serve` line against it (`kprecompile/inputs/serve_line.py`).

    python scripts/serve_flags.py [--dest .vllm] [VERSION ...]   (default: every release in --dest)
    python scripts/serve_flags.py --add VERSION ...   (into the table as it is: the release matrix)

Each release is read in a process of its own, from `<dest>/<version>` (scripts/install_vllm.py
installs them). A flag in any of them is in the table: a line pasted from an older release's
deployment still reads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "kprecompile" / "vllm" / "serve_flags.json"
_READ = (
    "import json; from kprecompile.inputs.targets import TARGETS; "
    "from kprecompile.vllm.serve_parser import parser_flags, release_parser; "
    "print(json.dumps(parser_flags(release_parser(TARGETS['gfx942']))))"
)


def release_flags(directory: Path) -> dict[str, str]:
    environment = {**os.environ, "PYTHONPATH": str(directory), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-c", _READ], env=environment, capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"{directory}: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".vllm")
    parser.add_argument(
        "--add",
        action="store_true",
        help="add the releases to the table as it is (a release older than its newest adds only new flags)",
    )
    parser.add_argument("versions", nargs="*")
    arguments = parser.parse_args()
    versions = arguments.versions or [p.name for p in arguments.dest.iterdir() if (p / "vllm").is_dir()]
    versions = sorted(versions, key=Version)
    flags: dict[str, str] = {}
    known: list[str] = []
    if arguments.add:
        table = json.loads(TABLE.read_text())
        flags, known = dict(table["flags"]), list(table["releases"])
    newest = max(known, key=Version, default=None)
    for version in versions:  # oldest first: the newest release's arity wins
        read = release_flags(arguments.dest / version)
        older = newest is not None and Version(version) < Version(newest)
        for flag, arity in read.items():
            if flags.get(flag, arity) != arity:
                print(f"{flag}: {flags[flag]} values before {version}, {arity} from it", file=sys.stderr)
        flags.update({flag: arity for flag, arity in read.items() if not (older and flag in flags)})
        print(f"vLLM {version}: {len(read)} flags", file=sys.stderr)
    versions = sorted(set(known) | set(versions), key=Version)
    document = {"releases": versions, "flags": dict(sorted(flags.items()))}
    TABLE.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{TABLE}: {len(flags)} flags of vLLM {', '.join(versions)}", file=sys.stderr)


if __name__ == "__main__":
    main()
