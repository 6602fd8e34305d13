"""The AITER commit each vLLM release's ROCm image builds, read from the release's own sdist.

    python scripts/aiter_pins.py [VERSION ...]     (default: every release kprecompile knows a line for)

vLLM's `docker/Dockerfile.rocm_base` pins AITER (`ARG AITER_BRANCH=...`); the wheel does not ship
it, the sdist does. For each release this streams the sdist from the package index pip uses
(PEP 691 JSON of its simple page), reads that one file out of the archive, and prints the table
`kprecompile/vllm/aiter_source.AITER_PINS` holds, marking where they differ. Nothing is unpacked
to disk and nothing of the archive runs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kprecompile.vllm.aiter_source import AITER_PINS  # noqa: E402

DOCKERFILE = "docker/Dockerfile.rocm_base"
PIN = re.compile(r'^ARG AITER_BRANCH="?([^"\s]+)"?', re.MULTILINE)
# An sdist is tens of MB; the Dockerfile, a few KB.
MAX_DOCKERFILE_BYTES = 1 << 20


def index_url() -> str:
    """The package index pip is configured with (`pip config get global.index-url`), else PyPI's."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
    )
    url = result.stdout.strip() if result.returncode == 0 else ""
    return (url or "https://pypi.org/simple").rstrip("/")


def sdists(index: str) -> dict[str, str]:
    """vLLM's sdists on the index: version -> URL."""
    request = urllib.request.Request(f"{index}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    found = {}
    for entry in files:
        match = re.fullmatch(r"vllm-(\d+\.\d+\.\d+)\.tar\.gz", entry["filename"])
        if match:
            found[match.group(1)] = entry["url"]
    return found


def pin_of(url: str) -> str | None:
    """`AITER_BRANCH` of the sdist's Dockerfile, read as the archive streams past."""
    with urllib.request.urlopen(url, timeout=300) as response, tarfile.open(fileobj=response, mode="r|gz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith("/" + DOCKERFILE) and member.size <= MAX_DOCKERFILE_BYTES:
                text = tar.extractfile(member).read().decode()
                match = PIN.search(text)
                return match.group(1) if match else None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", metavar="VERSION")
    args = parser.parse_args()
    available = sdists(index_url())
    versions = args.versions or sorted(
        {version for version in available if tuple(map(int, version.split("."))) >= (0, 11, 2)} | set(AITER_PINS),
        key=lambda version: tuple(map(int, version.split("."))),
    )
    for version in versions:
        pin = pin_of(available[version]) if version in available else None
        known = AITER_PINS.get(version)
        note = "" if pin == known else f"   # aiter_source.AITER_PINS has {known!r}"
        print(f"    {json.dumps(version)}: {json.dumps(pin) if pin else None},{note}", flush=True)


if __name__ == "__main__":
    main()
