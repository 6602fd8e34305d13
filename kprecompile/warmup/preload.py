"""Load a configuration's planned kernels into this process.

Every kernel of the manifest goes through `JITFunction.preload`: the binary from the cache into
the kernel's in-memory cache, and on a GPU also the module load and the launcher Triton builds
with the host compiler, so the engine's first real call costs about what its hundredth does.
`warm` on a GPU host preloads once so that the launchers are built and cached.

A serving process loads them beside its own start (`start_preload`): in a thread of its own,
from when the model is built, beside the weights, joined before the engine launches its first
Triton kernel. Not later: Triton publishes a compiled kernel in the JITFunction's cache before
loading its module and launcher (`CompiledKernel._init_handles` sets the launcher first and
releases the GIL while loading), so an engine thread launching that kernel in between would
launch it without a function. The FP8 BMM's kernels load first (vLLM's MLA layers run them over
every batch size right after the weights); a kernel already in Triton's memory is not loaded again.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..cache.checked import checked_files
from ..cache.jobs import CompileJob
from ..cache.layout import CacheLayout
from ..cache.served import SERVED
from ..cache.usage import mark_used, using_if_possible
from ..errors import InputError, NotWarmError
from ..inputs.targets import Target
from ..selection.request import Request
from .manifest_key import find_manifest

# Families the engine runs while it loads the model, before any request: loaded first. vLLM's MLA
# layers run the FP8 BMM over every batch size in `process_weights_after_loading`, or quantize
# their weights to MXFP4 there for the FP4 BMM.
_RUN_WHILE_LOADING = ("fp8_bmm", "fp4_bmm")


@dataclass(frozen=True)
class PreloadReport:
    target: str
    manifest: str | None
    kernels: int
    # Kernels loaded from the cache, and any that had to compile (0 when the cache is warm).
    loaded: int
    compiled: int
    launchers: bool
    seconds: float
    failures: tuple[str, ...] = field(default=())
    # Kernels already in this process's memory (an earlier preload's, or the engine's own first call).
    in_memory: int = 0
    # Seconds the caller waited for a preload started in the background (None: it loaded in the caller).
    waited: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def preload(
    request: Request, layout: CacheLayout, *, target: Target | None = None, launchers: bool | None = None
) -> PreloadReport:
    """Load every kernel of this configuration's manifest into this process.

    `target` defaults to the local GPU; a target that is not this process's GPU is loaded
    under the cross-compile driver (binaries only, no launchers: tests and CPU builders).
    `launchers` defaults to whether the kernels are for this process's GPU.
    """
    return _Loading.of(request, layout, target, launchers).load()


def start_preload(
    request: Request, layout: CacheLayout, *, target: Target | None = None, launchers: bool | None = None
) -> BackgroundPreload:
    """`preload` in a thread of its own; returns at once (a cache that is not warm raises here).

    For a serving process's start: the caller goes on (its weights) and joins before it launches
    any Triton kernel (module doc). For a `target` that is not this process's GPU, the
    cross-compile driver it loads under is process-wide: nothing else may use Triton until the join.
    """
    return BackgroundPreload(_Loading.of(request, layout, target, launchers))


class BackgroundPreload:
    def __init__(self, loading: _Loading) -> None:
        self._loading = loading
        self._report: PreloadReport | None = None
        self._error: BaseException | None = None
        self._device = loading.caller_device()
        self._thread = threading.Thread(target=self._run, name="kprecompile-preload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self._device is not None:
                import torch

                # Triton loads modules on the current device, which a new thread has at its default.
                if torch.cuda.current_device() != self._device:
                    torch.cuda.set_device(self._device)
            self._report = self._loading.load()
        except BaseException as error:  # handed to whoever joins
            self._error = error

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> PreloadReport:
        """Wait for the kernels; the report says how long this call waited (`waited`)."""
        started = time.perf_counter()
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._report is not None
        return PreloadReport(**{**self._report.as_dict(), "waited": time.perf_counter() - started})


@dataclass(frozen=True)
class _Loading:
    """A configuration's kernels, found and in load order; `load` loads them."""

    layout: CacheLayout
    target: Target
    launchers: bool
    on_gpu: bool
    manifest_path: Path
    jobs: list[CompileJob]
    started: float

    @classmethod
    def of(cls, request: Request, layout: CacheLayout, target: Target | None, launchers: bool | None) -> _Loading:
        from ..inputs.targets import detect_local_target

        started = time.perf_counter()
        local = _local_target()
        target = target or detect_local_target()
        on_gpu = local is not None and local == target
        launchers = on_gpu if launchers is None else launchers
        if launchers and not on_gpu:
            raise InputError("launchers", True, f"a local {target.name} GPU to load kernels on")
        lookup = find_manifest(request, target, layout, remember=False)
        manifest = lookup.manifest
        if manifest is None:
            raise NotWarmError(request.model.name, target.name, str(layout.root))
        SERVED.record(manifest)
        # Files unchanged since a warm hashed them all are served at a stat each (`cache/checked.py`).
        checked = checked_files(layout, lookup.key, lookup.path, (job.key for job in manifest.jobs))
        if checked is not None:
            SERVED.checked(checked)
        return cls(layout, target, launchers, on_gpu, lookup.path, load_order(manifest.jobs), started)

    def caller_device(self) -> int | None:
        """The caller's current GPU, where a thread must load the modules too."""
        if not self.launchers:
            return None
        import torch

        return torch.cuda.current_device()

    def load(self) -> PreloadReport:
        from ..inputs.toolchain import hand_triton_its_key
        from ..platforms.triton_driver import active_target
        from ..tracing.libraries import resolve_kernel

        counter = _ListenerCounter(threading.get_ident())
        failures, in_memory = [], 0
        hand_triton_its_key(self.layout)
        context = contextlib.nullcontext() if self.on_gpu else active_target(self.target)
        with using_if_possible(self.layout), context, _listening(counter):
            for job in self.jobs:
                try:
                    kernel = resolve_kernel(job.kernel)
                    compiled = _in_memory(kernel, job)
                    if compiled is None:
                        compiled = kernel.preload(job.specialization)
                    else:
                        in_memory += 1
                    if self.launchers:
                        compiled._init_handles()
                except Exception as error:  # one kernel never stops the others
                    failures.append(f"{job.kernel} [{job.describe_specialization()}]: {type(error).__name__}: {error}")
        _initialize_specializer()
        if self.manifest_path.parent == self.layout.manifests_dir:  # never written: a layer's
            mark_used(self.manifest_path)
        return PreloadReport(
            target=self.target.name,
            manifest=str(self.manifest_path),
            kernels=len(self.jobs),
            loaded=counter.hits,
            compiled=counter.misses,
            launchers=self.launchers,
            seconds=time.perf_counter() - self.started,
            failures=tuple(failures),
            in_memory=in_memory,
        )


