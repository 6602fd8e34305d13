"""One OS file lock per compile job, so concurrent processes never compile the same key twice.

`filelock` uses OS locks, released by the kernel when the holder dies: a crashed compiler
never leaves a lock that blocks everyone after it (docs/design.md, fact 9).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from ..errors import LockTimeoutError

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def hold_lock(path: Path, resource: str, timeout_seconds: float, timeout_variable: str) -> Iterator[None]:
    """Hold the lock at `path`: try first, then say who waits for what, and time out naming
    the variable (`timeout_variable`) that raises the timeout."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.warning("Waiting to acquire lock for %s at %s", resource, path)
        try:
            lock.acquire(timeout=timeout_seconds)
        except Timeout:
            raise LockTimeoutError(str(path), timeout_seconds, timeout_variable) from None
    try:
        yield
    finally:
        lock.release()
