"""Install real vLLM releases beside this project, for the tests that run against them.

    python scripts/install_vllm.py [--dest .vllm] [--list] [VERSION ...]   (default: every tested release)

Each release gets the Triton its torch pins in its directory too (read from the metadata of both),
so that its tests run on its own toolchain; without VERSION, each of `TEST_TRITONS` is also
installed alone into `.tritons/<version>/`, for the suite's runs under each supported Triton.

Each release goes into its own directory, `<dest>/<version>/`, with `pip install --target`: the
release's wheel with `--no-deps` (its dependencies would replace this environment's CPU build of
torch with a multi-GB CUDA build, and Triton with another release), and its light dependencies,
derived from the release's own metadata: its `Requires-Dist` for this platform, less torch and
its builds, Triton, the CUDA and ROCm libraries and the compiled kernel packages (`HEAVY`), with
everything they need but those, as pip resolves them (a dry run: metadata only). A package whose
dependencies pull one of those in (its own metadata says so: xgrammar and compressed-tensors need
torch) is installed without its dependencies; the others are installed with theirs, at the
versions of that resolution. `--list` prints both sets and installs nothing. Releases conflict
(0.33 needs transformers 5, 0.11 and 0.12 need 4), hence one directory each; a process uses one
by putting it first on PYTHONPATH. The directory is written under a temporary name and renamed
when complete, so an interrupted install is never taken for a finished one.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kprecompile.errors import InputError
from kprecompile.vllm.releases import TESTED_RELEASES, release_line

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = ROOT / ".vllm"
DEFAULT_TRITON_DEST = ROOT / ".tritons"
# The supported Tritons the suite also runs under, beside the test extra's 3.6.0: the oldest a
# supported vLLM release pins, each later series, the newest.
TEST_TRITONS = ("3.5.0", "3.7.1", "3.8.0", "3.9.0")

# What the release's light dependencies leave out (canonical names, shell patterns). vLLM's modules
# the tests use import none of them at import time, or take this environment's.
HEAVY = (
    "torch*", "triton", "pytorch-triton*",  # this environment's torch (and builds against it) and Triton
    "nvidia-*", "cuda-*", "cupy-*", "nvtx", "pynvvideocodec",  # CUDA libraries
    "amd-*", "amdsmi", "rocm*", "hip-*",  # ROCm libraries (amd-aiter: this environment's)
    "xformers", "flashinfer*", "vllm-flash-attn", "flash-attn*", "deep-gemm", "deep-ep", "tilelang",
    "tokenspeed-*", "*-kernel", "*-kernels",  # compiled kernel packages
)  # fmt: skip


def heavy(name: str) -> bool:
    canonical = canonicalize_name(name)
    return any(fnmatch.fnmatchcase(canonical, pattern) for pattern in HEAVY)


class Dependencies(NamedTuple):
    """A release's light dependencies, pinned: those installed with their dependencies, and those
    whose dependencies pull a heavy package in, installed without them (a named tuple: tests load
    this script without registering it as a module, which a dataclass needs)."""

    with_deps: tuple[str, ...]
    without_deps: tuple[str, ...]


def release_dir(version: str, dest: Path = DEFAULT_DEST) -> Path:
    return dest / version


def installed(version: str, dest: Path = DEFAULT_DEST) -> bool:
    return (release_dir(version, dest) / "vllm" / "__init__.py").is_file()


def _pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args], check=True
    )


def _resolved(*requirements: str) -> dict[str, dict]:
    """What pip would install for `requirements` here, as its report's entries by canonical name
    (a dry run that ignores what is installed: every package is in it, with its metadata)."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        _pip("--dry-run", "--ignore-installed", "--report", str(report), *requirements)
        entries = json.loads(report.read_text())["install"]
    return {canonicalize_name(entry["metadata"]["name"]): entry for entry in entries}


def _requires(entry: dict, extras: frozenset[str] | set[str] = frozenset()) -> list[Requirement]:
    """An entry's `Requires-Dist` whose markers hold on this platform, with `extras` asked for."""
    found = []
    for text in entry["metadata"].get("requires_dist") or ():
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *sorted(extras))):
            found.append(requirement)
    return found


def _spelled(requirement: Requirement) -> str:
    """A requirement without its marker (already evaluated), as pip takes it on its command line."""
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    return f"{requirement.name}{extras}{requirement.specifier}"


