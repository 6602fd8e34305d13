"""Where everything lives in a kprecompile cache. Paths only, no I/O.

    <root>/                        --cache-dir, $KPRECOMPILE_CACHE_DIR, or the user cache dir
      triton-v1/                   TRITON_CACHE_DIR: Triton's own layout, one entry per key
        <base32(key)>/             written by Triton: binary, IRs, metadata, __grp__*.json; or one of
                                   its driver modules (utilities, launchers: a .so, no group file)
      locks-v1/
        <key>.lock                 held while one process compiles (or imports) that key
        import-<id>.lock           held by the import that owns .import-<id>/
      manifests-v8/
        <manifest key>.json        one per (model, serving, engine, target, toolchain, environment):
                                   the jobs that configuration needs, file checksums (its
                                   kernels' and Triton's driver modules'), and the checksum of the
                                   whole document; written last
        <manifest key>.served      touched when a server preloads it (cache/usage.py)
        <manifest key>.checked     the stats of the last whole check (cache/checked.py)
      journals-v1/
        <journal key>.jsonl        kernels serving processes compiled beyond the plan, one record per
                                   line, for the next warm to compile (cache/journal.py)
      aiter-jit-v1/                AITER_JIT_DIR once activated: AITER's own JIT-built HIP modules
      toolchain-v1/
        <stat digest>.json         memo of Triton's toolchain hash (hashing libtriton is slow)
        triton-env-<digest>.json   which set variables libtriton lists as cache-invalidating
      bundle.json, bundle.sig      a bundle's index and its signature (cache/bundle.py, cache/signing.py)
      .kprecompile-bake            in a bundle `bake` writes into (cache/bundle.py)
      .import-<id>/                an import unpacking (cache/staging.py): removed when it ends, or
                                   by the next import or warm once its owner's lock is free

Every top-level directory is a bucket whose name carries the version of its format; a format
change bumps it and leaves the old directory behind instead of migrating it (uv's rule). The
manifest schema is its bucket's version.
"""

from __future__ import annotations

import base64
import binascii
import enum
import os
import re
from dataclasses import dataclass
from pathlib import Path


class Bucket(enum.Enum):
    """The top-level directories of a cache root, each with the version of its format."""

    TRITON = "triton-v1"
    LOCKS = "locks-v1"
    MANIFESTS = "manifests-v8"
    JOURNALS = "journals-v1"
    AITER_JIT = "aiter-jit-v1"
    TOOLCHAIN = "toolchain-v1"

    @property
    def version(self) -> int:
        return int(self.value.rpartition("-v")[2])


# A manifest's format is its bucket's version: changing one changes the other.
MANIFEST_SCHEMA = Bucket.MANIFESTS.version
# Triton writes an entry's files first and this group file last, naming all of them.
GROUP_PREFIX = "__grp__"
# An entry's directory: the base32 of its 32-byte key, unpadded.
_ENTRY_NAME = re.compile(r"[A-Z2-7]{52}")


def triton_entry_name(key: str) -> str:
    """The directory Triton's FileCacheManager uses for a hex cache key."""
    return base64.b32encode(bytes.fromhex(key)).decode("ascii").rstrip("=")


def entry_key(entry_name: str) -> str | None:
    """The Triton key (hex) an entry directory is named for, or None if it is not such a name."""
    if not _ENTRY_NAME.fullmatch(entry_name):
        return None
    try:
        key = base64.b32decode(entry_name + "====").hex()
    except binascii.Error:
        return None
    return key if len(key) == 64 and triton_entry_name(key) == entry_name else None


@dataclass(frozen=True)
class CacheLayout:
    root: Path
    # Read-only roots with the same layout (bundles baked elsewhere), searched after `root`
    # for manifests and kernels and never written to.
    layers: tuple[Path, ...] = ()

    @classmethod
    def of(cls, root: str | os.PathLike[str], layers: tuple[str | os.PathLike[str], ...] = ()) -> CacheLayout:
        """`root` over `layers`, as absolute paths; a layer that is the root itself is dropped."""
        writable = Path(root).expanduser().absolute()
        read_only = (Path(layer).expanduser().absolute() for layer in layers)
        return cls(writable, tuple(dict.fromkeys(layer for layer in read_only if layer != writable)))

    @property
    def roots(self) -> tuple[Path, ...]:
        """Every root, in search order: the writable one first."""
        return (self.root, *self.layers)

    def bucket(self, bucket: Bucket, root: Path | None = None) -> Path:
        return (self.root if root is None else root) / bucket.value

    @property
    def triton_dir(self) -> Path:
        return self.bucket(Bucket.TRITON)

    @property
    def aiter_jit_dir(self) -> Path:
        """AITER's JIT directory (AITER_JIT_DIR) for the HIP modules AITER builds itself."""
        return self.bucket(Bucket.AITER_JIT)

    @property
    def locks_dir(self) -> Path:
        return self.bucket(Bucket.LOCKS)

    @property
    def manifests_dir(self) -> Path:
        return self.bucket(Bucket.MANIFESTS)

    def journals_dir_of(self, root: Path | None = None) -> Path:
        """A root's journals (the writable root's by default)."""
        return self.bucket(Bucket.JOURNALS, root)

    @property
    def toolchain_dir(self) -> Path:
        return self.bucket(Bucket.TOOLCHAIN)

    def triton_entry(self, key: str) -> Path:
        """The writable root's entry for `key`."""
        return self.triton_dir / triton_entry_name(key)

    def triton_entries(self, key: str) -> tuple[Path, ...]:
        """Where an entry for `key` may be, in search order."""
        name = triton_entry_name(key)
        return tuple(self.bucket(Bucket.TRITON, root) / name for root in self.roots)

    def lock_path(self, key: str) -> Path:
        return self.locks_dir / f"{key}.lock"

    def manifest_path(self, manifest_key: str) -> Path:
        """Where the writable root keeps the manifest named `manifest_key`."""
        return self.manifests_dir / f"{manifest_key}.json"

    def manifest_paths(self, manifest_key: str) -> tuple[Path, ...]:
        """Where a manifest named `manifest_key` may be, in search order."""
        return tuple(self.bucket(Bucket.MANIFESTS, root) / f"{manifest_key}.json" for root in self.roots)
