"""Progress of long work, reported to whoever shows it.

The library reports through a `Progress`; what a user sees is decided by the caller (the CLI's
output module, or the loader hook on rank 0): a bar on a terminal, with log records printed
above it instead of through it; plain lines about every 10% or 10 s when stderr is not a
terminal (a `docker build`, CI), so an unattended bake is quiet but visibly alive; nothing with
`--json`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Protocol

from .wording import printable


class Progress(Protocol):
    def start(self, label: str, total: int, done: int) -> None:
        """Work on `label` begins: `total` units, `done` of them already done."""

    def advance(self, count: int = 1) -> None: ...

    def finish(self) -> None: ...

    def status(self, label: str, text: str) -> None:
        """What runs now where there is nothing to count yet (importing, tracing)."""


class NoProgress:
    def start(self, label: str, total: int, done: int) -> None:
        pass

    def status(self, label: str, text: str) -> None:
        pass

    def advance(self, count: int = 1) -> None:
        pass

    def finish(self) -> None:
        pass


class ProgressBar:
    """A bar on stderr (a terminal)."""

    def __init__(self, unit: str = "kernel") -> None:
        self.unit = unit
        self._bar = None

    def start(self, label: str, total: int, done: int) -> None:
        from tqdm import tqdm

        self.finish()
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._bar = tqdm(
            total=total, initial=done, desc=printable(label), unit=self.unit, file=sys.stderr, dynamic_ncols=True
        )
        # Log records (warnings, -v details) are written above the bar, not into it.
        self._logging = logging_redirect_tqdm()
        self._logging.__enter__()

    def status(self, label: str, text: str) -> None:
        from tqdm import tqdm

        tqdm.write(printable(f"{label}: {text}"), file=sys.stderr)

    def advance(self, count: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def finish(self) -> None:
        if self._bar is not None:
            self._logging.__exit__(None, None, None)
            self._bar.close()
            self._bar = None


class ProgressLines:
    """One plain line on stderr about every 10% or every 10 seconds, and one at the end: for
    stderr that is not a terminal."""

    def __init__(self, unit: str = "kernels", stream=None, interval_seconds: float = 10.0) -> None:
        self.unit = unit
        self.stream = stream
        self.interval_seconds = interval_seconds
        self._label = ""
        self._total = self._done = self._reported = 0
        self._started = self._last = 0.0

    def start(self, label: str, total: int, done: int) -> None:
        self.finish()
        self._label, self._total, self._done, self._reported = label, total, done, done
        self._started = self._last = time.monotonic()
        self._line(f"{done:,} of {total:,} {self.unit} already in the cache" if done else f"{total:,} {self.unit}")

    def status(self, label: str, text: str) -> None:
        self._label = label
        self._line(text)

    def advance(self, count: int = 1) -> None:
        if not self._total:
            return
        self._done += count
        now = time.monotonic()
        step = max(1, self._total // 10)
        if self._done - self._reported >= step or now - self._last >= self.interval_seconds:
            self._reported, self._last = self._done, now
            self._line(
                f"{self._done:,}/{self._total:,} {self.unit} ({100 * self._done // self._total}%), "
                f"{now - self._started:.0f} s"
            )

    def finish(self) -> None:
        if self._total and self._reported < self._done:
            self._line(f"{self._done:,}/{self._total:,} {self.unit} (100%), {time.monotonic() - self._started:.0f} s")
        self._total = 0

    def _line(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(printable(f"kprecompile: {self._label}: {text}"), file=self.stream or sys.stderr, flush=True)
