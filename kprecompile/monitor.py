"""The JIT monitor: kernels that still compile in a serving process after it was prepared.

Counts compiles through Triton's compilation listener (`cache_hit` false), naming each kernel
and specialization, and follows `KPRECOMPILE_STRICT`: `off` counts only, `warn` (default) logs
each, `error` raises in the launching call. At exit it prints one summary line.
"""

from __future__ import annotations

import atexit
import logging
import sys
from dataclasses import dataclass
from typing import Any

from . import settings
from .errors import InputError, UnplannedCompileError
from .wording import plural

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JitCompile:
    kernel: str
    specialization: str
    seconds: float


class JitMonitor:
    """Watches for kernels compiled in this process after it was prepared."""

    def __init__(self, mode: settings.StrictMode | None = None):
        self.mode = settings.STRICT.read() if mode is None else mode
        if self.mode not in settings.STRICT_MODES:
            raise InputError(settings.STRICT.name, self.mode, settings.STRICT.expected)
        self.compiles: list[JitCompile] = []
        self.cache_hits = 0
        self._previous = None
        self._installed = False

    def install(self) -> JitMonitor:
        """Start listening (idempotent); the summary line is printed at exit."""
        from triton import knobs

        if not self._installed:
            self._previous = knobs.compilation.listener
            knobs.compilation.listener = self._listen
            atexit.register(self._print_summary)
            self._installed = True
        return self

    def uninstall(self) -> None:
        from triton import knobs

        if self._installed:
            knobs.compilation.listener = self._previous
            atexit.unregister(self._print_summary)
            self._installed = False

    def _listen(self, *, src, metadata, metadata_group, times, cache_hit):
        if self._previous is not None:
            self._previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)
        if cache_hit:
            self.cache_hits += 1
            return
        event = JitCompile(_kernel_name(src, metadata), _specialization(src), _seconds(times))
        self.compiles.append(event)
        if self.mode == "warn":
            logger.warning("JIT compile while serving: %s [%s]", event.kernel, event.specialization)
        elif self.mode == "error":
            raise UnplannedCompileError(event.kernel, event.specialization, settings.STRICT.name)

    def summary(self) -> str:
        compiled = plural(len(self.compiles), "kernel")
        if not self.compiles:
            return f"kprecompile: {compiled} compiled while serving ({self.cache_hits} loaded from the cache)"
        names = sorted({event.kernel for event in self.compiles})
        seconds = sum(event.seconds for event in self.compiles)
        return f"kprecompile: {compiled} compiled while serving ({seconds:.1f} s): " + ", ".join(names)

    def _print_summary(self) -> None:
        print(self.summary(), file=sys.stderr)


def _kernel_name(src: Any, metadata: dict[str, Any]) -> str:
    fn = getattr(src, "fn", None)
    if fn is not None and hasattr(fn, "module"):
        return f"{fn.module}:{fn.fn.__qualname__}" if hasattr(fn, "fn") else f"{fn.module}:{metadata.get('name')}"
    return str(metadata.get("name", "?"))


def _specialization(src: Any) -> str:
    fn = getattr(src, "fn", None)
    constants = getattr(src, "constants", {}) or {}
    names = getattr(fn, "arg_names", [])
    parts = []
    for path, value in constants.items():
        index = path[0] if isinstance(path, tuple) and path else path
        name = names[index] if isinstance(index, int) and index < len(names) else str(path)
        parts.append(f"{name}={value}")
    return ", ".join(parts)


def _seconds(times: Any) -> float:
    """Triton's CompileTimes are in microseconds."""
    try:
        return float(times.total) / 1e6
    except (AttributeError, TypeError, ValueError):
        return 0.0
