"""Files in the cache: all-or-nothing writes and content checksums.

Every write goes through `atomic_file`: a temporary file beside the destination, flushed to
disk, then renamed over it, so that a reader sees the old file or the whole new one and a
crash leaves at most a temporary file that no reader looks at.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

_BLOCK_BYTES = 1 << 20
# Cache files are readable by everyone and writable by their owner (Triton's own files are too).
FILE_MODE = 0o644


def make_directories(path: Path) -> None:
    """`path` and its missing parents, each made writable by its owner alone whatever the umask:
    a cache refuses directories others can write (`trust.py`), so under umask 002 (a user's own
    group, the default on Fedora and RHEL) one it made itself was refused by the next command.
    Made 0755 (a umask only removes bits); nothing that exists is changed."""
    missing = []
    current = Path(path)
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o755)
    if not os.path.isdir(path):  # a file in the way: as `Path.mkdir(exist_ok=True)` says it
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write `path` through; it replaces `path` only if the block succeeds."""
    make_directories(path.parent)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file 0600: servers running as another user (a baked image) must read it.
        os.fchmod(descriptor, FILE_MODE)
        with os.fdopen(descriptor, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    with atomic_file(path) as file:
        file.write(data)


def file_blocks(path: str | os.PathLike[str]) -> Iterator[bytes]:
    with open(path, "rb") as file:
        yield from iter(lambda: file.read(_BLOCK_BYTES), b"")


def sha256_of(blocks: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for block in blocks:
        digest.update(block)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    return sha256_of(file_blocks(path))
