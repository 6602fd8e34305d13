"""The compile worker pool: every missing job compiled once, in parallel, each in isolation.

Jobs already in the cache are found in this process first; a pool is started only for the
rest, because each spawned worker re-imports torch and Triton (DESIGN.md fact 8). Workers are
spawned, not forked (Triton and torch do not survive fork). `pebble` runs each job with its
own timeout and turns a worker that dies (a segfault in the compiler) or overruns into a
failed job while the pool replaces the worker and carries on.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError

from .cache.entries import is_compiled
from .cache.layout import CacheLayout
from .compile import JobOutcome, compile_job
from .trace import CompileJob

logger = logging.getLogger(__name__)

DEFAULT_JOB_TIMEOUT_SECONDS = 900.0


def default_worker_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def compile_jobs(
    jobs: Sequence[CompileJob],
    layout: CacheLayout,
    *,
    max_workers: int | None = None,
    job_timeout_seconds: float = DEFAULT_JOB_TIMEOUT_SECONDS,
    progress: bool = False,
) -> tuple[JobOutcome, ...]:
    """Compile every job not yet in the cache; return one outcome per job, in job order."""
    from tqdm import tqdm

    outcomes: dict[str, JobOutcome] = {}
    missing = []
    for job in jobs:
        if is_compiled(layout, job.key):
            outcomes[job.key] = JobOutcome(job, "cached", 0.0)
        else:
            missing.append(job)
    if missing:
        workers = max(1, min(max_workers or default_worker_count(), len(missing)))
        logger.info("compiling %d kernels with %d workers", len(missing), workers)
        with tqdm(
            total=len(jobs),
            initial=len(jobs) - len(missing),
            desc="kprecompile",
            unit="kernel",
            file=sys.stderr,
            disable=not progress,
            dynamic_ncols=True,
        ) as bar:
            for outcome in _run_pool(missing, layout, workers, job_timeout_seconds):
                outcomes[outcome.job.key] = outcome
                bar.update(1)
    return tuple(outcomes[job.key] for job in jobs)


def _run_pool(jobs: list[CompileJob], layout: CacheLayout, workers: int, timeout_seconds: float):
    from concurrent.futures import as_completed

    from pebble import ProcessExpired, ProcessPool

    pool = ProcessPool(max_workers=workers, context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.schedule(compile_job, args=(job, layout), timeout=timeout_seconds): job for job in jobs}
        for future in as_completed(futures):
            job = futures[future]
            try:
                yield future.result()
            except FutureTimeoutError:
                yield JobOutcome(job, "failed", timeout_seconds, f"timed out after {timeout_seconds:g} s")
            except ProcessExpired as error:
                yield JobOutcome(job, "failed", 0.0, f"worker died: {_describe_exit(error.exitcode)}")
            except Exception as error:  # the worker could not even run compile_job
                yield JobOutcome(job, "failed", 0.0, f"{type(error).__name__}: {error}")
    finally:
        pool.stop()
        pool.join()


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
