"""Files in the cache: all-or-nothing writes and content checksums.

Every write goes through `atomic_file`: a temporary file beside the destination, flushed to
disk, then renamed over it, so that a reader sees the old file or the whole new one and a
crash leaves at most a temporary file that no reader looks at.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

_BLOCK_BYTES = 1 << 20
# Cache files are readable by everyone and writable by their owner (Triton's own files are too).
FILE_MODE = 0o644


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write `path` through; it replaces `path` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
