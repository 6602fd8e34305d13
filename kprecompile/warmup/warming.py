"""`warm`: plan, compile what is missing, and record the configuration as warm.

Per target, the manifest key is computed first, from the model digest, serving parameters,
toolchain and environment, without importing torch or tracing: when its manifest exists, every
kernel it lists is in the cache and it has considered every record of the configuration's
journal, the target is warm and nothing else runs. Otherwise the target is planned (or, when
only the journal is new, the manifest's plan reused), the journal's records replayed, the
missing kernels compiled, and the manifest written last, only when every family was planned
and every kernel compiled: a target whose plan failed is never recorded as warm.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cache.checked import checked_before, entries_digest, entries_stats, remember_checked
from ..cache.entries import HashedEntry, driver_module_problem, has_entries, hashed_entry, remove_entry, still_true
from ..cache.jobs import CompileJob
from ..cache.layout import CacheLayout
from ..cache.manifest import Manifest, job_problems, record_artifacts, write_manifest
from ..cache.staging import remove_stale_staging
from ..cache.usage import tag_cache_dir, using
from ..inputs.settings import WorkerStart
from ..inputs.targets import Target
from ..inputs.toolchain import triton_key_text
from ..progress import Progress
from ..selection.request import Request
from ..shapes import FamilyName
from ..wording import plural
from .compile import JobOutcome, job_lock
from .family_plan import FamilyPlan
from .manifest_key import ManifestLookup, find_manifest
from .pool import DEFAULT_JOB_TIMEOUT_SECONDS, CompilePool, refuse_in_worker_start
from .replay import RECORDED_FAMILY, Replay, recorded_here, replay, shorten, unsettled

if TYPE_CHECKING:
    from .driver_modules import DriverModules
    from .planning import PlannedShapes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelFailure:
    model: str
    family: str
    target: str
    kernel: str
    specialization: str
    error: str


@dataclass(frozen=True)
class FamilyFailure:
    """A family whose planning failed: its kernels are not warmed, its target not recorded warm."""

    model: str
    family: str
    target: str
    error: str


@dataclass(frozen=True)
class WarmReport:
    model: str
    targets: tuple[str, ...]
    families: tuple[FamilyPlan, ...]
    kernels: int
    compiled: int
    cached: int
    failed: int
    # Entries of an earlier warm found damaged (size or checksum) and compiled again.
    replaced: int
    # Compile worker processes started (0 when everything was cached): as many as kernels were
    # missing, up to --jobs.
    workers: int
    # Kernels loaded with their launchers on this machine's own GPU when the configuration was
    # already warm (docs/design.md, fact 7); 0 elsewhere. A new manifest's are `driver_modules`.
    launchers: int
    # Wall time of the whole warm, of its tracing, and of compiling once tracing ended (on a cold
    # cache the workers compile each step's kernels while the trace goes on); 0 when the
    # manifest showed the configuration warm.
    seconds: float
    trace_seconds: float
    compile_seconds: float
    failures: tuple[KernelFailure, ...]
    manifests: tuple[str, ...]
    cache_dir: str
    # Families whose planning failed (the rest was warmed).
    family_failures: tuple[FamilyFailure, ...] = ()
    # Triton's driver modules (utilities, launchers) the manifests written by this warm record,
    # built here so that a server runs no C compiler (`driver_modules.py`); and per target where
    # none could be, why ("<target>: what Triton said").
    driver_modules: int = 0
    driver_modules_not_built: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Every family planned and every kernel compiled."""
        return not self.failed and not self.family_failures

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _library_modules(families: Sequence[FamilyName]) -> tuple[str, ...]:
    from ..shapes import FAMILIES

    return tuple(dict.fromkeys(prefix for name in families for prefix in FAMILIES[name].traced_modules))


def _build_launchers(request: Request, layout: CacheLayout, target: Target) -> int:
    """On a host with `target`'s GPU, load every kernel once so that Triton builds and caches its
    launcher and driver utility modules (built with the host compiler, and needing the GPU's
    driver): a serving process then only loads them. Returns how many kernels were loaded."""
    from .preload import is_local_gpu, preload

    if not is_local_gpu(target):
        return 0
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = str(layout.triton_dir)
        report = preload(request, layout, target=target, launchers=True)
    for failure in report.failures:
        logger.warning("launcher not built: %s", failure)
    return report.kernels - len(report.failures)


