"""The compile worker pool: every missing job compiled once, in parallel, each in isolation.

Jobs already in the cache are found in this process first; workers are started only for the
rest, because starting them costs imports (torch and Triton: paid once by a fork server, or by
each spawned worker where asked, `worker_start.py`); on a cold cache they are started early,
from a thread of their own, and take each traced step's jobs at once, so that
starting and compiling overlap with the parent's tracing. Workers are never forked from this process
(Triton and torch do not survive fork once used).
`pebble` runs each job with its own timeout and turns a worker that dies (a segfault in the
compiler) or overruns into a failed job while the pool replaces the worker and carries on.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from multiprocessing.context import BaseContext

from ..cache.entries import is_compiled
from ..cache.jobs import CompileJob
from ..cache.layout import CacheLayout
from ..inputs.settings import WorkerStart
from ..inputs.toolchain import give_triton_its_key, triton_dir, triton_key_text
from ..progress import NoProgress, Progress
from ..tracing.libraries import VLLM_PACKAGE, import_library_module
from .compile import JobOutcome, compile_job
from .worker_start import worker_context

logger = logging.getLogger(__name__)

DEFAULT_JOB_TIMEOUT_SECONDS = 900.0
# A worker that cannot start (its main module cannot be re-imported, say) would otherwise
# leave the pool waiting forever.
WORKER_START_TIMEOUT_SECONDS = 120.0


def default_worker_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _prepare_worker(
    modules: tuple[str, ...], environment: dict[str, str], triton_key: tuple[str, str] | None = None
) -> None:
    """Pool initializer: take the parent's environment as it is now (a fork server keeps the one
    it started with) and, where its Triton is the parent's, the parent's Triton key (`triton_key`:
    Triton's directory and key; a spawned worker would hash libtriton, 0.35 s of CPU each beside
    the trace; a fork server's workers inherit its own), and pay imports before the first job.

    Workers start while the parent is still tracing, so this overlaps with the trace. It
    never raises: a worker whose initializer failed would be restarted forever; a job that
    needs what failed here fails on its own, with the real error.
    """
    os.environ.clear()
    os.environ.update(environment)
    try:
        if triton_key is not None and triton_key[0] == str(triton_dir()):
            give_triton_its_key(triton_key[1])
        else:  # another Triton than the parent's (its path changed): its own key, or compiles land
            from triton.runtime.cache import triton_key as compute  # under the parent's

            compute()
        for name in modules:
            # vLLM's modules read their platform at import: the jobs import them per target.
            if not name.startswith(VLLM_PACKAGE + "."):
                import_library_module(name)
    except Exception as error:  # reported by the jobs that need it
        logger.debug("worker preparation failed: %s", error)


def _triton_key_for_workers(layout: CacheLayout) -> tuple[str, str] | None:
    """This process's Triton's directory and key (from the cache's memo where it holds it), for
    the workers; None (each computes its own) where it cannot be had."""
    try:
        return str(triton_dir()), triton_key_text(layout)
    except Exception as error:  # the workers compute it, and say what fails
        logger.debug("no Triton key for the workers: %s", error)
        return None


def _worker_ready() -> int:
    return os.getpid()


# Workers re-import the caller's script (multiprocessing prepares forked and spawned ones alike):
# a script that calls `kprecompile.warm` outside `if __name__ == "__main__":` calls it again in
# every worker.
_GUARD = '`if __name__ == "__main__":`'


def _reimported_script() -> str | None:
    """The script a worker re-imports before running anything: the main module when it
    was run by path (`python script.py`, not `python -m`), else None."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main.__spec__, "name", None) is not None:
        return None
    path = getattr(main, "__file__", None)
    return path if path is not None and os.path.isfile(path) else None  # not `python -` (stdin)


def refuse_in_worker_start() -> None:
    """Stop a compile worker that is re-importing the caller's script and reached a warm: at
    once and in one line, instead of planning the whole warm again and failing to start workers
    of its own (multiprocessing's 'bootstrapping phase' error)."""
    # What multiprocessing itself checks before starting a process (`spawn._check_not_importing_main`).
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # The worker took the caller's argv before re-importing its script.
        script = sys.argv[0] if sys.argv and sys.argv[0] else "the caller's script"
        # Said here: a worker forked by the fork server exits without printing a SystemExit's text.
        print(
            f"kprecompile: this compile worker re-imported {script}, which calls kprecompile.warm again: "
            f"call it under {_GUARD}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1)


class CompilePool:
    """Compile workers, started on demand: by `start()` before other work, so that their start-up
    overlaps it, or by `compile()` with as many workers as jobs are missing. Jobs can be handed
    over as they are known (`submit`), and `compile()` then waits for them with the rest."""

    def __init__(
        self,
        layout: CacheLayout,
        *,
        max_workers: int | None = None,
        job_timeout_seconds: float = DEFAULT_JOB_TIMEOUT_SECONDS,
        preload_modules: tuple[str, ...] = (),
        start_method: WorkerStart | None = None,
    ):
        self.layout = layout
        self.start_method = start_method
        self.max_workers = max(1, max_workers or default_worker_count())
        self.workers = 0
        self.job_timeout_seconds = job_timeout_seconds
        self.preload_modules = preload_modules
        self._pool = None
        self._ready = None
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._lock = threading.Lock()
        # Every job handed over, by key: the cache it compiles into, and its future once scheduled
        # (None while the workers start).
        self._submitted: dict[str, tuple[CompileJob, CacheLayout, Future | None]] = {}

    def start(self, workers: int | None = None) -> CompilePool:
        """Start the workers (at most `max_workers`) beside the caller: they are created from a
        thread of their own (with a fork server, after its imports), so that the caller goes on
        tracing meanwhile; each takes this process's environment as it is now."""
        refuse_in_worker_start()
        if self._starting is None:
            self.workers = max(1, min(self.max_workers, workers or self.max_workers))
            arguments = (self.workers, worker_context(self.start_method), (self.preload_modules, dict(os.environ)))
            self._starting = threading.Thread(
                target=self._create, args=arguments, name="kprecompile-workers", daemon=True
            )
            self._starting.start()
        return self

    def _create(self, workers: int, context: BaseContext, initargs: tuple) -> None:
        from pebble import ProcessPool

        try:
            initargs = (*initargs, _triton_key_for_workers(self.layout))
            pool = ProcessPool(max_workers=workers, context=context, initializer=_prepare_worker, initargs=initargs)
            # Scheduling creates the workers, here; its result says a worker could start at all.
            ready = pool.schedule(_worker_ready)
        except BaseException as error:  # said for every job by `_collect`
            self._start_error = error
            return
        with self._lock:
            self._pool, self._ready = pool, ready
            waiting = [(job, layout) for job, layout, future in self._submitted.values() if future is None]
        for job, layout in waiting:
            self._schedule(job, layout)

    @property
    def started(self) -> bool:
        return self._starting is not None

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._starting is not None:
            self._starting.join()
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
        self._pool = self._ready = self._starting = self._start_error = None
        self._submitted = {}

    def submit(self, jobs: Sequence[CompileJob], damaged: frozenset[str] = frozenset()) -> None:
        """Hand jobs to the workers now (each key once), without looking in the cache here first:
        the worker does (`compile_job`). Starts the workers if they are not. `damaged` keys are
        compiled into the writable root (see `compile`)."""
        self.start()
        writable = CacheLayout(self.layout.root)
        with self._lock:
            new = [
                (job, writable if job.key in damaged else self.layout) for job in jobs if job.key not in self._submitted
            ]
            for job, layout in new:
                self._submitted[job.key] = (job, layout, None)
            scheduling = self._pool is not None
        if scheduling:
            for job, layout in new:
                self._schedule(job, layout)

    def cancel(self, keys: Sequence[str]) -> None:
        """Take back jobs handed over that are no longer wanted (a family whose trace failed after
        its first steps were handed over): those not started never run, a running one's worker is
        stopped and replaced (pebble), and a later `submit` may hand the key over again."""
        with self._lock:
            taken = [self._submitted.pop(key) for key in keys if key in self._submitted]
        for _, _, future in taken:
            if future is not None:
                future.cancel()

    def _schedule(self, job: CompileJob, layout: CacheLayout) -> None:
        try:
            future = self._pool.schedule(compile_job, args=(job, layout), timeout=self.job_timeout_seconds)
        except Exception as error:  # the pool broke (its workers could not start): the job's outcome
            future = Future()
            future.set_exception(error)
        with self._lock:
            self._submitted[job.key] = (job, layout, future)

    def compile(
        self,
        jobs: Sequence[CompileJob],
        progress: Progress | None = None,
        label: str = "compiling",
        damaged: frozenset[str] = frozenset(),
        on_outcome: Callable[[JobOutcome], None] | None = None,
    ) -> tuple[JobOutcome, ...]:
        """Compile every job not yet in the cache; one outcome per job, in job order. Jobs not
        handed over before are checked in this process first: no worker starts when nothing is
        missing. Keys in `damaged` are looked up, and compiled, in the writable root only: their
        entries in read-only layers failed their checks and must not count as cached.
        `on_outcome` is handed each worker's outcome as it comes, while the others compile."""
        handed = [job for job in jobs if job.key in self._submitted]
        outcomes, missing = _check_cache([job for job in jobs if job.key not in self._submitted], self.layout, damaged)
        wanted = handed + missing
        if wanted:
            needed = min(self.max_workers, len(wanted))
            if self.started and self.workers < needed and not handed:
                self.close()  # started small for an earlier target: start again, as large as needed
            self.start(len(wanted))
            self.submit(missing, damaged)
            logger.info("compiling %d kernels with %d workers", len(wanted), self.workers)
            progress = progress or NoProgress()
            progress.start(label, len(jobs), len(jobs) - len(wanted))
            try:
                for outcome in self._collect(wanted):
                    outcomes[outcome.job.key] = outcome
                    if on_outcome is not None:
                        on_outcome(outcome)
                    progress.advance()
            finally:
                progress.finish()
        return tuple(outcomes[job.key] for job in jobs)

    def _collect(self, jobs: list[CompileJob]) -> Iterator[JobOutcome]:
        """Each job's outcome as its worker finishes it (every job handed over before)."""
        from concurrent.futures import as_completed

        from pebble import ProcessExpired

        waited = time.perf_counter()
        self._starting.join()
        try:
            if self._start_error is not None:
                raise self._start_error
            pid = self._ready.result(timeout=WORKER_START_TIMEOUT_SECONDS)
            logger.info("first compile worker (pid %d) ready after %.2f s more", pid, time.perf_counter() - waited)
        except Exception as error:
            detail = (
                f"none was ready after {WORKER_START_TIMEOUT_SECONDS:g} s"
                if isinstance(error, FutureTimeoutError)
                else f"{type(error).__name__}: {error}"
            )
            reason = f"compile workers could not start ({detail}); their own error is on stderr"
            script = _reimported_script()
            if script is not None:
                reason += (
                    f"; if {script} calls kprecompile.warm outside {_GUARD}, each worker re-imports it "
                    "and stops: move the call under it"
                )
            yield from (JobOutcome(job, "failed", 0.0, reason) for job in jobs)
            return
        timeout = self.job_timeout_seconds
        with self._lock:
            futures = {self._submitted[job.key][2]: job for job in jobs}
        for future in as_completed(futures):
            job = futures[future]
            try:
                outcome = future.result()
            except FutureTimeoutError:
                yield JobOutcome(job, "failed", timeout, f"timed out after {timeout:g} s")
            except ProcessExpired as error:
                yield JobOutcome(job, "failed", 0.0, f"worker died: {_describe_exit(error.exitcode)}")
            except Exception as error:  # the worker could not even run compile_job
                yield JobOutcome(job, "failed", 0.0, f"{type(error).__name__}: {error}")
            else:
                # pebble enforces the timeout from its own threads, which a loaded machine can run
                # late: a job that ran past its timeout fails all the same.
                if outcome.status != "failed" and outcome.seconds > timeout:
                    outcome = JobOutcome(job, "failed", outcome.seconds, f"timed out after {timeout:g} s")
                yield outcome


def _check_cache(
    jobs: Sequence[CompileJob], layout: CacheLayout, damaged: frozenset[str] = frozenset()
) -> tuple[dict[str, JobOutcome], list[CompileJob]]:
    """In-process: outcomes of jobs already cached, and the jobs that are not."""
    writable = CacheLayout(layout.root)
    outcomes: dict[str, JobOutcome] = {}
    missing = []
    for job in jobs:
        if is_compiled(writable if job.key in damaged else layout, job.key):
            outcomes[job.key] = JobOutcome(job, "cached", 0.0)
        else:
            missing.append(job)
    return outcomes, missing


def compile_jobs(
    jobs: Sequence[CompileJob],
    layout: CacheLayout,
    *,
    max_workers: int | None = None,
    job_timeout_seconds: float = DEFAULT_JOB_TIMEOUT_SECONDS,
    progress: Progress | None = None,
) -> tuple[JobOutcome, ...]:
    """Compile every job not yet in the cache; no worker is started when none is missing."""
    with CompilePool(layout, max_workers=max_workers, job_timeout_seconds=job_timeout_seconds) as pool:
        return pool.compile(jobs, progress)


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
