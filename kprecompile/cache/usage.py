"""Who may delete from a cache root while others use it, and how a root says it is a cache.

Warming, importing and preloading hold the root's usage lock shared; `cache rm` and `cache
prune` hold it exclusively while they decide and delete. So a deletion never races an entry a
warm is writing (written before its manifest, it would look unreferenced) or a manifest an
import is installing, and a serving process's preload never finds an entry half-removed. It is
an OS lock (`flock`) on `locks-v1/usage.lock`: it dies with its process, and pruning never
deletes that file.

A root kprecompile writes to carries a `CACHEDIR.TAG` (https://bford.info/cachedir/), so backup
tools skip it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator

from .files import make_directories, write_atomic
from .layout import CacheLayout

logger = logging.getLogger(__name__)

USAGE_LOCK = "usage.lock"
CACHEDIR_TAG = "CACHEDIR.TAG"
_TAG = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This file is a cache directory tag created by kprecompile.\n"
    b"# For information about cache directory tags, see https://bford.info/cachedir/\n"
)


@contextlib.contextmanager
def using(layout: CacheLayout, exclusive: bool = False) -> Iterator[None]:
    """Hold the writable root's usage lock for the block: shared to use it, exclusive to delete."""
    path = layout.locks_dir / USAGE_LOCK
    make_directories(path.parent)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(descriptor, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = "a warm, import or preload is using it" if exclusive else "a prune is deleting from it"
            logger.warning("kprecompile: waiting for %s to be free (%s)", layout.root, holder)
            fcntl.flock(descriptor, mode)
        yield
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def using_if_possible(layout: CacheLayout) -> Iterator[None]:
    """The shared usage lock where the root can hold one (a serving process may see a cache it
    cannot write: it then reads without it)."""
    try:
        context = using(layout)
        context.__enter__()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        context.__exit__(None, None, None)


# Beside a manifest `<key>.json`, `<key>.served`: empty, its modification time the last time a
# serving process loaded the configuration. A warm rewrites the manifest, never this.
SERVED_SUFFIX = ".served"


def served_stamp(manifest: os.PathLike[str] | str) -> str:
    return os.path.splitext(os.fspath(manifest))[0] + SERVED_SUFFIX


def mark_used(manifest: os.PathLike[str] | str) -> None:
    """Record that a configuration was served now (`cache ls` shows it; `cache prune --max-size`
    evicts the least recently served or warmed); nothing where the manifest is read-only."""
    with contextlib.suppress(OSError):
        descriptor = os.open(served_stamp(manifest), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.utime(descriptor)
        finally:
            os.close(descriptor)


def last_served(manifest: os.PathLike[str] | str) -> float | None:
    """When a serving process last loaded the configuration; None if none has."""
    try:
        return os.lstat(served_stamp(manifest)).st_mtime
    except OSError:
        return None


def tag_cache_dir(layout: CacheLayout) -> None:
    """Mark the writable root as a cache directory (once)."""
    tag = layout.root / CACHEDIR_TAG
    if not tag.exists():
        write_atomic(tag, _TAG)