def _driver_modules(manifest: Manifest, layout: CacheLayout, target: Target) -> DriverModules:
    """Triton's driver modules for the manifest's server, built here; never a failed warm (a
    server builds what is missing on its first start)."""
    from .driver_modules import DriverModules, bake_driver_modules

    try:
        return bake_driver_modules(manifest, layout, target)
    except Exception as error:  # noqa: BLE001 - an optimization of the server's start, never the warm's failure
        logger.warning("Triton's driver modules for %s not built: %s: %s", target.name, type(error).__name__, error)
        return DriverModules({}, f"{type(error).__name__}: {error}"[:300])


def _recorded_row(target: Target, journal_key: str, replayed: Replay) -> FamilyPlan:
    """The manifest's and report's row for the journal's kernels."""
    parameters = {"journal": journal_key[:12], "replayed": len(replayed.jobs), "skipped": replayed.skipped}
    return FamilyPlan(
        RECORDED_FAMILY,
        target.name,
        len(replayed.outcomes),
        len(replayed.jobs),
        parameters,
        None,
        "kernels compiled while serving",
    )


def _without_failed_replays(
    outcomes: Sequence[JobOutcome], jobs: tuple[CompileJob, ...], replayed: Replay
) -> tuple[list[JobOutcome], tuple[CompileJob, ...], Replay]:
    """Recorded kernels are best effort: one that fails to compile here (a compiler that rejects
    what a GPU host's took, a timeout) is one warning and an outcome in the manifest, never a
    failed warm or bake."""
    failed = {o.job.key: o.error or "" for o in outcomes if o.status == "failed" and o.job.family == RECORDED_FAMILY}
    if not failed:
        return list(outcomes), jobs, replayed
    for outcome in outcomes:
        if outcome.job.key in failed:
            logger.info(
                "recorded %s [%s…] failed to compile here: %s",
                outcome.job.kernel,
                outcome.job.key[:12],
                shorten(failed[outcome.job.key]),
            )
    logger.warning(
        "%s failed to compile here, the first with: %s (kprecompile misses says why for each)",
        plural(len(failed), "recorded kernel"),
        shorten(next(iter(failed.values()))),
    )
    settled = dict(replayed.outcomes)
    settled.update({key: shorten(f"failed to compile here: {error}") for key, error in failed.items()})
    kept = tuple(job for job in replayed.jobs if job.key not in failed)
    return (
        [o for o in outcomes if o.job.key not in failed],
        tuple(job for job in jobs if job.key not in failed),
        Replay(kept, settled, replayed.seconds),
    )


def _warm_from_manifest(layout: CacheLayout, lookup: ManifestLookup) -> tuple[Manifest | None, frozenset[str]]:
    """The manifest when every kernel it lists is intact (checksums included), else None.

    Files whose stats are those of the last whole check are not hashed again (`cache/checked.py`).
    Entries that no longer match their record (truncated, altered) are deleted under their
    lock where they are writable, so that this warm compiles them again; returns their keys
    (an entry in a read-only layer stays, and its kernel is compiled into the writable root).
    """
    manifest = lookup.manifest
    if manifest is None:
        return None, frozenset()
    keys = [job.key for job in manifest.jobs]
    if checked_before(layout, lookup.key, lookup.path, keys):
        return manifest, frozenset()
    before = entries_digest(layout, keys)
    problems = job_problems(layout, manifest, deep=True)
    if not problems:
        remember_checked(layout, lookup.key, lookup.path, before)
        return manifest, frozenset()
    damaged = set()
    for job, problem in problems:
        if problem.kind != "not_in_cache":
            logger.warning("replacing %s [%s]: %s", job.kernel_name, job.key, problem.message)
            with job_lock(layout, job):
                remove_entry(layout, job.key)
            damaged.add(job.key)
    return None, frozenset(damaged)


