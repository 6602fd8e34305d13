"""The JIT monitor: kernels that still compile in a serving process after it was prepared.

Counts compiles through Triton's compilation listener (`cache_hit` false), naming each kernel
and specialization, and follows `KPRECOMPILE_STRICT`: `off` counts only, `warn` (default) logs
each, `error` raises in the launching call. At exit it prints one summary line.

Given the configuration it serves (`record_to`), it also records each compile in that
configuration's journal (`cache/journal.py`) with what compiling it again needs: Triton's
specialization data, which its `jit_post_compile_hook` hands over right after a JITFunction
launch compiled (the listener alone does not have it). Both hooks run only when something
compiles, never on a launch that finds its kernel, so recording costs the request path nothing.
Kernels compiled outside a JITFunction launch (Inductor's, through `triton.compile`) are
recorded by name only: they cannot be compiled again by name.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..cache import journal
from ..errors import InputError, UnplannedCompileError
from ..inputs import settings
from ..wording import plural

if TYPE_CHECKING:
    from ..cache.layout import CacheLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JitCompile:
    kernel: str
    specialization: str
    seconds: float


@dataclass(frozen=True)
class Sighting:
    """A kernel this process compiled, before it is known which configuration it serves."""

    triton_key: str
    kernel: str
    seconds: float
    seen: float
    source_hash: str | None = None
    specialization: str | None = None


@dataclass(frozen=True)
class JournalSink:
    """Where a serving process records its compiles: its configuration's journal."""

    layout: CacheLayout
    key: str
    target: str
    toolchain: str
    # The manifest key of the configuration served (its manifest may not exist yet).
    manifest: str | None
    model: str

    def record(self, sighting: Sighting) -> journal.Record:
        return journal.Record(
            triton_key=sighting.triton_key,
            kernel=sighting.kernel,
            target=self.target,
            toolchain=self.toolchain,
            source_hash=sighting.source_hash,
            specialization=sighting.specialization,
            manifest=self.manifest,
            model=self.model,
            first_seen=sighting.seen,
            last_seen=sighting.seen,
            seconds=sighting.seconds,
            hosts={_HOST: 1},
            origin="local",
        )


_HOST = socket.gethostname()[:255]


