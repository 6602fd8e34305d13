"""Where everything lives in a kprecompile cache. Paths only, no I/O.

    <root>/                        --cache-dir, $KPRECOMPILE_CACHE_DIR, or the user cache dir
      triton-v1/                   TRITON_CACHE_DIR: Triton's own layout, one entry per key
        <base32(key)>/             written by Triton: binary, IRs, metadata, __grp__*.json
      locks-v1/
        <key>.lock                 held while one process compiles that key
      manifests-v1/
        <manifest key>.json        one per (model, serving, engine, target, toolchain, environment):
                                   the jobs that configuration needs, file checksums; written last
      aiter-jit-v1/                AITER_JIT_DIR once activated: AITER's own JIT-built HIP modules
      toolchain-v1/
        <stat digest>.json         memo of Triton's toolchain hash (hashing libtriton is slow)

Every top-level directory name carries a version; a layout change bumps it and leaves the
old directory instead of migrating it.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR_VARIABLE = "KPRECOMPILE_CACHE_DIR"
# Read-only cache roots (baked bundles, image layers) searched after the writable root.
LAYERS_VARIABLE = "KPRECOMPILE_CACHE_LAYERS"
_APP_NAME = "kprecompile"


def default_cache_root() -> Path:
    """$KPRECOMPILE_CACHE_DIR, else the platform's user cache directory."""
    configured = os.environ.get(CACHE_DIR_VARIABLE)
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir(_APP_NAME, appauthor=False))


def triton_entry_name(key: str) -> str:
    """The directory Triton's FileCacheManager uses for a hex cache key."""
    return base64.b32encode(bytes.fromhex(key)).decode("ascii").rstrip("=")


@dataclass(frozen=True)
class CacheLayout:
    root: Path
    # Read-only roots with the same layout (bundles baked elsewhere), searched after `root`
    # for manifests and kernels and never written to.
    layers: tuple[Path, ...] = ()

    @classmethod
    def at(
        cls, root: str | os.PathLike[str] | None = None, layers: tuple[str | os.PathLike[str], ...] | None = None
    ) -> CacheLayout:
        """`root` (default: $KPRECOMPILE_CACHE_DIR or the user cache) over `layers` (default:
        $KPRECOMPILE_CACHE_LAYERS, paths separated by the OS path separator)."""
        writable = Path(root).expanduser().absolute() if root is not None else default_cache_root().absolute()
        if layers is None:
            layers = tuple(part for part in os.environ.get(LAYERS_VARIABLE, "").split(os.pathsep) if part)
        read_only = tuple(Path(layer).expanduser().absolute() for layer in layers)
        return cls(writable, tuple(layer for layer in read_only if layer != writable))

    @property
    def roots(self) -> tuple[Path, ...]:
        """Every root, in search order: the writable one first."""
        return (self.root, *self.layers)

    def triton_entries(self, key: str) -> tuple[Path, ...]:
        """Where an entry for `key` may be, in search order."""
        name = triton_entry_name(key)
        return tuple(root / "triton-v1" / name for root in self.roots)

    def find_manifest(self, manifest_key: str) -> Path | None:
        for root in self.roots:
            path = root / "manifests-v1" / f"{manifest_key}.json"
            if path.is_file():
                return path
        return None

    @property
    def triton_dir(self) -> Path:
        return self.root / "triton-v1"

    @property
    def aiter_jit_dir(self) -> Path:
        """AITER's JIT directory (AITER_JIT_DIR) for the HIP modules AITER builds itself."""
        return self.root / "aiter-jit-v1"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks-v1"

    @property
    def manifests_dir(self) -> Path:
        return self.root / "manifests-v1"

    @property
    def toolchain_dir(self) -> Path:
        return self.root / "toolchain-v1"

    def triton_entry(self, key: str) -> Path:
        return self.triton_dir / triton_entry_name(key)

    def lock_path(self, key: str) -> Path:
        return self.locks_dir / f"{key}.lock"

    def manifest_path(self, manifest_key: str) -> Path:
        return self.manifests_dir / f"{manifest_key}.json"
