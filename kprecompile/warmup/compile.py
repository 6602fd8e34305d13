"""Compile one job into the cache: check, lock, check again, compile.

A job already compiled by anyone (an earlier warm, another rank, another host sharing the
cache) is found by the first check without taking a lock, or by the second after waiting.
Compiling replays Triton's specialization data through `JITFunction.preload` under the
cross-compile driver, the same path a serving process uses to load it.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Literal

from ..cache.entries import is_compiled, remove_unfinished_entry
from ..cache.jobs import CompileJob
from ..cache.layout import CacheLayout
from ..cache.locks import hold_lock
from ..inputs import settings
from ..inputs.targets import TARGETS
from ..platforms.triton_driver import active_target, device_model
from ..tracing.libraries import resolve_kernel
from ..tracing.trace import ModuleSets

Status = Literal["compiled", "cached", "failed"]


@dataclass(frozen=True)
class JobOutcome:
    job: CompileJob
    status: Status
    seconds: float
    error: str | None = None


def job_lock(layout: CacheLayout, job: CompileJob, timeout_seconds: float | None = None):
    """The job's lock: one per Triton key, waiting up to $KPRECOMPILE_LOCK_TIMEOUT by default."""
    timeout = settings.LOCK_TIMEOUT.read() if timeout_seconds is None else timeout_seconds
    return hold_lock(
        layout.lock_path(job.key), f"{job.kernel_name} on {job.target}", timeout, settings.LOCK_TIMEOUT.name
    )


def compile_job(job: CompileJob, layout: CacheLayout, lock_timeout_seconds: float | None = None) -> JobOutcome:
    """Make sure `job` is in the cache. Never raises for a failed compile: it is reported."""
    started = time.perf_counter()

    def outcome(status: Status, error: str | None = None) -> JobOutcome:
        return JobOutcome(job, status, time.perf_counter() - started, error)

    try:
        if is_compiled(layout, job.key):
            return outcome("cached")
        with job_lock(layout, job, lock_timeout_seconds):
            if is_compiled(layout, job.key):
                return outcome("cached")
            remove_unfinished_entry(layout, job.key)
            compiled_key = _preload(job, layout)
        if compiled_key != job.key:
            return outcome(
                "failed",
                f"compiled under Triton key {compiled_key} but planned as {job.key}: this process's "
                "environment or toolchain differs from the one that traced the plan",
            )
        return outcome("compiled")
    except Exception as error:  # a compiler error fails this job only
        return outcome("failed", f"{type(error).__name__}: {_summarize(error)}")


def _summarize(error: BaseException) -> str:
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    # Triton's CompilationError puts the source excerpt first and the reason last.
    return lines[-1] if lines else repr(error)


@functools.cache
def library_modules() -> tuple[str, ...]:
    """Library modules of every family, imported once per target in this process."""
    from ..shapes import FAMILIES

    return tuple(dict.fromkeys(prefix for family in FAMILIES.values() for prefix in family.traced_modules))


@functools.cache
def _module_sets() -> ModuleSets:
    return ModuleSets(library_modules())


def _kernel(job: CompileJob) -> Any:
    """The job's JITFunction, from library modules imported for the job's target, as traced."""
    target = TARGETS[job.target]
    with active_target(target), device_model(target), _module_sets().entered(target.name):
        return resolve_kernel(job.kernel)


def _preload(job: CompileJob, layout: CacheLayout) -> str:
    from triton import knobs

    kernel = _kernel(job)
    with active_target(TARGETS[job.target]), knobs.cache.scope(), knobs.runtime.scope():
        knobs.cache.dir = str(layout.triton_dir)
        knobs.runtime.jit_cache_hook = None
        compiled = kernel.preload(job.specialization)
    return compiled.hash
