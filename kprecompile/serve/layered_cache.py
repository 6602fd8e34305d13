"""kprecompile's Triton cache manager: checked reads over read-only baked layers and one
writable cache.

Every process `kprecompile.activate` points at the cache uses it
(`TRITON_CACHE_MANAGER=kprecompile.serve.layered_cache:LayeredCacheManager`). Reads look in the
writable cache (`TRITON_CACHE_DIR`) first, then in each layer's Triton bucket
($KPRECOMPILE_CACHE_LAYERS), and serve an entry only when its files are the ones a manifest
recorded, or ones this process wrote (`cache/served.py`); Triton's driver modules likewise.
Writes (misses compiled while serving, driver modules built on first use) go to the writable
cache only, all-or-nothing, so a layer can sit on a read-only image layer. Triton's group files
name an entry's files by their absolute path at write time; here they are found by name in the
entry's own directory, in the writable cache as in layers, so `verify` and Triton always read
the same files and a copied or moved cache serves from itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from triton import knobs
from triton.runtime.cache import CacheManager, FileCacheManager

from ..cache.entries import group_children
from ..cache.files import write_atomic
from ..cache.layout import GROUP_PREFIX, Bucket, CacheLayout
from ..cache.served import SERVED
from ..cache.trust import others_can_write
from ..inputs import settings


def layer_triton_dirs() -> list[str]:
    return [str(layer / Bucket.TRITON.value) for layer in settings.CACHE_LAYERS.read()]


class LayeredCacheManager(CacheManager):
    def __init__(self, key: str, override: bool = False, dump: bool = False):
        self.key = key
        self._delegate = FileCacheManager(key, override, dump) if (override or dump) else None
        writable = knobs.cache.dir
        if not writable:
            raise RuntimeError("Could not create or locate cache dir")
        self.cache_dir = os.path.join(writable, key)
        # Search order: the writable entry, then each layer's.
        self._dirs = [self.cache_dir, *(os.path.join(layer, key) for layer in layer_triton_dirs())]
        layout = CacheLayout.of(Path(writable).parent, settings.CACHE_LAYERS.read())
        self._manifest_dirs = [layout.bucket(Bucket.MANIFESTS, root) for root in layout.roots]

    def get_file(self, filename: str) -> str | None:
        """A single file: one of Triton's driver modules (utilities, launchers). From the
        writable cache, where this host's Triton builds them (never through a link); from a
        layer, only as a manifest recorded it (a bake built it: `warmup/driver_modules.py`)."""
        if self._delegate:
            return self._delegate.get_file(filename)
        path = os.path.join(self.cache_dir, filename)
        if os.path.isfile(path) and not os.path.islink(path):
            # Never a file beside a kernel's group file: Triton writes its modules alone.
            return None if _holds_group(self.cache_dir) else path
        for directory in self._dirs[1:]:
            path = os.path.join(directory, filename)
            if not os.path.lexists(path):
                continue
            problem = others_can_write(directory) or others_can_write(path)
            problem = problem or SERVED.problem(self.key, {filename: path}, self._manifest_dirs)
            if problem is None:
                return path
            SERVED.warn_once(directory, problem)
        return None

    def get_group(self, filename: str) -> dict[str, str] | None:
        """A kernel's files, from the first root whose entry is what a manifest recorded (or
        what this process wrote)."""
        if self._delegate:
            return self._delegate.get_group(filename)
        for directory in self._dirs:
            found = group_children(directory, f"{GROUP_PREFIX}{filename}")
            if found is None:
                continue
            # What others could change after this check is not served, however it checks out now.
            problem = next(filter(None, map(others_can_write, [directory, *found.values()])), None)
            problem = problem or SERVED.problem(self.key, found, self._manifest_dirs)
            if problem is None:
                return found
            SERVED.warn_once(directory, problem)
        return None

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        if self._delegate:
            return self._delegate.put_group(filename, group)
        return self.put(json.dumps({"child_paths": group}), f"{GROUP_PREFIX}{filename}", binary=False)

    def put(self, data, filename: str, binary: bool = True) -> str:
        """Write into the writable cache, all-or-nothing."""
        if self._delegate:
            return self._delegate.put(data, filename, binary)
        path = Path(self.cache_dir) / filename
        write_atomic(path, data if isinstance(data, bytes) else str(data).encode())
        SERVED.wrote(path)
        return str(path)


def _holds_group(directory: str) -> bool:
    try:
        return any(name.startswith(GROUP_PREFIX) for name in os.listdir(directory))
    except OSError:
        return False
