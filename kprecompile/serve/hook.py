"""The model-loader hook: one call an engine makes at weight-load time on every rank.

`prepare` points the process at the cache, checks in-process whether the configuration is
warm, warms what is missing (ranks on one host share the work through the cache's file locks,
each starting at its own share of the kernels, each with its share of the CPUs, only rank 0
showing progress), loads every planned kernel into the process (with launchers on the GPU),
and starts the JIT monitor, which records what still compiles in the configuration's journal
for the next warm.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import NotWarmError
from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target, detect_local_target
from ..progress import ProgressBar, ProgressLines
from ..selection.engines import Selection, select
from ..selection.request import Request
from ..warmup.pool import default_worker_count
from ..warmup.preload import PreloadReport, preload
from ..warmup.verification import verify
from ..warmup.warming import WarmReport, warm
from .monitor import JitMonitor
from .runtime import activate, journal_sink

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepareReport:
    rank: int
    target: str
    # Whether the cache already held this configuration when the hook ran.
    was_warm: bool
    warm: WarmReport | None
    preload: PreloadReport | None
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_MONITOR: JitMonitor | None = None


def prepare(
    model: ModelConfig,
    serving: ServingParams,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    target: Target | None = None,
    selection: Selection | None = None,
    rank: int | None = None,
    local_world_size: int | None = None,
    launchers: bool | None = None,
    monitor: bool = True,
) -> PrepareReport:
    """Warm what is missing, preload, and watch. Safe to call from every rank at once."""
    global _MONITOR
    started = time.perf_counter()
    layout = activate(cache_dir)
    target = target or detect_local_target()
    request = Request(model, serving, selection or select(model, dtype=serving.activation_dtype(model)), (target,))
    rank = _environment_int(("LOCAL_RANK", "RANK"), 0) if rank is None else rank
    ranks = _environment_int(("LOCAL_WORLD_SIZE",), 1) if local_world_size is None else local_world_size
    was_warm = verify(request, layout).warm
    warm_report = None
    if not was_warm:
        workers = max(1, default_worker_count() // ranks)
        warm_report = warm(
            request,
            layout,
            max_workers=workers,
            progress=(ProgressBar() if sys.stderr.isatty() else ProgressLines()) if rank == 0 else None,
            rank=rank,
            ranks=ranks,
            # A fork server would outlive the warm by the whole life of this serving process.
            worker_start="spawn",
        )
        if warm_report.failed:
            logger.warning(
                "kprecompile: %d kernels failed to compile; they will compile on first use", warm_report.failed
            )
        for failure in warm_report.family_failures:
            logger.warning(
                "kprecompile: %s on %s failed; its kernels will compile on first use: %s",
                failure.family,
                failure.target,
                failure.error,
            )
    try:
        preload_report = preload(request, layout, target=target, launchers=launchers)
    except NotWarmError as error:
        logger.warning("kprecompile: %s", error)
        preload_report = None
    if monitor:
        _MONITOR = _MONITOR or JitMonitor()
        _MONITOR.install()
        _MONITOR.record_to(journal_sink(request, layout, target))
    return PrepareReport(rank, target.name, was_warm, warm_report, preload_report, time.perf_counter() - started)


def jit_monitor() -> JitMonitor | None:
    """The monitor `prepare` installed in this process, if any."""
    return _MONITOR


def _environment_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return default
