"""`bake`, `export` and `import`: caches that travel (image layers, archives) and arrive intact.

`bake` warms every requested configuration into a fresh directory and describes it as a
bundle, compiling too what serving processes recorded in the journals of a cache; `export`
copies one configuration's manifests, kernels and journal out of a cache as an archive;
`import` adds an archive to a cache after validating all of it, refusing a bundle whose
toolchain this machine cannot serve, and merges its journals into the cache's. So what GPU
hosts recorded reaches a CPU builder, and the image it bakes. The storage side is
`cache/bundle.py`.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..cache.archive_check import DEFAULT_LIMITS, ImportLimits
from ..cache.archive_install import ImportReport, install_archive
from ..cache.bundle import BUNDLE_FILE, BundleIndex, copy_configurations, write_archive
from ..cache.bundle import write_index as write_bundle_index
from ..cache.journal import merge as merge_journal
from ..cache.journal import read_records
from ..cache.layout import CacheLayout
from ..cache.manifest import job_problems, read_manifest
from ..errors import BundleError, DamagedCacheError, InputError
from ..inputs import settings
from ..inputs.targets import TARGETS
from ..inputs.toolchain import SERVING_FIELDS, current_toolchain, toolchain_differences
from ..progress import Progress
from ..selection.request import Request
from .manifest_key import find_manifest
from .pool import DEFAULT_JOB_TIMEOUT_SECONDS
from .warming import FamilyFailure, KernelFailure, warm


@dataclass(frozen=True)
class BakeReport:
    out: str
    archive: str | None
    # One row per configuration (model x target) in the bundle; empty when a kernel or family failed.
    configurations: tuple[dict[str, Any], ...]
    files: int
    bytes: int
    archive_bytes: int | None
    kernels: int
    compiled: int
    cached: int
    failed: int
    failures: tuple[KernelFailure, ...]
    seconds: float
    # Families whose planning failed (the rest was compiled into `out`).
    family_failures: tuple[FamilyFailure, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExportReport:
    archive: str
    configurations: tuple[dict[str, Any], ...]
    files: int
    bytes: int
    archive_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_archive_path(archive: str | Path) -> Path:
    """An archive path we can write: a file in an existing directory."""
    path = Path(archive)
    if path.is_dir():
        raise InputError("--archive", str(archive), "a file path, not a directory")
    if not path.absolute().parent.is_dir():
        raise InputError("--archive", str(archive), "a file in an existing directory")
    return path


def write_index(layout: CacheLayout, manifest_keys: Sequence[str]) -> BundleIndex:
    """`bundle.json` for the named manifests of the cache at `layout`."""
    configurations, toolchains = [], {}
    for key in sorted(set(manifest_keys)):
        manifest = read_manifest(layout, key)
        if manifest is None:
            raise BundleError(f"{layout.manifests_dir.name}/{key}.json", "a readable manifest")
        parts = manifest.parts
        toolchains[parts["target"]] = parts["toolchain"]
        configurations.append(
            {
                "manifest": key,
                "target": parts["target"],
                "model": manifest.model,
                "model_digest": parts["model_digest"],
                "serving": parts["serving"],
                "kernels": len(manifest.jobs),
            }
        )
    return write_bundle_index(layout.root, configurations, toolchains, __version__)


def bake(
    requests: Sequence[Request],
    out: str | Path,
    archive: str | Path | None = None,
    *,
    max_workers: int | None = None,
    job_timeout_seconds: float = DEFAULT_JOB_TIMEOUT_SECONDS,
    progress: Progress | None = None,
    recorded_from: CacheLayout | None = None,
) -> BakeReport:
    """Warm every request into `out` and describe it as a bundle (and an archive).

    `recorded_from`: a cache whose journals of these configurations are carried into the bundle
    and compiled (None: only what `out` already records). When a kernel or a family's planning
    fails, the rest is still compiled but no index or archive is written: the report lists the
    failures.
    """
    started = time.perf_counter()
    archive_path = check_archive_path(archive) if archive is not None else None
    layout = CacheLayout.of(out)
    keys: list[str] = []
    failures: list[KernelFailure] = []
    family_failures: list[FamilyFailure] = []
    totals = {"kernels": 0, "compiled": 0, "cached": 0}
    for request in requests:
        if recorded_from is not None:
            carry_journals(recorded_from, layout, request)
        report = warm(
            request,
            layout,
            max_workers=max_workers,
            job_timeout_seconds=job_timeout_seconds,
            progress=progress,
            recorded=recorded_from is not None,
        )
        keys += [Path(path).stem for path in report.manifests]
        failures += report.failures
        family_failures += report.family_failures
        for name in totals:
            totals[name] += getattr(report, name)
    index, archive_bytes = None, None
    if not failures and not family_failures:
        index = write_index(layout, keys)
        if archive_path is not None:
            write_archive(layout.root, archive_path)
            archive_bytes = archive_path.stat().st_size
    return BakeReport(
        out=str(layout.root),
        archive=str(archive_path) if archive_path is not None and index is not None else None,
        configurations=index.configurations if index else (),
        files=index.files if index else 0,
        bytes=index.bytes if index else 0,
        archive_bytes=archive_bytes,
        failed=len(failures),
        failures=tuple(failures),
        seconds=time.perf_counter() - started,
        family_failures=tuple(family_failures),
        **totals,
    )


def export(request: Request, layout: CacheLayout, archive: str | Path) -> ExportReport:
    """This configuration's manifests (one per target) and kernels, from `layout`, as an archive."""
    archive_path = check_archive_path(archive)
    manifests: dict[str, list[str]] = {}
    for target in request.targets:
        lookup = find_manifest(request, target, layout, remember=False)
        if lookup.manifest is None:
            raise InputError(
                "configuration",
                f"{request.model.name} on {target.name}",
                f"one warmed in {layout.root}: run `kprecompile warm` with the same options first",
            )
        # Only intact kernels travel: an export re-records checksums, so a damaged file would leave
        # as a good one.
        problems = job_problems(layout, lookup.manifest, deep=True)
        if problems:
            job, problem = problems[0]
            raise DamagedCacheError(
                f"{request.model.name} on {target.name}",
                len(problems),
                f"{job.kernel_name} [{job.key[:12]}]: {problem.message}",
            )
        manifests[lookup.key] = [job.key for job in lookup.manifest.jobs]
    with tempfile.TemporaryDirectory(prefix="kprecompile-export-") as scratch:
        bundle = CacheLayout.of(scratch)
        copy_configurations(layout, manifests, bundle.root)
        carry_journals(layout, bundle, request)
        index = write_index(bundle, list(manifests))
        write_archive(bundle.root, archive_path)
    return ExportReport(str(archive_path), index.configurations, index.files, index.bytes, archive_path.stat().st_size)


