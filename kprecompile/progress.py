"""Progress of long work, reported to whoever shows it.

The library reports through a `Progress`; what a user sees (a bar on a terminal, nothing with
`--json`) is decided by the caller: the CLI's output module, or the loader hook on rank 0.
"""

from __future__ import annotations

import sys
from typing import Protocol


class Progress(Protocol):
    def start(self, label: str, total: int, done: int) -> None:
        """Work on `label` begins: `total` units, `done` of them already done."""

    def advance(self, count: int = 1) -> None: ...

    def finish(self) -> None: ...


class NoProgress:
    def start(self, label: str, total: int, done: int) -> None:
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
        self._bar = tqdm(total=total, initial=done, desc=label, unit=self.unit, file=sys.stderr, dynamic_ncols=True)

    def advance(self, count: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
