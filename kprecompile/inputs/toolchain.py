"""The toolchain a cache was built with: what must match for its binaries to be served.

Part of every manifest key (see `warmup/manifest_key.py`) and of every bundle's index.

Triton's own key hashes its version, its compiler sources and libtriton's bytes
(docs/design.md, fact 6): a cache built under another Triton build or another Python never hits. Hashing the
400 MB libtriton takes about half a second, so its result is remembered in the cache under a
digest of the sizes and modification times of every file it reads.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from ..cache.files import write_atomic
from ..cache.layout import Bucket, CacheLayout
from ..cache.trust import others_can_write
from .targets import Target

logger = logging.getLogger(__name__)

# How to get what kprecompile traces and compiles with, where it is missing: keys are
# toolchain-exact, so the serving image's own versions, never whatever pip picks.
INSTALL_ADVICE = {
    "triton": (
        "install the Triton your serving image's torch requires, e.g. pip install triton==3.5.0 for vLLM "
        "0.11.2 to 0.13 or triton==3.8.0 for 0.33; on a CPU builder, pip install 'kprecompile[builder]' triton==X"
    ),
    "torch": "install the torch build you serve with first; on a CPU builder, pip install torch==X (its CPU build)",
}


@dataclass(frozen=True)
class Toolchain:
    triton_version: str
    # sha256 of `triton.runtime.cache.triton_key()`.
    triton_key: str
    # Triton's install directory: on ROCm, HIP options hash the absolute paths of its bitcode.
    triton_path: str
    # The interpreter's cache tag (cpython-311): Triton wheels differ per Python ABI.
    python: str
    torch_version: str | None
    aiter_version: str | None
    # CUDA targets: the ptxas release Triton's CUDA backend hashes into every key.
    ptxas: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def _distribution_version(name: str) -> str | None:
    return _version_on_path(name, tuple(sys.path))


@functools.lru_cache(maxsize=64)
def _version_on_path(name: str, path: tuple[str, ...]) -> str | None:
    """Asked once per process and `sys.path`: 1.6 ms a question on the H200 host, and a server's
    preload of 64 configurations asked 256 of them."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def aiter_version() -> str | None:
    """The installed AITER's version: `amd-aiter` on the registry and in newer images, `aiter` in
    images built from its source before it was renamed."""
    return _distribution_version("amd-aiter") or _distribution_version("aiter")


def _triton_key_inputs(package: Path) -> list[Path]:
    """The files `triton_key()` reads (its own module, compiler, backends, language, libtriton)."""
    # Its `__init__.py` too: the memo is then also one of the version it declares.
    files = [package / "__init__.py", package / "runtime" / "cache.py"]
    for sub in ("compiler", "backends", "language"):
        for root, _, names in os.walk(package / sub):
            files += [Path(root) / name for name in names if name.endswith(".py")]
    files += sorted((package / "_C").glob("libtriton.*"))
    return sorted(files)