def carry_journals(source: CacheLayout, destination: CacheLayout, request: Request) -> int:
    """Merge `source`'s journal records of the request's configurations (every root of it) into
    `destination`'s journals; returns how many records there were."""
    carried = 0
    for target in request.targets:
        lookup = find_manifest(request, target, source, remember=False)
        records = read_records(source, lookup.journal_key)
        if records:
            merge_journal(destination, lookup.journal_key, records.values())
            carried += len(records)
    return carried


def check_toolchains(toolchains: dict[str, dict[str, Any]]) -> None:
    """Refuse a bundle baked with a toolchain whose binaries this machine would never serve."""
    for target_name, baked in toolchains.items():
        target = TARGETS.get(target_name)
        if target is None:
            raise BundleError(BUNDLE_FILE, f"targets kprecompile knows ({', '.join(TARGETS)}), not {target_name!r}")
        differences = toolchain_differences(baked, current_toolchain(None, target).as_dict(), SERVING_FIELDS)
        if differences:
            raise BundleError(
                BUNDLE_FILE, f"a bundle this machine can serve; for {target_name}: " + "; ".join(differences)
            )


def import_archive(archive: str | Path, layout: CacheLayout, limits: ImportLimits = DEFAULT_LIMITS) -> ImportReport:
    """Add the archive to the cache's writable root after validating all of it; all or nothing.
    Each kernel entry is installed under its compile lock, waiting up to $KPRECOMPILE_LOCK_TIMEOUT."""
    return install_archive(
        Path(archive),
        CacheLayout.of(layout.root),
        check_toolchains,
        lock_timeout_seconds=settings.LOCK_TIMEOUT.read(),
        lock_timeout_variable=settings.LOCK_TIMEOUT.name,
        limits=limits,
    )