def load_order(jobs: tuple[CompileJob, ...] | list[CompileJob]) -> list[CompileJob]:
    """The manifest's jobs, each once, those the engine runs while loading first."""
    unique = list({(job.kernel, job.specialization): job for job in jobs}.values())
    return sorted(unique, key=lambda job: job.family not in _RUN_WHILE_LOADING)


def _in_memory(kernel: Any, job: CompileJob) -> Any:
    """The compiled kernel Triton already holds for the job on the current device (the
    JITFunction's kernel cache, under the key its specialization data names), or None."""
    from triton.runtime.driver import driver

    try:
        key = json.loads(job.specialization)["key"]
        return kernel.device_caches[driver.active.get_current_device()][0].get(key)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return None


class _listening:
    """Chain `counter` into Triton's compilation listener for a load, then take it out again,
    unless something chained after it meanwhile (a monitor the engine installed)."""

    def __init__(self, counter: _ListenerCounter) -> None:
        self._counter = counter

    def __enter__(self) -> None:
        from triton import knobs

        self._previous = knobs.compilation.listener
        self._listener = self._counter.chained(self._previous)
        knobs.compilation.listener = self._listener

    def __exit__(self, *exc: object) -> None:
        from triton import knobs

        if knobs.compilation.listener is self._listener:
            knobs.compilation.listener = self._previous


def _initialize_specializer() -> None:
    """Pay the one-time set-up of Triton's argument specializer now rather than in the first call.

    Its native implementation (Triton 3.6 on) imports Triton's tensor-descriptor types on first
    use: 0.11 s of the first real call on the H200 host, after every kernel was already in memory.
    Triton 3.5's specializer is Python and has no such set-up.
    """
    from triton.backends.compiler import BaseBackend

    try:
        from triton.runtime.jit import native_specialize_impl
    except ImportError:
        return
    native_specialize_impl(BaseBackend, 0, False, True, True)


def is_local_gpu(target: Target) -> bool:
    """Whether this process sees a GPU of `target`'s kind (launchers can be built for it).

    Answers from the environment and the driver's device node first, so that a CPU builder
    (or a warm that finds everything cached) never pays for importing torch to learn "no".
    """
    from ..inputs.targets import gpu_may_be_visible

    if not gpu_may_be_visible(target.backend):
        return False
    import torch

    return torch.cuda.is_available() and _local_target() == target


def _local_target() -> Target | None:
    from ..inputs.targets import detect_local_target

    try:
        return detect_local_target()
    except InputError:
        return None


class _ListenerCounter:
    """Counts one thread's Triton compile events (hits from the disk cache, real compiles),
    chaining a listener: the engine's own compiles beside a background preload are not its."""

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.hits = 0
        self.misses = 0

    def chained(self, previous):
        def listen(*, src, metadata, metadata_group, times, cache_hit):
            if threading.get_ident() != self.thread:
                pass
            elif cache_hit:
                self.hits += 1
            else:
                self.misses += 1
            if previous is not None:
                previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

        return listen
