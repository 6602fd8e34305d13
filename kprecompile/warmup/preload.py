"""Load a configuration's planned kernels into this process.

Every kernel of the manifest goes through `JITFunction.preload`: the binary from the cache into
the kernel's in-memory cache, and on a GPU also the module load and the launcher Triton builds
with the host compiler, so the engine's first real call costs about what its hundredth does. A
serving process preloads before its first request; `warm` on a GPU host preloads once so that
the launchers are built and cached.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..cache.checked import checked_files
from ..cache.layout import CacheLayout
from ..cache.served import SERVED
from ..cache.usage import mark_used, using_if_possible
from ..errors import InputError, NotWarmError
from ..inputs.targets import Target
from ..selection.request import Request
from .manifest_key import find_manifest


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
    from triton import knobs

    from ..inputs.targets import detect_local_target
    from ..platforms.triton_driver import active_target
    from ..tracing.libraries import resolve_kernel

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
    counter = _ListenerCounter()
    failures = []
    context = contextlib.nullcontext() if on_gpu else active_target(target)
    with using_if_possible(layout), context, knobs.compilation.scope():
        knobs.compilation.listener = counter.chained(knobs.compilation.listener)
        for job in manifest.jobs:
            try:
                kernel = resolve_kernel(job.kernel)
                compiled = kernel.preload(job.specialization)
                if launchers:
                    compiled._init_handles()
            except Exception as error:  # one kernel never stops the others
                failures.append(f"{job.kernel} [{job.describe_specialization()}]: {type(error).__name__}: {error}")
    _initialize_specializer()
    if lookup.path.parent == layout.manifests_dir:  # never written: a layer's
        mark_used(lookup.path)
    return PreloadReport(
        target=target.name,
        manifest=str(lookup.path),
        kernels=len(manifest.jobs),
        loaded=counter.hits,
        compiled=counter.misses,
        launchers=launchers,
        seconds=time.perf_counter() - started,
        failures=tuple(failures),
    )


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


# Device nodes a GPU driver creates; without one there is no GPU to ask torch about.
_DEVICE_NODES = {"cuda": "/dev/nvidiactl", "hip": "/dev/kfd"}


def is_local_gpu(target: Target) -> bool:
    """Whether this process sees a GPU of `target`'s kind (launchers can be built for it).

    Answers from the environment and the driver's device node first, so that a CPU builder
    (or a warm that finds everything cached) never pays for importing torch to learn "no".
    """
    for variable in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if os.environ.get(variable) == "":
            return False
    if not os.path.exists(_DEVICE_NODES[target.backend]):
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
    """Counts Triton compile events (hits from the disk cache, real compiles), chaining a listener."""

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0

    def chained(self, previous):
        def listen(*, src, metadata, metadata_group, times, cache_hit):
            if cache_hit:
                self.hits += 1
            else:
                self.misses += 1
            if previous is not None:
                previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

        return listen
