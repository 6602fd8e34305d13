"""One OS file lock per compile job, so concurrent processes never compile the same key twice.

The locks are `flock`s, released by the kernel when the holder dies: a crashed compiler never
leaves a lock that blocks everyone after it (docs/design.md, fact 9). A holder deletes its lock
file as it lets go, so a warm leaves no file per kernel behind. Deleting a lock file is safe only
with one rule, kept by every taker: after locking, check that the path still names the file
locked (the holder before may have deleted it meanwhile); if not, take the new one. `filelock`
never deletes a lock file on Unix for this reason, so the rule is kept here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import LockTimeoutError
from .files import make_directories

logger = logging.getLogger(__name__)

_POLL_SECONDS = 0.05


def try_lock(path: Path) -> int | None:
    """A descriptor holding the lock named `path`, or None while another process holds it."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        except BaseException:
            os.close(descriptor)
            raise
        if _names(path, descriptor):
            return descriptor
        os.close(descriptor)  # the holder before deleted it as it let go: take the file there now


def release(path: Path, descriptor: int) -> None:
    """Let go of a lock from `try_lock`, deleting its file (still held, so no taker is misled)."""
    try:
        if _names(path, descriptor):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        os.close(descriptor)


def remove_if_free(path: Path) -> bool:
    """Delete a lock file nobody holds (a holder killed before it let go leaves one); False if held."""
    try:
        descriptor = try_lock(path)
    except OSError:
        return False
    if descriptor is None:
        return False
    release(path, descriptor)
    return True


def hold_lock(
    path: Path, resource: str, timeout_seconds: float, timeout_variable: str
) -> contextlib.AbstractContextManager[None]:
    """Hold the lock at `path`: try first, then say who waits for what, and time out naming
    the variable (`timeout_variable`) that raises the timeout."""

    def say_who_waits() -> None:
        logger.warning("Waiting to acquire lock for %s at %s", resource, path)

    return _holding(
        path, timeout_seconds, say_who_waits, lambda: LockTimeoutError(str(path), timeout_seconds, timeout_variable)
    )


def hold_briefly(path: Path, timeout_seconds: float) -> contextlib.AbstractContextManager[None]:
    """A lock held for milliseconds (a journal's append): a short wait, then an OSError naming it."""
    return _holding(
        path,
        timeout_seconds,
        lambda: None,
        lambda: OSError(errno.ETIMEDOUT, f"another process held the lock for {timeout_seconds:g} s", str(path)),
    )


@contextlib.contextmanager
def _holding(
    path: Path, timeout_seconds: float, on_first_wait: Callable[[], None], timed_out: Callable[[], Exception]
) -> Iterator[None]:
    descriptor = _wait(path, timeout_seconds, on_first_wait)
    if descriptor is None:
        raise timed_out()
    try:
        yield
    finally:
        release(path, descriptor)


def _wait(path: Path, timeout_seconds: float, on_first_wait: Callable[[], None]) -> int | None:
    make_directories(path.parent)
    descriptor = try_lock(path)
    if descriptor is not None:
        return descriptor
    on_first_wait()
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
        descriptor = try_lock(path)
        if descriptor is not None:
            return descriptor
    return None


def _names(path: Path, descriptor: int) -> bool:
    """Whether `path` is still the file open at `descriptor`."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)
