"""Install real vLLM releases beside this project, for the tests that run against them.

    python scripts/install_vllm.py [--dest .vllm] [VERSION ...]   (default: every supported release)

Each release goes into its own directory, `<dest>/<version>/`, with `pip install --target`:
the release's wheel itself with `--no-deps` (its dependencies would replace this environment's
CPU build of torch with a multi-GB CUDA build, and Triton with another release), and the light
packages its config, worker and attention modules import, resolved together. Releases conflict
(0.33 needs transformers 5, 0.11 and 0.12 need 4), hence one directory each; a process uses one
by putting it first on PYTHONPATH. The directory is written under a temporary name and renamed
when complete, so an interrupted install is never taken for a finished one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = ROOT / ".vllm"

_TRANSFORMERS_4 = [
    "regex",
    "cachetools",
    "psutil",
    "requests",
    "tqdm",
    "transformers>=4.56,<5",
    "aiohttp",
    "pydantic>=2.12",
    "pyzmq",
    "msgspec",
    "pyyaml",
    "cloudpickle",
    "cbor2",
    "gguf",
    "blake3",
    "pillow",
    "pybase64",
    "py-cpuinfo",
    "diskcache",
    "prometheus_client",
    "openai-harmony",
    "numba==0.61.2",
    "llguidance>=1.3,<1.4",
    "loguru",
]

# Per release: packages resolved with their dependencies, and packages installed without them
# (they would pull torch).
RELEASES: dict[str, tuple[list[str], list[str]]] = {
    "0.11.2": (_TRANSFORMERS_4, ["xgrammar==0.1.25", "compressed-tensors==0.12.2"]),
    "0.12.0": (_TRANSFORMERS_4, ["xgrammar==0.1.27", "compressed-tensors==0.12.2"]),
    "0.33.0": (
        [
            "regex",
            "cachetools",
            "psutil",
            "requests",
            "tqdm",
            "transformers>=5.16.1,<5.21",
            "huggingface_hub>=1.31",
            "tokenizers>=0.23.2",
            "safetensors",
            "aiohttp",
            "pydantic>=2.12",
            "pyzmq",
            "msgspec",
            "pyyaml",
            "cloudpickle",
            "cbor2",
            "gguf",
            "blake3",
            "pillow",
            "pybase64",
            "py-cpuinfo",
            "prometheus_client",
            "numba==0.65.0",
            "llguidance>=1.7,<1.8",
            "ijson",
            "orjson",
            "jsonschema",
            "openai>=2.25",
            "uvloop",
            "oss-harmony>=0.0.11",
            "openai-harmony",
            "fastapi>=0.133,<0.137",
            "starlette>=1.0.1",
            "opentelemetry-api",
            "opentelemetry-sdk",
            "partial-json-parser",
            "loguru",
        ],
        ["xgrammar==0.2.8", "apache-tvm-ffi==0.1.11", "compressed-tensors==0.17.0"],
    ),
}
_PULLS_TORCH = ("torch", "triton")


def release_dir(version: str, dest: Path = DEFAULT_DEST) -> Path:
    return dest / version


def installed(version: str, dest: Path = DEFAULT_DEST) -> bool:
    return (release_dir(version, dest) / "vllm" / "__init__.py").is_file()


def _pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args], check=True
    )


def install(version: str, dest: Path = DEFAULT_DEST) -> Path:
    """Install one release into `<dest>/<version>` (nothing to do when it is there)."""
    final = release_dir(version, dest)
    if installed(version, dest):
        return final
    with_deps, without_deps = RELEASES[version]
    staging = dest / f".{version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _pip("--target", str(staging), *with_deps)
        pulled = [name for name in _PULLS_TORCH if (staging / name).exists()]
        if pulled:
            raise SystemExit(f"the light packages of vLLM {version} pulled in {', '.join(pulled)}; refusing")
        _pip("--target", str(staging), "--no-deps", f"vllm=={version}", *without_deps)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", default=list(RELEASES), metavar="VERSION")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    args = parser.parse_args()
    for version in args.versions:
        if version not in RELEASES:
            sys.exit(f"vLLM {version}: not a supported release ({', '.join(RELEASES)})")
        print(f"vLLM {version}: {install(version, args.dest)}", flush=True)


if __name__ == "__main__":
    main()
