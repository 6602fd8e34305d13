"""The serving side: point a process at the cache and load the planned kernels.

- `activate` makes Triton (and AITER's JIT builds) use kprecompile's cache. It must run before
  the first kernel compiles (for AITER's JIT directory, before `import aiter`); calling it again,
  or from every rank, changes nothing.
- `preload` loads every kernel of the configuration's manifest into this process through
  `JITFunction.preload`: the binary from the cache into the kernel's in-memory cache, and on a
  GPU also the module load and the launcher Triton builds with the host compiler (DESIGN.md
  fact 7), so the engine's first real call costs about what its hundredth does.

The JIT monitor that watches what still compiles afterwards is in `monitor.py`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import settings
from .cache.layout import CacheLayout
from .cache.served import SERVED
from .cache.usage import mark_used, using_if_possible
from .configuration import find_manifest
from .engines import Selection, select
from .errors import InputError, NotWarmError
from .models import ModelConfig
from .monitor import JournalSink
from .serving import ServingParams
from .targets import Target

logger = logging.getLogger(__name__)


def activate(
    cache_dir: str | os.PathLike[str] | None = None, layers: tuple[str | os.PathLike[str], ...] | None = None
) -> CacheLayout:
    """Point this process (and the processes it starts) at the cache; returns its layout.

    `layers` (default $KPRECOMPILE_CACHE_LAYERS) are read-only baked caches searched after the
    writable one, through kprecompile's layered Triton cache manager; nothing is written there.
    """
    from triton import knobs

    from .layered_cache import LayeredCacheManager

    layout = settings.cache_layout(cache_dir, layers)
    triton_dir = str(layout.triton_dir)
    os.environ["TRITON_CACHE_DIR"] = triton_dir
    knobs.cache.dir = triton_dir
    # kprecompile's manager, layers or not: entries found by name beside their group file, and
    # served only as a manifest recorded them (`layered_cache.py`).
    os.environ[settings.CACHE_LAYERS.name] = os.pathsep.join(str(layer) for layer in layout.layers)
    os.environ["TRITON_CACHE_MANAGER"] = f"{LayeredCacheManager.__module__}:{LayeredCacheManager.__name__}"
    knobs.cache.manager_class = LayeredCacheManager
    aiter_dir = str(layout.aiter_jit_dir)
    if os.environ.get("AITER_JIT_DIR", aiter_dir) != aiter_dir:
        logger.info("AITER_JIT_DIR is set to %s: AITER's JIT builds stay there", os.environ["AITER_JIT_DIR"])
    else:
        os.environ["AITER_JIT_DIR"] = aiter_dir
    return layout


def journal_sink(
    model: ModelConfig, serving: ServingParams, layout: CacheLayout, target: Target, selection: Selection
) -> JournalSink:
    """Where this process records what it compiles while serving this configuration (pass it to
    `JitMonitor.record_to`): the configuration's journal, which the next warm compiles."""
    lookup = find_manifest(model, serving, selection, target, layout, remember=False)
    return JournalSink(layout, lookup.journal_key, target.name, lookup.toolchain_digest, lookup.key, model.name)


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
    model: ModelConfig,
    serving: ServingParams,
    layout: CacheLayout,
    *,
    target: Target | None = None,
    selection: Selection | None = None,
    launchers: bool | None = None,
) -> PreloadReport:
    """Load every kernel of this configuration's manifest into this process.

    `target` defaults to the local GPU; a target that is not this process's GPU is loaded
    under the cross-compile driver (binaries only, no launchers: tests and CPU builders).
    `launchers` defaults to whether the kernels are for this process's GPU.
    """
    from triton import knobs

    from .driver import active_target
    from .libraries import resolve_kernel
    from .targets import detect_local_target

    started = time.perf_counter()
    local = _local_target()
    target = target or detect_local_target()
    on_gpu = local is not None and local == target
    launchers = on_gpu if launchers is None else launchers
    if launchers and not on_gpu:
        raise InputError("launchers", True, f"a local {target.name} GPU to load kernels on")
    selection = selection or select(model)
    lookup = find_manifest(model, serving, selection, target, layout, remember=False)
    manifest = lookup.manifest
    if manifest is None:
        raise NotWarmError(model.name, target.name, str(layout.root))
    SERVED.record(manifest)
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

    Its native implementation imports Triton's tensor-descriptor types on first use: 0.11 s of
    the first real call on the H200 host, after every kernel was already in memory.
    """
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

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
    from .targets import detect_local_target

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
