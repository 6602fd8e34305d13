"""A vLLM release's Python beside kprecompile, without touching this environment's torch or Triton.

Used by `kprecompile engine install vllm==X` (a builder without vLLM), and by the tests
(scripts/install_vllm.py). Each release goes into its own directory, `<dest>/<version>/`, with
`pip install --target`: the release's wheel with `--no-deps` (its dependencies would replace this
environment's CPU build of torch with a multi-GB CUDA build), its light dependencies, derived from
the release's own metadata: its `Requires-Dist` for this platform, less torch and its builds,
Triton, the CUDA and ROCm libraries and the compiled kernel packages (`HEAVY`), with everything
they need but those, as pip resolves them (a dry run: metadata only); and the Triton its torch
pins (the release's own toolchain: cache keys are toolchain-exact). A package whose dependencies
pull a heavy one in (xgrammar and compressed-tensors need torch) is installed without its
dependencies; the others with theirs, at the versions of that resolution. Releases conflict (0.33
needs transformers 5, 0.11 and 0.12 need 4), hence one directory each; a process uses one by
putting it first on its path. The directory is written under a temporary name and renamed when
complete, so an interrupted install is never taken for a finished one.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ..errors import KprecompileError

# What the release's light dependencies leave out (canonical names, shell patterns). vLLM's modules
# the tests use import none of them at import time, or take this environment's.
HEAVY = (
    "torch*", "triton", "pytorch-triton*",  # this environment's torch (and builds against it) and Triton
    "nvidia-*", "cuda-*", "cupy-*", "nvtx", "pynvvideocodec",  # CUDA libraries
    "amd-*", "amdsmi", "rocm*", "hip-*",  # ROCm libraries (amd-aiter: this environment's)
    "xformers", "flashinfer*", "vllm-flash-attn", "flash-attn*", "deep-gemm", "deep-ep", "tilelang",
    "tokenspeed-*", "*-kernel", "*-kernels",  # compiled kernel packages
)  # fmt: skip


# Pure-Python packages a pattern above names that vLLM's modules import at import: 0.22's
# `quantization/humming.py` imports `humming` (humming-kernels), which imports `cuda.bindings.driver`
# (cuda-bindings, 31 MB with cuda-pathfinder) and `pynvml` (nvidia-ml-py); neither loads a driver
# until called. Without them, 0.22's `get_quantization_config` fails for every quantized model
# (its block-FP8 linear plan on NVIDIA).
LIGHT_DESPITE_THE_NAME = ("humming-kernels", "cuda-bindings", "cuda-pathfinder", "nvidia-ml-py")


def heavy(name: str) -> bool:
    canonical = canonicalize_name(name)
    if canonical in LIGHT_DESPITE_THE_NAME:
        return False
    return any(fnmatch.fnmatchcase(canonical, pattern) for pattern in HEAVY)


class Dependencies(NamedTuple):
    """A release's light dependencies, pinned: those installed with their dependencies, and those
    whose dependencies pull a heavy package in, installed without them (a named tuple: tests load
    this script without registering it as a module, which a dataclass needs)."""

    with_deps: tuple[str, ...]
    without_deps: tuple[str, ...]


def release_dir(version: str, dest: Path) -> Path:
    return dest / version


def installed(version: str, dest: Path) -> bool:
    return (release_dir(version, dest) / "vllm" / "__init__.py").is_file()


def pip_install(*args: str, isolated: bool = False) -> None:
    """pip in this interpreter; its failure is one line with pip's own last words."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", *(["--isolated"] if isolated else []), "install", "--quiet"]
        + ["--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        lines = [
            line for line in result.stderr.splitlines() if line.strip() and not line.startswith("WARNING: Location")
        ]
        raise KprecompileError(f"pip install {' '.join(args[-3:])} failed: {(lines or ['no output'])[-1].strip()}")


