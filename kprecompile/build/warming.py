"""`warm`: plan, compile what is missing, and record the configuration as warm.

Per target, the manifest key is computed first, from the model digest, serving parameters,
toolchain and environment, without importing torch or tracing: when its manifest exists, every
kernel it lists is in the cache and it has considered every record of the configuration's
journal, the target is warm and nothing else runs. Otherwise the target is planned (or, when
only the journal is new, the manifest's plan reused), the journal's records replayed, the
missing kernels compiled, and the manifest written last, only when every kernel compiled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..cache.entries import has_entries, remove_entry
from ..cache.jobs import CompileJob
from ..cache.layout import CacheLayout
from ..cache.manifest import Manifest, job_problems, record_artifacts, write_manifest
from ..cache.staging import remove_stale_staging
from ..cache.usage import tag_cache_dir, using
from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..inputs.toolchain import triton_key_text
from ..progress import Progress
from ..selection.engines import Selection, select
from ..shapes import FAMILIES, FamilyName
from .compile import JobOutcome, job_lock
from .manifest_key import ManifestLookup, find_manifest
from .planning import FamilyPlan, compiled_families, plan, planned_shapes
from .pool import DEFAULT_JOB_TIMEOUT_SECONDS, CompilePool
from .replay import RECORDED_FAMILY, Replay, recorded_here, replay, shorten, unsettled

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
    # Kernels whose launchers (and Triton's driver utilities) were built into the cache: only
    # when warming for this machine's own GPU (docs/design.md, fact 7); 0 elsewhere.
    launchers: int
    # Wall time of the whole warm, and of its tracing and compiling parts (0 when the
    # manifest showed the configuration warm).
    seconds: float
    trace_seconds: float
    compile_seconds: float
    failures: tuple[KernelFailure, ...]
    manifests: tuple[str, ...]
    cache_dir: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _library_modules(families: Sequence[FamilyName]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(prefix for name in families for prefix in FAMILIES[name].traced_modules))


def _build_launchers(
    model: ModelConfig, serving: ServingParams, layout: CacheLayout, target: Target, selection: Selection
) -> int:
    """On a host with `target`'s GPU, load every kernel once so that Triton builds and caches its
    launcher and driver utility modules (built with the host compiler, and needing the GPU's
    driver): a serving process then only loads them. Returns how many kernels were loaded."""
    from triton import knobs

    from .preload import is_local_gpu, preload

    if not is_local_gpu(target):
        return 0
    with knobs.cache.scope():
        knobs.cache.dir = str(layout.triton_dir)
        report = preload(model, serving, layout, target=target, selection=selection, launchers=True)
    for failure in report.failures:
        logger.warning("launcher not built: %s", failure)
    return report.kernels - len(report.failures)


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
            logger.warning(
                "recorded %s [%s…] failed to compile here: %s",
                outcome.job.kernel,
                outcome.job.key[:12],
                shorten(failed[outcome.job.key]),
            )
    settled = dict(replayed.outcomes)
    settled.update({key: shorten(f"failed to compile here: {error}") for key, error in failed.items()})
    kept = tuple(job for job in replayed.jobs if job.key not in failed)
    return (
        [o for o in outcomes if o.job.key not in failed],
        tuple(job for job in jobs if job.key not in failed),
        Replay(kept, settled, replayed.seconds),
    )


def _pool(
    layout: CacheLayout, max_workers: int | None, job_timeout_seconds: float, families: Sequence[FamilyName]
) -> CompilePool:
    return CompilePool(
        layout,
        max_workers=max_workers,
        job_timeout_seconds=job_timeout_seconds,
        preload_modules=_library_modules(families),
    )


def _warm_from_manifest(layout: CacheLayout, lookup: ManifestLookup) -> tuple[Manifest | None, frozenset[str]]:
    """The manifest when every kernel it lists is intact (checksums included), else None.

    Entries that no longer match their record (truncated, altered) are deleted under their
    lock where they are writable, so that this warm compiles them again; returns their keys
    (an entry in a read-only layer stays, and its kernel is compiled into the writable root).
    """
    manifest = lookup.manifest
    if manifest is None:
        return None, frozenset()
    problems = job_problems(layout, manifest, deep=True)
    if not problems:
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
    model: ModelConfig,
    serving: ServingParams,
    targets: Sequence[Target],
    layout: CacheLayout,
    *,
    selection: Selection | None = None,
    max_workers: int | None = None,
    job_timeout_seconds: float = DEFAULT_JOB_TIMEOUT_SECONDS,
    progress: Progress | None = None,
    rank: int = 0,
    ranks: int = 1,
    recorded: bool = True,
) -> WarmReport:
    """Compile what this configuration lacks on each target and record it.

    `rank` of `ranks` processes warming the same cache at once (tensor-parallel ranks calling
    the loader hook): each starts at its own share of the job list, so that the file locks
    split the work instead of every rank queuing behind the same first kernel. `recorded`: also
    compile the kernels serving processes recorded in the configuration's journal (`replay.py`).
    """
    started = time.perf_counter()
    # Selection and shapes first: every input error surfaces before anything is written.
    if selection is None:
        selection = select(model)
    shapes = planned_shapes(model, serving, selection)
    # Held while warming: `cache prune` never deletes what this warm is writing (`cache/usage.py`).
    with using(layout):
        tag_cache_dir(layout)
        # What an import killed midway left (its staging directory) goes before anything else.
        remove_stale_staging(layout)
        return _warm_locked(
            model,
            serving,
            targets,
            layout,
            selection,
            shapes,
            started,
            max_workers=max_workers,
            job_timeout_seconds=job_timeout_seconds,
            progress=progress,
            rank=rank,
            ranks=ranks,
            recorded=recorded,
        )


def _warm_locked(
    model: ModelConfig,
    serving: ServingParams,
    targets: Sequence[Target],
    layout: CacheLayout,
    selection: Selection,
    shapes: dict,
    started: float,
    *,
    max_workers: int | None,
    job_timeout_seconds: float,
    progress: Progress | None,
    rank: int,
    ranks: int,
    recorded: bool,
) -> WarmReport:
    """The warm itself, with the root's usage lock held."""
    families: list[FamilyPlan] = []
    outcomes: list[JobOutcome] = []
    manifests: list[str] = []
    pool: CompilePool | None = None
    trace_seconds = compile_seconds = 0.0
    replaced = launchers = workers = 0
    try:
        for target in targets:
            lookup = find_manifest(model, serving, selection, target, layout)
            records = recorded_here(layout, lookup, target) if recorded else []
            manifest, damaged = _warm_from_manifest(layout, lookup)
            replaced += len(damaged)
            if manifest is not None and not unsettled(records, manifest):
                logger.info("%s on %s is warm: manifest %s", model.name, target.name, lookup.key)
                families += [FamilyPlan(**row) for row in manifest.families]
                outcomes += [JobOutcome(job, "cached", 0.0) for job in manifest.jobs]
                manifests.append(str(lookup.path))
                launchers += _build_launchers(model, serving, layout, target, selection)
                continue
            if manifest is not None:
                # Warm but for new records: the plan's part of the manifest stands, untraced.
                planned_jobs = tuple(job for job in manifest.jobs if job.family != RECORDED_FAMILY)
                target_families = [FamilyPlan(**row) for row in manifest.families if row["family"] != RECORDED_FAMILY]
            else:
                compiled_here = compiled_families(model, serving, shapes, target)
                if pool is None and compiled_here:
                    pool = _pool(layout, max_workers, job_timeout_seconds, compiled_here)
                    if not has_entries(layout):
                        # A cold cache: everything will compile, so start every worker now, while
                        # this process traces. Otherwise the plan decides how many are needed.
                        pool.start()
                if progress is not None:
                    progress.status(f"{model.name} on {target.name}", "tracing the engine's calls")
                target_plan = plan(model, serving, [target], selection, shapes, layout)
                trace_seconds += target_plan.trace_seconds
                planned_jobs, target_families = target_plan.jobs, list(target_plan.families)
            replayed = None
            if records:
                replayed = replay(records, target, {job.key for job in planned_jobs}, triton_key_text(layout))
            jobs = planned_jobs + (replayed.jobs if replayed else ())
            if pool is None and jobs:
                pool = _pool(layout, max_workers, job_timeout_seconds, ())
            compile_started = time.perf_counter()
            start = (rank % ranks) * len(jobs) // ranks
            ordered = jobs[start:] + jobs[:start]
            label = f"{model.name} on {target.name}"
            # A damaged entry in a read-only layer stays there: its kernel is compiled into the
            # writable root, which every reader searches first, and the manifest records that copy.
            target_outcomes = pool.compile(ordered, progress, label, damaged) if pool is not None else ()
            workers = max(workers, pool.workers if pool is not None else 0)
            compile_seconds += time.perf_counter() - compile_started
            if replayed is not None:
                target_outcomes, jobs, replayed = _without_failed_replays(target_outcomes, jobs, replayed)
                target_families.append(_recorded_row(target, lookup.journal_key, replayed))
            families += target_families
            outcomes += target_outcomes
            if all(outcome.status != "failed" for outcome in target_outcomes):
                artifacts = record_artifacts(layout, jobs)
                rows = tuple(family.as_dict() for family in target_families)
                manifest = Manifest(
                    lookup.key,
                    lookup.parts,
                    rows,
                    jobs,
                    artifacts,
                    {"name": model.name, "source": model.source},
                    replayed.outcomes if replayed else {},
                )
                manifests.append(write_manifest(layout, manifest))
                launchers += _build_launchers(model, serving, layout, target, selection)
    finally:
        if pool is not None:
            pool.close()
    failures = tuple(
        KernelFailure(
            model.name, o.job.family, o.job.target, o.job.kernel, o.job.describe_specialization(), o.error or ""
        )
        for o in outcomes
        if o.status == "failed"
    )
    return WarmReport(
        model=model.name,
        targets=tuple(target.name for target in targets),
        families=tuple(families),
        kernels=len(outcomes),
        compiled=sum(o.status == "compiled" for o in outcomes),
        cached=sum(o.status == "cached" for o in outcomes),
        failed=len(failures),
        replaced=replaced,
        workers=workers,
        launchers=launchers,
        seconds=time.perf_counter() - started,
        trace_seconds=trace_seconds,
        compile_seconds=compile_seconds,
        failures=failures,
        manifests=tuple(manifests),
        cache_dir=str(layout.root),
    )
