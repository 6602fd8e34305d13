"""The release matrix: the tests inside vLLM, run for any vLLM release on the Triton its torch pins.

    python scripts/release_matrix.py VERSION [VERSION ...] [--table docs/release-matrix.md]

Each release is installed as `kprecompile engine install` installs it (its Python with its own
Triton, `.vllm/<version>/`), then `tests/in_vllm` runs for it alone (KPRECOMPILE_TEST_RELEASES):
its selector against the mirror, capture sizes, each traced family's keys against the launch
path, random engine steps that must miss nothing and negative controls that must miss, the
plugin's warm and verify. One row per release goes into the table (replacing that release's
row): Triton, tests passed / failed / skipped, wall time, date, and the first failures. The
whole pytest output of each release is kept beside its directory, `.vllm/<version>.log`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from kprecompile.errors import KprecompileError
from kprecompile.vllm import install as engine_install
from kprecompile.vllm.releases import release_line

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TABLE = ROOT / "docs" / "release-matrix.md"
HEADER = (
    "| release | line | Triton | passed | failed | skipped | minutes | date | commit | first failures |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
)
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|error)")


def run_release(version: str) -> dict[str, object]:
    """Install `version` (if needed) and run the tests inside vLLM for it alone."""
    directory = engine_install.install(version, ROOT / ".vllm", with_triton=True)
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/in_vllm", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env={**os.environ, "KPRECOMPILE_TEST_RELEASES": version},
        capture_output=True,
        text=True,
        check=False,
    )
    (ROOT / ".vllm" / f"{version}.log").write_text(result.stdout + result.stderr)
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    counts = {kind: int(number) for number, kind in _COUNT.findall(tail)}
    failures = [
        line.split(" - ")[0].removeprefix("FAILED ") for line in result.stdout.splitlines() if line.startswith("FAILED")
    ]
    return {
        "release": version,
        "line": release_line(version, "VERSION").name,
        "triton": engine_install.triton_in(directory),
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0),
        "skipped": counts.get("skipped", 0),
        "minutes": round((time.perf_counter() - started) / 60, 1),
        "date": datetime.date.today().isoformat(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
        or "-",
        "failures": failures[:3],
    }


def write_row(table: Path, row: dict[str, object]) -> None:
    """Replace the release's row of the table (made with its header if absent), rows sorted by release."""
    text = table.read_text() if table.exists() else ""
    before, _, rows_text = text.partition(HEADER)
    if not _:
        before = text or "# vLLM release matrix\n\nWritten by `python scripts/release_matrix.py VERSION...`.\n\n"
    rows = {line.split("|")[1].strip(): line for line in rows_text.splitlines() if line.startswith("| ")}
    failures = "; ".join(f"`{name.rpartition('::')[2]}`" for name in row["failures"]) or "-"
    columns = ("release", "line", "triton", "passed", "failed", "skipped", "minutes", "date", "commit")
    cells = [row[key] for key in columns]
    rows[str(row["release"])] = "| " + " | ".join(map(str, cells)) + f" | {failures} |"
    ordered = sorted(rows, key=lambda release: [int(part) for part in re.findall(r"\d+", release)])
    table.write_text(before + HEADER + "\n".join(rows[release] for release in ordered) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", metavar="VERSION")
    parser.add_argument("--table", type=Path, default=DEFAULT_TABLE)
    args = parser.parse_args()
    for version in args.versions:
        release_line(version, "VERSION")
        row = run_release(version)
        write_row(args.table, row)
        print(
            f"vLLM {version} (Triton {row['triton']}): {row['passed']} passed, {row['failed']} failed, "
            f"{row['skipped']} skipped in {row['minutes']} min (.vllm/{version}.log)",
            flush=True,
        )


if __name__ == "__main__":
    try:
        main()
    except KprecompileError as error:
        sys.exit(f"release_matrix.py: {error}")
