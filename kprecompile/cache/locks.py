"""One OS file lock per compile job, so concurrent processes never compile the same key twice.

`filelock` uses OS locks, released by the kernel when the holder dies: a crashed compiler
never leaves a lock that blocks everyone after it (DESIGN.md fact 9).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError, LockTimeoutError

logger = logging.getLogger(__name__)

LOCK_TIMEOUT_VARIABLE = "KPRECOMPILE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_SECONDS = 1800.0


def lock_timeout_seconds() -> float:
    """$KPRECOMPILE_LOCK_TIMEOUT in seconds, or the default."""
    raw = os.environ.get(LOCK_TIMEOUT_VARIABLE)
    if raw is None or raw == "":
        return DEFAULT_LOCK_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise InputError(LOCK_TIMEOUT_VARIABLE, raw, "a positive number of seconds")
    return value


@contextlib.contextmanager
def hold_lock(path: Path, resource: str, timeout_seconds: float | None = None) -> Iterator[None]:
    """Hold the lock at `path`; say so when waiting; time out naming the variable to raise."""
    from filelock import FileLock, Timeout

    if timeout_seconds is None:
        timeout_seconds = lock_timeout_seconds()
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.warning("Waiting to acquire lock for %s at %s", resource, path)
        try:
            lock.acquire(timeout=timeout_seconds)
        except Timeout:
            raise LockTimeoutError(str(path), timeout_seconds, LOCK_TIMEOUT_VARIABLE) from None
    try:
        yield
    finally:
        lock.release()