def light_dependencies(version: str) -> Dependencies:
    """vLLM `version`'s light dependencies, derived from its metadata (module doc)."""
    [release] = _resolved("--no-deps", f"vllm=={version}").values()
    roots = [requirement for requirement in _requires(release) if not heavy(requirement.name)]
    entries = _resolved(*map(_spelled, roots))
    # Every package the roots need without passing through a heavy one, with the extras asked of it.
    extras: dict[str, set[str]] = {}
    pending = [(canonicalize_name(requirement.name), set(requirement.extras)) for requirement in roots]
    while pending:
        name, wanted = pending.pop()
        if name in extras and wanted <= extras[name]:
            continue
        extras[name] = extras.get(name, set()) | wanted
        for requirement in _requires(entries[name], extras[name]):
            if not heavy(requirement.name):
                pending.append((canonicalize_name(requirement.name), set(requirement.extras)))
    # The packages whose dependencies (direct or not) pull a heavy one in.
    edges = {
        name: {canonicalize_name(requirement.name) for requirement in _requires(entry, extras.get(name, set()))}
        for name, entry in entries.items()
    }
    pulling: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, needs in edges.items():
            if name not in pulling and any(heavy(need) or need in pulling for need in needs):
                pulling.add(name)
                grew = True

    def pinned(name: str, with_extras: bool) -> str:
        named = f"{name}[{','.join(sorted(extras[name]))}]" if with_extras and extras[name] else name
        return f"{named}=={entries[name]['metadata']['version']}"

    return Dependencies(
        with_deps=tuple(pinned(name, True) for name in sorted(extras) if name not in pulling),
        without_deps=tuple(pinned(name, False) for name in sorted(extras) if name in pulling),
    )


def pinned_triton(version: str) -> str:
    """The Triton vLLM `version` runs with: the newest its torch pin admits on this platform (torch
    2.9 says `triton==3.5.0`, 2.14 `triton~=3.8.0`), read from the packages' metadata only."""
    [release] = _resolved("--no-deps", f"vllm=={version}").values()
    [torch] = [requirement for requirement in _requires(release) if canonicalize_name(requirement.name) == "torch"]
    [torch_entry] = _resolved("--no-deps", _spelled(torch)).values()
    tritons = [requirement for requirement in _requires(torch_entry) if canonicalize_name(requirement.name) == "triton"]
    if len(tritons) != 1 or not tritons[0].specifier:
        raise SystemExit(f"torch {torch_entry['metadata']['version']} (vLLM {version}'s) pins no Triton here")
    [triton] = _resolved("--no-deps", _spelled(tritons[0])).values()
    return str(triton["metadata"]["version"])


def _with_triton(version: str, final: Path) -> None:
    """Put the release's own Triton into its directory (staged beside it, then moved in)."""
    staging = final.parent / f".{version}.triton.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _pip("--target", str(staging), "--no-deps", f"triton=={pinned_triton(version)}")
        for entry in sorted(staging.iterdir(), key=lambda path: path.name != "triton"):
            shutil.rmtree(final / entry.name, ignore_errors=True)
            os.replace(entry, final / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def install(version: str, dest: Path = DEFAULT_DEST) -> Path:
    """Install one release, with the Triton its torch pins, into `<dest>/<version>` (nothing to do
    when it is there; a release installed without its Triton gets it)."""
    final = release_dir(version, dest)
    if installed(version, dest):
        if not (final / "triton" / "__init__.py").is_file():
            _with_triton(version, final)
        return final
    dependencies = light_dependencies(version)
    staging = dest / f".{version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _pip("--target", str(staging), *dependencies.with_deps)
        pulled = [name for name in ("torch", "triton") if (staging / name).exists()]
        if pulled:
            raise SystemExit(f"the light packages of vLLM {version} pulled in {', '.join(pulled)}; refusing")
        _pip("--target", str(staging), "--no-deps", f"vllm=={version}", *dependencies.without_deps)
        _pip("--target", str(staging), "--no-deps", f"triton=={pinned_triton(version)}")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def triton_dir(version: str, dest: Path = DEFAULT_TRITON_DEST) -> Path:
    return dest / version


def install_triton(version: str, dest: Path = DEFAULT_TRITON_DEST) -> Path:
    """Install Triton `version` alone into `<dest>/<version>` (nothing to do when it is there), for
    the suite's run under each supported Triton (tests/test_tritons.py)."""
    final = triton_dir(version, dest)
    if (final / "triton" / "__init__.py").is_file():
        return final
    staging = dest / f".{version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _pip("--target", str(staging), "--no-deps", f"triton=={version}")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", default=list(TESTED_RELEASES), metavar="VERSION")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    parser.add_argument("--list", action="store_true", help="print each release's light dependencies, install nothing")
    args = parser.parse_args()
    if not args.list and args.versions == list(TESTED_RELEASES):
        for version in TEST_TRITONS:
            print(f"Triton {version}: {install_triton(version)}", flush=True)
    for version in args.versions:
        try:
            release_line(version, "VERSION")
        except InputError as error:
            sys.exit(f"install_vllm.py: {error}")
        if args.list:
            dependencies = light_dependencies(version)
            print(f"vLLM {version} with dependencies: {' '.join(dependencies.with_deps)}")
            print(f"vLLM {version} without dependencies: {' '.join(dependencies.without_deps)}", flush=True)
            continue
        print(f"vLLM {version}: {install(version, args.dest)}", flush=True)


if __name__ == "__main__":
    main()