class JitMonitor:
    """Watches for kernels compiled in this process after it was prepared."""

    def __init__(self, mode: settings.StrictMode | None = None):
        self.mode = settings.STRICT.read() if mode is None else mode
        if self.mode not in settings.STRICT_MODES:
            raise InputError(settings.STRICT.name, self.mode, settings.STRICT.expected)
        self.compiles: list[JitCompile] = []
        self.cache_hits = 0
        self.sink: JournalSink | None = None
        # Compiles inside a JITFunction launch, waiting for their specialization data (by Triton
        # key); sightings waiting for `record_to`; kernels recorded with their specialization.
        self._pending: dict[str, tuple[JitCompile, Sighting]] = {}
        self._unsent: list[Sighting] = []
        self._recorded: set[str] = set()
        # Recorded by name only, in case Triton's post-compile hook brings their data later.
        self._unspecialized: dict[str, Sighting] = {}
        self._previous = self._previous_post_compile = None
        self._installed = False

    def install(self) -> JitMonitor:
        """Start listening (idempotent); the summary line is printed at exit."""
        from triton import knobs

        if not self._installed:
            self._previous = knobs.compilation.listener
            self._previous_post_compile = knobs.runtime.jit_post_compile_hook
            knobs.compilation.listener = self._listen
            knobs.runtime.jit_post_compile_hook = self._post_compile
            atexit.register(self._at_exit)
            self._installed = True
        return self

    def uninstall(self) -> None:
        from triton import knobs

        if self._installed:
            knobs.compilation.listener = self._previous
            knobs.runtime.jit_post_compile_hook = self._previous_post_compile
            atexit.unregister(self._at_exit)
            self._installed = False

    def record_to(self, sink: JournalSink) -> None:
        """Record every compile in `sink`'s journal, those seen so far included."""
        self.sink = sink
        unsent, self._unsent = self._unsent, []
        self._write([sink.record(sighting) for sighting in unsent])

    def _listen(self, *, src, metadata, metadata_group, times, cache_hit):
        if self._previous is not None:
            self._previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)
        if cache_hit:
            self.cache_hits += 1
            return
        event = JitCompile(_kernel_name(src, metadata), _specialization(src), _seconds(times))
        self.compiles.append(event)
        sighting = Sighting(str(metadata.get("hash", "")), event.kernel, event.seconds, time.time())
        if _inside_jit_launch():
            # The post-compile hook follows in this thread, with the specialization data.
            self._pending[sighting.triton_key] = (event, sighting)
            return
        # Not inside a launch (Inductor's compiles, Triton's async compile mode): recorded by name
        # now; should the post-compile hook follow, it adds the specialization data.
        self._record(sighting)
        self._report(event)

    def _post_compile(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002
        if self._previous_post_compile is not None:
            self._previous_post_compile(
                key=key,
                repr=repr,
                fn=fn,
                compile=compile,
                is_manual_warmup=is_manual_warmup,
                already_compiled=already_compiled,
            )
        try:
            jit_function = fn.jit_function
            kernel = jit_function.device_caches[compile["device"]][0].get(key)
            triton_key = getattr(kernel, "hash", None)
            waiting = self._pending.pop(triton_key, None)
            sighting = waiting[1] if waiting else self._unspecialized.pop(triton_key, None)
            if sighting is not None:
                self._record(
                    dataclasses.replace(
                        sighting, source_hash=jit_function.cache_key, specialization=compile["specialization_data"]
                    )
                )
        except Exception as error:  # another Triton's internals: reported, unrecorded
            logger.warning("kprecompile: a compile was not recorded (%s: %s)", type(error).__name__, error)
            waiting = None
            for event, _ in self._pending.values():
                self._report(event)
            self._pending.clear()
        if waiting is not None:
            self._report(waiting[0])

    def _report(self, event: JitCompile) -> None:
        if self.mode == "warn":
            logger.warning("JIT compile while serving: %s [%s]", event.kernel, event.specialization)
        elif self.mode == "error":
            raise UnplannedCompileError(event.kernel, event.specialization, settings.STRICT.name)

    def _record(self, sighting: Sighting) -> None:
        if sighting.triton_key in self._recorded or not journal.HEX64.fullmatch(sighting.triton_key):
            return
        if sighting.specialization is not None:
            self._recorded.add(sighting.triton_key)
        elif len(self._unspecialized) < journal.MAX_RECORDS:
            self._unspecialized[sighting.triton_key] = sighting
        if self.sink is None:
            if len(self._unsent) < journal.MAX_RECORDS:
                self._unsent.append(sighting)
            return
        self._write([self.sink.record(sighting)])

    def _write(self, records: list[journal.Record]) -> None:
        if not records or self.sink is None:
            return
        try:
            journal.append(self.sink.layout, self.sink.key, records)
        except Exception as error:  # recording never stops a server
            logger.warning(
                "kprecompile: %s not recorded in the journal (%s: %s)",
                plural(len(records), "compile"),
                type(error).__name__,
                error,
            )

    def _at_exit(self) -> None:
        # A compile whose launch never reached the post-compile hook is still worth a name.
        pending, self._pending = self._pending, {}
        for _, sighting in pending.values():
            self._record(sighting)
        self._print_summary()

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


def _inside_jit_launch() -> bool:
    """Whether this compile runs inside `JITFunction._do_compile` (a launch, a warmup, a preload),
    which calls the post-compile hook next."""
    try:
        from triton.runtime.jit import JITFunction

        code = JITFunction._do_compile.__code__
    except (ImportError, AttributeError):
        return False
    frame = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            return False
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _seconds(times: Any) -> float:
    """Triton's CompileTimes are in microseconds."""
    try:
        return float(times.total) / 1e6
    except (AttributeError, TypeError, ValueError):
        return 0.0