def _resolved(*requirements: str, isolated: bool = False) -> dict[str, dict]:
    """What pip would install for `requirements` here, as its report's entries by canonical name
    (a dry run that ignores what is installed: every package is in it, with its metadata);
    `isolated`: from the package index alone, pip's configuration (its find-links) ignored."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        pip_install("--dry-run", "--ignore-installed", "--report", str(report), *requirements, isolated=isolated)
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
    torches = [requirement for requirement in _requires(release) if canonicalize_name(requirement.name) == "torch"]
    if len(torches) != 1:
        raise KprecompileError(f"vLLM {version}'s metadata names no one torch requirement here")
    [torch_entry] = _resolved("--no-deps", _spelled(torches[0])).values()
    tritons = [requirement for requirement in _requires(torch_entry) if canonicalize_name(requirement.name) == "triton"]
    if not tritons and "+" in torch_entry["metadata"]["version"]:
        # A local build found first (a CPU torch, 2.13.0+cpu, in pip's find-links) pins none: the
        # package index's own build of that version says what the release's servers run.
        [torch_entry] = _resolved("--no-deps", _spelled(torches[0]), isolated=True).values()
        tritons = [req for req in _requires(torch_entry) if canonicalize_name(req.name) == "triton"]
    if len(tritons) != 1 or not tritons[0].specifier:
        raise KprecompileError(f"torch {torch_entry['metadata']['version']} (vLLM {version}'s) pins no Triton here")
    [triton] = _resolved("--no-deps", _spelled(tritons[0])).values()
    return str(triton["metadata"]["version"])


def _with_triton(version: str, final: Path) -> None:
    """Put the release's own Triton into its directory (staged beside it, then moved in)."""
    staging = _private_directory(final.parent / f".{version}.triton.partial")
    try:
        pip_install("--target", str(staging), "--no-deps", f"triton=={pinned_triton(version)}")
        for entry in sorted(staging.iterdir(), key=lambda path: path.name != "triton"):
            if entry.name == "triton" or entry.name.startswith("triton-"):
                shutil.rmtree(final / entry.name, ignore_errors=True)
                os.replace(entry, final / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _private_directory(path: Path) -> Path:
    """`path` made afresh, with its missing parents, writable by this user only (0755 whatever the
    umask): engine directories hold code that runs, and `use_engine` refuses others'."""
    shutil.rmtree(path, ignore_errors=True)
    missing = [parent for parent in (path, *path.parents) if not parent.exists()]
    path.mkdir(parents=True)
    for directory in missing:
        directory.chmod(0o755)
    return path


def install(version: str, dest: Path, *, with_triton: bool = False) -> Path:
    """Install one release into `<dest>/<version>` (nothing to do when it is there). With
    `with_triton`, the Triton its torch pins goes in too (the tests run each release on its own
    toolchain); without, this environment's Triton serves, and keys follow it."""
    final = release_dir(version, dest)
    if installed(version, dest):
        if with_triton and not (final / "triton" / "__init__.py").is_file():
            _with_triton(version, final)
        return final
    dependencies = light_dependencies(version)
    with staged(final) as staging:
        pip_install("--target", str(staging), *dependencies.with_deps)
        pulled = [name for name in ("torch", "triton") if (staging / name).exists()]
        if pulled:
            raise KprecompileError(f"the light packages of vLLM {version} pulled in {', '.join(pulled)}; refusing")
        pip_install("--target", str(staging), "--no-deps", f"vllm=={version}", *dependencies.without_deps)
        if with_triton:
            pip_install("--target", str(staging), "--no-deps", f"triton=={pinned_triton(version)}")
    return final


@contextlib.contextmanager
def staged(final: Path) -> Iterator[Path]:
    """A fresh directory beside `final` (0755) to install into; when the block completes it
    replaces `final`, and it is removed whatever happens: an interrupted install is never taken
    for a finished one."""
    staging = _private_directory(final.parent / f".{final.name}.partial")
    try:
        yield staging
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def engines_root() -> Path:
    """Where `kprecompile engine install` puts vLLM releases (KPRECOMPILE_ENGINES_DIR)."""
    from ..inputs import settings

    return settings.ENGINES_DIR.read() / "vllm"


def installed_engines() -> list[Path]:
    """The vLLM releases `kprecompile engine install` put here, oldest first."""
    root = engines_root()
    if not root.is_dir():
        return []
    found = [path for path in root.iterdir() if not path.name.startswith(".") and installed(path.name, root)]
    return sorted(found, key=lambda path: [int(part) if part.isdigit() else 0 for part in path.name.split(".")])


def use_engine(version: str) -> Path | None:
    """Put the release `kprecompile engine install` put here first on this process's path and its
    children's (vLLM's selector and model build run in subprocesses), when it is installed and
    only this user can write it: it is code that runs. None where it is not installed."""
    import importlib

    from ..cache.trust import check_directory

    root = engines_root()
    if not installed(version, root):
        return None
    directory = release_dir(version, root)
    for path in (root.parent, root, directory):
        check_directory(path, "engine directory", follow=True)
    sys.path.insert(0, str(directory))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(directory), os.environ.get("PYTHONPATH"))))
    importlib.invalidate_caches()
    return directory


def triton_in(directory: Path) -> str | None:
    """The version of the Triton installed in an engine's directory."""
    found = sorted(directory.glob("triton-*.dist-info"))
    return found[0].name.removeprefix("triton-").removesuffix(".dist-info") if found else None