def warm(
    request: Request,
    layout: CacheLayout,
    *,
    max_workers: int | None = None,
    job_timeout_seconds: float = DEFAULT_JOB_TIMEOUT_SECONDS,
    progress: Progress | None = None,
    rank: int = 0,
    ranks: int = 1,
    recorded: bool = True,
    worker_start: WorkerStart | None = None,
) -> WarmReport:
    """Compile what this configuration lacks on each of the request's targets and record it.

    `rank` of `ranks` processes warming the same cache at once (tensor-parallel ranks calling
    the loader hook): each starts at its own share of the job list, so that the file locks
    split the work instead of every rank queuing behind the same first kernel. `recorded`: also
    compile the kernels serving processes recorded in the configuration's journal (`replay.py`).
    `worker_start` overrides KPRECOMPILE_WORKER_START (a serving process spawns: a fork server
    would live as long as it does).
    """
    refuse_in_worker_start()
    started = time.perf_counter()
    # A cache that exists takes the toolchain's memos now; a new one once the inputs are checked.
    remember = layout.root.is_dir()
    lookups = [find_manifest(request, target, layout, remember=remember) for target in request.targets]
    # Shapes first: every input error surfaces before anything is written. A manifest of this
    # key was written by this kprecompile from these same inputs: where every target has one,
    # they are valid and planning (importing every family) waits until a target needs it.
    shapes = None
    if any(lookup.manifest is None for lookup in lookups):
        from .planning import planned_shapes

        shapes = planned_shapes(request.model, request.serving, request.selection)
    # Held while warming: `cache prune` never deletes what this warm is writing (`cache/usage.py`).
    with using(layout):
        tag_cache_dir(layout)
        # What an import killed midway left (its staging directory) goes before anything else.
        remove_stale_staging(layout)
        run = _WarmRun(request, layout, shapes, max_workers, job_timeout_seconds, progress, rank, ranks, worker_start)
        try:
            for target, lookup in zip(request.targets, lookups, strict=True):
                if lookup.manifest is None and not remember:
                    lookup = find_manifest(request, target, layout)
                run.warm_target(target, recorded, lookup)
        finally:
            run.close()
        return run.report(started)


