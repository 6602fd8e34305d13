"""Staging directories inside a cache root, owned through a lock that dies with their process.

An import unpacks into `<root>/.import-<id>/` (the same file system as the buckets, so that
installing is a rename) while holding an OS lock on `locks-v1/import-<id>.lock`, taken before
the directory exists and dropped after it is gone. A staging directory whose lock nobody holds
(or whose lock file is gone) belongs to a process that was killed: the next import or warm
removes it, instead of it filling the disk forever.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

from .files import make_directories
from .layout import CacheLayout

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".import-"


def _owner_lock(layout: CacheLayout, staging_id: str) -> Path:
    return layout.locks_dir / f"import-{staging_id}.lock"


@contextlib.contextmanager
def staging_directory(layout: CacheLayout) -> Iterator[Path]:
    """A fresh staging directory in the writable root, removed when the block ends."""
    staging_id = uuid.uuid4().hex
    lock = _owner_lock(layout, staging_id)
    make_directories(lock.parent)
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        staging = layout.root / f"{STAGING_PREFIX}{staging_id}"
        staging.mkdir()
        try:
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(lock)
    finally:
        os.close(descriptor)


def is_held(lock: str | os.PathLike[str]) -> bool:
    """Whether a process holds the OS lock on this file now (a missing file is not held)."""
    try:
        descriptor = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


def _staging(layout: CacheLayout) -> list[tuple[Path, Path, bool]]:
    """(staging directory, its owner's lock file, whether the owner holds it) of each import in the
    writable root."""
    try:
        with os.scandir(layout.root) as items:
            candidates = [item for item in items if item.name.startswith(STAGING_PREFIX)]
    except OSError:
        return []
    found = []
    for item in candidates:
        with contextlib.suppress(OSError):
            if not stat.S_ISDIR(item.stat(follow_symlinks=False).st_mode):
                continue
        lock = _owner_lock(layout, item.name.removeprefix(STAGING_PREFIX))
        found.append((Path(item.path), lock, is_held(lock)))
    return found


def dead_staging(layout: CacheLayout) -> list[tuple[Path, Path]]:
    """(staging directory, its owner's lock file) of each import in the writable root whose owner
    is gone: its lock free, or never taken (an older kprecompile)."""
    return [(staging, lock) for staging, lock, held in _staging(layout) if not held]


def importing(layout: CacheLayout) -> bool:
    """Whether an import into the writable root is unpacking now."""
    return any(held for _, _, held in _staging(layout))


def remove_stale_staging(layout: CacheLayout) -> int:
    """Remove the staging directories of the writable root whose owner is gone; how many."""
    dead = dead_staging(layout)
    for staging, lock in dead:
        logger.warning("removing %s, left by an import that did not finish", staging)
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(lock)
    return len(dead)