def stat_digest(files: list[Path]) -> str:
    """A digest of the files' paths, sizes and modification times: what a memo of their content is keyed by."""
    digest = hashlib.sha256()
    for path in files:
        status = path.stat()
        digest.update(f"{path}\0{status.st_size}\0{status.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def triton_dir() -> Path:
    """Triton's package directory, found as `import triton` would find it, without importing it
    (0.1 s that `verify` and a warm `warm` need not pay)."""
    module = sys.modules.get("triton")
    origin = getattr(module, "__file__", None)
    if origin is None:
        spec = importlib.util.find_spec("triton")
        origin = spec.origin if spec is not None else None
    if origin is None:
        import triton  # not installed: its own ImportError

        origin = triton.__file__
    return Path(origin).parent


def _declared_version(package: Path) -> str | None:
    """`__version__` as Triton's `__init__.py` assigns it (a literal in every release from 3.5)."""
    try:
        match = _VERSION_LINE.search((package / "__init__.py").read_text(errors="replace"))
    except OSError:
        return None
    return match.group(1) if match else None


def triton_version() -> str:
    """The Triton this process would import, its `__version__`."""
    version = _declared_version(triton_dir())
    if version is None:
        import triton

        version = triton.__version__
    return version


def triton_key_text(layout: CacheLayout | None = None, remember: bool = True) -> str:
    """Triton's `triton_key()` (its version and the hashes of its files), remembered in the
    cache by the stat of its inputs: computing it hashes libtriton, about 0.35 s. With the memo,
    Triton is not even imported. Asked once per process and cache: a server preloading 128
    configurations read Triton's files for each (0.45 s on the H200 host)."""
    # `remember` too: an answer found without writing the memo must not keep a later call from
    # writing it. Not checked again in the process: after a reinstall in place a process keeps the
    # key of the Triton it imported, as Triton's own `triton_key` does.
    place = (triton_dir(), layout, remember)
    text = _IN_THIS_PROCESS.get(place)
    if text is None:
        text = _IN_THIS_PROCESS[place] = _triton_key_text(layout, remember)
    return text


_IN_THIS_PROCESS: dict[tuple[Path, CacheLayout | None, bool], str] = {}


def _triton_key_text(layout: CacheLayout | None, remember: bool) -> str:
    memo = None
    if layout is not None:
        inputs = _triton_key_inputs(triton_dir())
        name = f"{stat_digest(inputs)}.json"
        memo = layout.toolchain_dir / name
        # A baked layer's memo too (the same image: the same paths, sizes and times of Triton's
        # files): a container whose writable cache is new then hashes libtriton neither. Read
        # there each time, never copied: the writable cache does not outlive the layer with it.
        for path in [memo, *(layer / Bucket.TOOLCHAIN.value / name for layer in layout.layers)]:
            text = _remembered(path, inputs)
            if text is not None:
                return text
    from triton.runtime.cache import triton_key

    text = triton_key()
    if memo is not None and remember:
        try:
            write_atomic(memo, json.dumps({"triton_key_text": text}).encode())
        except OSError as error:  # a read-only cache still works, only slower
            logger.debug("cannot remember the Triton key at %s: %s", memo, error)
    return text


def _remembered(path: Path, inputs: list[Path]) -> str | None:
    """The Triton key a memo holds, when it is this Triton's; None where there is none (a memo
    that is not this Triton's key is named in a warning)."""
    if not os.path.lexists(path):
        return None
    try:
        problem = others_can_write(path.parent) or others_can_write(path)
        if problem:
            logger.debug("not reading the Triton key memo %s: %s", path, problem)
            return None
        text = json.loads(path.read_text())["triton_key_text"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if _is_triton_key(text, triton_version(), inputs):
        return text
    logger.warning("ignoring a remembered Triton key that is not this Triton's (%s): computing it again", path)
    return None


def hand_triton_its_key(layout: CacheLayout) -> bool:
    """Give this process's Triton its key from the cache's memo (checked as `triton_key_text`
    checks it) where Triton has not computed it yet: Triton computes it on its first cache lookup
    by hashing libtriton, 0.37 s of a server's first preload on the H200 host, for a text the
    memo already holds. Triton 3.9 hands its own preload workers their key the same way
    (`triton.runtime.cache.triton_key` replaced, `_compile_warmup_pool.py`). Returns whether it did."""
    from triton.runtime import cache

    asked = getattr(cache.triton_key, "cache_info", None)
    if asked is None or asked().currsize:  # handed already, or computed
        return False
    text = triton_key_text(layout, remember=False)
    if asked().currsize:  # no memo: computed just now, by Triton itself
        return False
    give_triton_its_key(text)
    return True


def give_triton_its_key(text: str) -> None:
    """Make `text` this process's Triton key (`triton_key()`), which Triton would otherwise compute
    by hashing libtriton: for a process whose parent or cache already knows it. Also where another
    module bound Triton's function at its import (Triton's autotuner, torch inductor's
    `triton_compat`, which vLLM's `torch.compile` asks): left there, it hashes libtriton all the same."""
    from triton.runtime import cache

    current = cache.triton_key

    def remembered_triton_key() -> str:
        return text

    # Triton's own, for whoever must put it back (the tests).
    remembered_triton_key.computing = getattr(current, "computing", current)
    rebind_triton_key(current, remembered_triton_key)


def rebind_triton_key(current: object, replacement: object) -> None:
    """`replacement` wherever a module holds `current` as its `triton_key`: Triton's cache module,
    and the modules that bound it at their import."""
    for module in sys.modules.copy().values():
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get("triton_key") is current:
            namespace["triton_key"] = replacement


def _is_triton_key(text: object, version: str, inputs: list[Path]) -> bool:
    """Whether `text` is `triton_key()` of these inputs, as far as checking costs milliseconds: the
    version, then the sha256 of each Python source it reads (hashed here, about 4 ms) and one more
    digest, libtriton's (hashing it is what the memo saves). A memo of plausible digests that are
    not these files' is not taken."""
    if not isinstance(text, str) or not text.startswith(version):
        return False
    digests = text[len(version) :].split("-")
    if len(digests) < 2 or not all(_SHA256.fullmatch(digest) for digest in digests):
        return False
    sources = {hashlib.sha256(path.read_bytes()).hexdigest() for path in inputs if path.suffix == ".py"}
    return sum(digest not in sources for digest in digests) == 1


_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSION_LINE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


def triton_key_digest(layout: CacheLayout | None = None, remember: bool = True) -> str:
    """sha256 of Triton's toolchain key."""
    return hashlib.sha256(triton_key_text(layout, remember).encode("utf-8")).hexdigest()


def ptxas_release(arch: int) -> str:
    """The release line of the ptxas Triton uses for `arch` (Triton hashes its whole banner)."""
    import inspect

    from triton.backends.nvidia.compiler import get_ptxas_version

    # Triton 3.5 has one ptxas for every arch; 3.6 added Blackwell's own.
    banner = get_ptxas_version(arch) if inspect.signature(get_ptxas_version).parameters else get_ptxas_version()
    lines = [line for line in banner.splitlines() if "release" in line]
    return lines[-1].strip() if lines else hashlib.sha256(banner.encode()).hexdigest()


def current_toolchain(
    layout: CacheLayout | None = None, target: Target | None = None, remember: bool = True
) -> Toolchain:
    """This process's toolchain; `target` adds what only its backend hashes (ptxas for CUDA).

    With `remember` false (verify), a Triton key computed here is not written to the cache.
    """
    return Toolchain(
        triton_version=triton_version(),
        triton_key=triton_key_digest(layout, remember),
        triton_path=str(triton_dir()),
        python=sys.implementation.cache_tag,
        torch_version=_distribution_version("torch"),
        aiter_version=aiter_version(),
        ptxas=ptxas_release(int(target.arch)) if target is not None and not target.is_rocm else None,
    )


# What must match for binaries built elsewhere to be served here: Triton's keys hash these.
SERVING_FIELDS = ("triton_key", "triton_path", "python", "ptxas")


def toolchain_differences(
    baked: dict[str, str | None], here: dict[str, str | None], fields: tuple[str, ...] | None = None
) -> list[str]:
    """Each way the toolchain a cache was baked with differs from this process's, in words.

    `fields` limits the comparison (import checks only `SERVING_FIELDS`; verify explains all).
    """
    names = sorted(set(baked) | set(here)) if fields is None else list(fields)
    lines = []
    if any(baked.get(name) != here.get(name) for name in ("triton_key", "triton_path") if name in names):
        lines.append(
            f"toolchain mismatch: baked with Triton key {baked.get('triton_key')} at path "
            f"{baked.get('triton_path')}; this process has {here.get('triton_key')} at {here.get('triton_path')}"
        )
    for name in names:
        if name not in ("triton_key", "triton_path") and baked.get(name) != here.get(name):
            lines.append(f"toolchain mismatch: {name} was {baked.get(name)!r}, here {here.get(name)!r}")
    return lines