class _WarmRun:
    """One warm's state across its targets: the pool (started once, on the first target that
    compiles) and what every target added to the report."""

    def __init__(
        self,
        request: Request,
        layout: CacheLayout,
        shapes: PlannedShapes | None,
        max_workers: int | None,
        job_timeout_seconds: float,
        progress: Progress | None,
        rank: int,
        ranks: int,
        worker_start: WorkerStart | None,
    ) -> None:
        self.request, self.layout, self._shapes = request, layout, shapes
        self.max_workers, self.job_timeout_seconds = max_workers, job_timeout_seconds
        self.progress, self.rank, self.ranks = progress, rank, ranks
        self.pool: CompilePool | None = None
        self.families: list[FamilyPlan] = []
        self.outcomes: list[JobOutcome] = []
        self.manifests: list[str] = []
        self.trace_seconds = self.compile_seconds = 0.0
        self.replaced = self.launchers = self.workers = self.driver_modules = 0
        self.driver_modules_not_built: list[str] = []
        self.worker_start = worker_start
        # Entries hashed as their kernels came from the workers, for the manifests (`_hash`).
        self.hashed: dict[str, HashedEntry] = {}

    @property
    def shapes(self) -> PlannedShapes:
        """Every family's shapes, planned on first need (inputs a manifest vouched for)."""
        if self._shapes is None:
            from .planning import planned_shapes

            request = self.request
            self._shapes = planned_shapes(request.model, request.serving, request.selection)
        return self._shapes

    def warm_target(self, target: Target, recorded: bool, lookup: ManifestLookup) -> None:
        """The module's steps for one target (its manifest looked up): check the manifest, plan
        (or reuse its plan), replay the journal's records, compile what is missing, write the
        manifest."""
        records = recorded_here(self.layout, lookup, target) if recorded else []
        manifest, damaged = _warm_from_manifest(self.layout, lookup)
        self.replaced += len(damaged)
        if manifest is not None and not unsettled(records, manifest):
            self._already_warm(target, lookup, manifest)
            return
        planned_jobs, families = self._planned(target, manifest, damaged)
        replayed = None
        if records:
            replayed = replay(records, target, {job.key for job in planned_jobs}, triton_key_text(self.layout))
        jobs = planned_jobs + (replayed.jobs if replayed else ())
        outcomes = self._compile(target, jobs, damaged)
        if replayed is not None:
            outcomes, jobs, replayed = _without_failed_replays(outcomes, jobs, replayed)
            families.append(_recorded_row(target, lookup.journal_key, replayed))
        self.families += families
        self.outcomes += outcomes
        planned = all(family.error is None for family in families)
        if planned and all(outcome.status != "failed" for outcome in outcomes):
            self._write_manifest(target, lookup, jobs, families, replayed)

    def _already_warm(self, target: Target, lookup: ManifestLookup, manifest: Manifest) -> None:
        logger.info("%s on %s is warm: manifest %s", self.request.model.name, target.name, lookup.key)
        if lookup.path.parent == self.layout.manifests_dir:
            self._mend_driver_modules(target, manifest)
        self.families += [FamilyPlan(**row) for row in manifest.families]
        self.outcomes += [JobOutcome(job, "cached", 0.0) for job in manifest.jobs]
        self.manifests.append(str(lookup.path))
        self.launchers += _build_launchers(self.request, self.layout, target)

    def _mend_driver_modules(self, target: Target, manifest: Manifest) -> None:
        """Where a driver module the manifest records is not as recorded (a few small files, hashed
        here): built again where missing or damaged, recorded as it is where another manifest of
        the root records it so (another warm rebuilt it: Triton's builds are not reproducible)."""
        try:
            problems = [
                problem
                for key, files in manifest.launchers.items()
                if (problem := driver_module_problem(self.layout, key, files)) is not None
            ]
            if problems:
                # The bake finds each as it is where a manifest records these bytes (another warm
                # rebuilt it), and builds anew one no manifest records so.
                logger.warning("Triton's driver module %s %s: recording the configuration's again", *problems[0])
                modules = _driver_modules(manifest, self.layout, target)
                write_manifest(self.layout, dataclasses.replace(manifest, launchers=modules.records))
                self._count_driver_modules(target, modules)
        except OSError as error:  # never a failed warm: a server builds what is missing
            logger.warning("Triton's driver modules of %s not mended: %s", target.name, error)

    def _planned(
        self, target: Target, manifest: Manifest | None, damaged: frozenset[str]
    ) -> tuple[tuple[CompileJob, ...], list[FamilyPlan]]:
        """The target's planned jobs and family rows: traced, or, when the manifest is warm but
        for new records, the manifest's own (untraced). Where the workers were started before
        the trace, each step's new jobs go to them as it is traced."""
        if manifest is not None:
            jobs = tuple(job for job in manifest.jobs if job.family != RECORDED_FAMILY)
            return jobs, [FamilyPlan(**row) for row in manifest.families if row["family"] != RECORDED_FAMILY]
        from .planning import compiled_families, plan, planned_line

        request = self.request
        compiled_here = compiled_families(
            request.model, request.serving, self.shapes, target, planned_line(request.selection)
        )
        if self.pool is None and compiled_here:
            self.pool = self._new_pool(compiled_here)
            if not has_entries(self.layout):
                # A cold cache: everything will compile, so start every worker now, while this
                # process traces. Otherwise the plan decides how many are needed.
                self.pool.start()
        if self.progress is not None:
            self.progress.status(f"{request.model.name} on {target.name}", "tracing the engine's calls")
        # Ranks split the job list between them (`_compile`), which a stream would not.
        streaming = self.pool is not None and self.pool.started and not damaged and self.ranks == 1
        handed: list[str] = []

        def hand_over(jobs: tuple[CompileJob, ...]) -> None:
            handed.extend(job.key for job in jobs)
            self.pool.submit(jobs)

        target_plan = plan(
            request.on(target), shapes=self.shapes, layout=self.layout, on_jobs=hand_over if streaming else None
        )
        # What a family handed over before its trace failed (or found it cannot run here) is not
        # the plan's: never compiled, nor waited for.
        planned = {job.key for job in target_plan.jobs}
        if self.pool is not None:
            self.pool.cancel([key for key in dict.fromkeys(handed) if key not in planned])
        self.trace_seconds += target_plan.trace_seconds
        return target_plan.jobs, list(target_plan.families)

    def _compile(self, target: Target, jobs: tuple[CompileJob, ...], damaged: frozenset[str]) -> list[JobOutcome]:
        """Compile what the cache lacks, this rank starting at its own share of the list."""
        if self.pool is None and jobs:
            self.pool = self._new_pool(())
        if self.pool is None:
            return []
        started = time.perf_counter()
        start = (self.rank % self.ranks) * len(jobs) // self.ranks
        ordered = jobs[start:] + jobs[:start]
        label = f"{self.request.model.name} on {target.name}"
        # A damaged entry in a read-only layer stays there: its kernel is compiled into the
        # writable root, which every reader searches first, and the manifest records that copy.
        outcomes = list(self.pool.compile(ordered, self.progress, label, damaged, self._hash))
        self.workers = max(self.workers, self.pool.workers)
        self.compile_seconds += time.perf_counter() - started
        return outcomes

    def _hash(self, outcome: JobOutcome) -> None:
        """Hash a kernel's entry as it comes from its worker, while the others compile: the manifest
        then hashes only what changed since, instead of every entry after the last kernel."""
        if outcome.status == "failed":
            return
        try:
            entry = hashed_entry(self.layout, outcome.job.key)
        except OSError:  # hashed with the manifest, which says what is wrong
            return
        if entry is not None:
            self.hashed[outcome.job.key] = entry

    def _write_manifest(
        self,
        target: Target,
        lookup: ManifestLookup,
        jobs: tuple[CompileJob, ...],
        families: list[FamilyPlan],
        replayed: Replay | None,
    ) -> None:
        """Last, once every kernel compiled: the manifest that makes the target warm."""
        model = self.request.model
        # The stats of the files before they are hashed for the manifest: where none changed
        # meanwhile, the next warm need not hash them again.
        keys = [job.key for job in jobs]
        started = time.perf_counter()
        before, identities = entries_stats(self.layout, keys)
        taken = still_true({key: self.hashed[key] for key in keys if key in self.hashed}, identities)
        manifest = Manifest(
            lookup.key,
            lookup.parts,
            tuple(family.as_dict() for family in families),
            jobs,
            record_artifacts(self.layout, jobs, taken),
            {"name": model.name, "source": model.source},
            replayed.outcomes if replayed else {},
        )
        modules = _driver_modules(manifest, self.layout, target)
        manifest = dataclasses.replace(manifest, launchers=modules.records)
        self._count_driver_modules(target, modules)
        path = write_manifest(self.layout, manifest)
        self.manifests.append(path)
        if before == entries_digest(self.layout, keys):
            remember_checked(self.layout, lookup.key, Path(path), before)
        logger.info(
            "manifest of %d kernels (every file hashed, %d as it compiled) written in %.2f s",
            len(jobs),
            len(taken),
            time.perf_counter() - started,
        )

    def _count_driver_modules(self, target: Target, modules: DriverModules) -> None:
        self.driver_modules += sum(map(len, modules.records.values()))
        if modules.missing:
            self.driver_modules_not_built.append(f"{target.name}: {modules.missing}")

    def _new_pool(self, families: Sequence[FamilyName]) -> CompilePool:
        return CompilePool(
            self.layout,
            max_workers=self.max_workers,
            job_timeout_seconds=self.job_timeout_seconds,
            preload_modules=_library_modules(families),
            start_method=self.worker_start,
        )

    def close(self) -> None:
        if self.pool is not None:
            started = time.perf_counter()
            self.pool.close()
            logger.info("compile workers stopped in %.2f s", time.perf_counter() - started)

    def report(self, started: float) -> WarmReport:
        model = self.request.model
        outcomes = self.outcomes
        failures = tuple(
            KernelFailure(
                model.name, o.job.family, o.job.target, o.job.kernel, o.job.describe_specialization(), o.error or ""
            )
            for o in outcomes
            if o.status == "failed"
        )
        family_failures = tuple(
            FamilyFailure(model.name, family.family, family.target, family.error)
            for family in self.families
            if family.error is not None
        )
        return WarmReport(
            model=model.name,
            targets=tuple(target.name for target in self.request.targets),
            families=tuple(self.families),
            kernels=len(outcomes),
            compiled=sum(o.status == "compiled" for o in outcomes),
            cached=sum(o.status == "cached" for o in outcomes),
            failed=len(failures),
            replaced=self.replaced,
            workers=self.workers,
            launchers=self.launchers,
            seconds=time.perf_counter() - started,
            trace_seconds=self.trace_seconds,
            compile_seconds=self.compile_seconds,
            failures=failures,
            manifests=tuple(self.manifests),
            cache_dir=str(self.layout.root),
            family_failures=family_failures,
            driver_modules=self.driver_modules,
            driver_modules_not_built=tuple(self.driver_modules_not_built),
        )
