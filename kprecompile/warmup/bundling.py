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
from ..cache.archive_check import DEFAULT_LIMITS, ArchiveTrust, ImportLimits
from ..cache.archive_install import ImportReport, install_archive
from ..cache.bundle import (
    BAKE_MARKER,
    BUNDLE_FILE,
    BundleIndex,
    check_bake_directory,
    copy_configurations,
    write_archive,
)
from ..cache.bundle import write_index as write_bundle_index
from ..cache.entries import driver_module_problem, group_file
from ..cache.journal import journal_path, read_records
from ..cache.journal import merge as merge_journal
from ..cache.layout import CacheLayout
from ..cache.manifest import Manifest, job_problems, read_manifest
from ..cache.signing import SigningKey, load_signing_key, load_trusted_keys
from ..cache.trust import check_layout, make_writable_root
from ..errors import BundleError, DamagedCacheError, InputError
from ..inputs import settings
from ..inputs.targets import TARGETS
from ..inputs.toolchain import SERVING_FIELDS, current_toolchain, toolchain_differences
from ..progress import Progress
from ..selection.request import Request
from .manifest_key import find_manifest, journal_key
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
    # The fingerprint of the key that signed bundle.json (and the archive), or None.
    signing_key: str | None = None
    # Triton's driver modules the bundle carries, and per target where none could be built, why
    # (`WarmReport`'s fields of the same names).
    driver_modules: int = 0
    driver_modules_not_built: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExportReport:
    archive: str
    configurations: tuple[dict[str, Any], ...]
    files: int
    bytes: int
    archive_bytes: int
    # The fingerprint of the key that signed it.
    signing_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def signing_key(path: str | Path | None, required: bool = True) -> SigningKey | None:
    """The key archives are signed with: `path` (--signing-key), else $KPRECOMPILE_SIGNING_KEY;
    InputError when there is none and one is `required`."""
    field = "--signing-key"
    if path is None:
        path, field = settings.SIGNING_KEY.read(), settings.SIGNING_KEY.name
    if path is None:
        if not required:
            return None
        raise InputError(
            "--signing-key",
            "not given",
            "a private key to sign the archive with (`kprecompile key generate PATH` makes one; "
            f"{settings.SIGNING_KEY.name} names one for every archive)",
        )
    return load_signing_key(path, field)


def archive_trust(trusted_keys: Sequence[str] = (), allow_unsigned: bool = False) -> ArchiveTrust:
    """The keys import trusts: $KPRECOMPILE_TRUSTED_KEYS and each of `trusted_keys` (--trusted-key)."""
    keys = load_trusted_keys(settings.TRUSTED_KEYS.read(), settings.TRUSTED_KEYS.name)
    keys.update(load_trusted_keys(trusted_keys, "--trusted-key"))
    return ArchiveTrust(keys, allow_unsigned)


def check_archive_path(archive: str | Path) -> Path:
    """An archive path we can write: a file in an existing directory."""
    path = Path(archive)
    if path.is_dir():
        raise InputError("--archive", str(archive), "a file path, not a directory")
    if not path.absolute().parent.is_dir():
        raise InputError("--archive", str(archive), "a file in an existing directory")
    return path


def baked_files(layout: CacheLayout, manifest_keys: Sequence[str]) -> list[str]:
    """What a bake wrote into its bundle: the manifests, each of their kernel entries' files and
    group file, the driver modules they record, the journals of their configurations, and
    AITER's JIT files (checked before the bake by `check_bake_directory`); nothing else that
    lies in the directory."""
    root = layout.root
    names = [path.relative_to(root).as_posix() for path in sorted(layout.aiter_jit_dir.rglob("*")) if path.is_file()]
    for key in sorted(set(manifest_keys)):
        manifest = read_manifest(layout, key)
        if manifest is None:
            raise BundleError(f"{layout.manifests_dir.name}/{key}.json", "a readable manifest")
        names.append(layout.manifest_path(key).relative_to(root).as_posix())
        names.append(journal_path(layout, journal_key(manifest.parts)).relative_to(root).as_posix())
        for job in manifest.jobs:
            entry = layout.triton_entry(job.key)
            group = group_file(entry)
            files = [*manifest.artifacts.get(job.key, {}), *([group.name] if group is not None else [])]
            names += [(entry / name).relative_to(root).as_posix() for name in files]
        for key, files in manifest.launchers.items():
            names += [(layout.triton_entry(key) / name).relative_to(root).as_posix() for name in files]
    return names


def write_index(
    layout: CacheLayout,
    manifest_keys: Sequence[str],
    signed_by: SigningKey | None = None,
    names: Sequence[str] | None = None,
) -> BundleIndex:
    """`bundle.json` for the named manifests of the cache at `layout`, signed with `signed_by`,
    listing `names` (default: every file of its buckets)."""
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
    return write_bundle_index(layout.root, configurations, toolchains, __version__, signed_by, names)


def bake(
    requests: Sequence[Request],
    out: str | Path,
    archive: str | Path | None = None,
    *,
    max_workers: int | None = None,
    job_timeout_seconds: float = DEFAULT_JOB_TIMEOUT_SECONDS,
    progress: Progress | None = None,
    recorded_from: CacheLayout | None = None,
    signing_key_path: str | Path | None = None,
) -> BakeReport:
    """Warm every request into `out` and describe it as a bundle (and an archive), signed with the
    key at `signing_key_path` (else $KPRECOMPILE_SIGNING_KEY; required for an archive).

    `recorded_from`: a cache whose journals of these configurations are carried into the bundle
    and compiled (None: only what `out` already records). When a kernel or a family's planning
    fails, the rest is still compiled but no index or archive is written: the report lists the
    failures.
    """
    started = time.perf_counter()
    archive_path = check_archive_path(archive) if archive is not None else None
    key = signing_key(signing_key_path, required=archive_path is not None)
    layout = CacheLayout.of(out)
    check_layout(layout)
    check_bake_directory(layout.root)
    make_writable_root(layout)
    (layout.root / BAKE_MARKER).touch()
    keys: list[str] = []
    failures: list[KernelFailure] = []
    family_failures: list[FamilyFailure] = []
    totals = {"kernels": 0, "compiled": 0, "cached": 0, "driver_modules": 0}
    not_built: list[str] = []
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
        not_built += [line for line in report.driver_modules_not_built if line not in not_built]
        for name in totals:
            totals[name] += getattr(report, name)
    index, archive_bytes = None, None
    if not failures and not family_failures:
        for manifest_key in keys:
            manifest = read_manifest(layout, manifest_key)
            if manifest is not None:
                _check_driver_modules(layout, manifest, f"{manifest.model['name']} ({manifest_key[:12]})")
        index = write_index(layout, keys, key, baked_files(layout, keys))
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
        signing_key=index.signing_key if index else None,
        driver_modules_not_built=tuple(not_built),
        **totals,
    )


def export(
    request: Request, layout: CacheLayout, archive: str | Path, signing_key_path: str | Path | None = None
) -> ExportReport:
    """This configuration's manifests (one per target) and kernels, from `layout`, as an archive
    signed with the key at `signing_key_path` (else $KPRECOMPILE_SIGNING_KEY)."""
    archive_path = check_archive_path(archive)
    key = signing_key(signing_key_path)
    manifests: dict[str, Manifest] = {}
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
        _check_driver_modules(layout, lookup.manifest, f"{request.model.name} on {target.name}")
        manifests[lookup.key] = lookup.manifest
    with tempfile.TemporaryDirectory(prefix="kprecompile-export-") as scratch:
        bundle = CacheLayout.of(scratch)
        copy_configurations(layout, manifests, bundle.root)
        carry_journals(layout, bundle, request)
        index = write_index(bundle, list(manifests), key)
        write_archive(bundle.root, archive_path)
    return ExportReport(
        str(archive_path),
        index.configurations,
        index.files,
        index.bytes,
        archive_path.stat().st_size,
        index.signing_key,
    )


def _check_driver_modules(layout: CacheLayout, manifest: Manifest, configuration: str) -> None:
    """The driver modules the manifest records, each as recorded (an index or archive lists and
    signs what it finds: a damaged module would leave as a good one); DamagedCacheError if not."""
    for key, files in manifest.launchers.items():
        problem = driver_module_problem(layout, key, files)
        if problem is not None:
            name, why = problem
            raise DamagedCacheError(configuration, 1, f"Triton's driver module {name} [{key[:12]}]: {why}")


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


def import_archive(
    archive: str | Path,
    layout: CacheLayout,
    limits: ImportLimits = DEFAULT_LIMITS,
    *,
    trusted_keys: Sequence[str] = (),
    allow_unsigned: bool = False,
) -> ImportReport:
    """Add the archive to the cache's writable root after validating all of it; all or nothing.
    It must be signed by a key of $KPRECOMPILE_TRUSTED_KEYS or `trusted_keys` (public keys, or
    files of them), unless `allow_unsigned`. Each kernel entry is installed under its compile
    lock, waiting up to $KPRECOMPILE_LOCK_TIMEOUT."""
    trust = archive_trust(trusted_keys, allow_unsigned)
    return install_archive(
        Path(archive),
        CacheLayout.of(layout.root),
        check_toolchains,
        trust=trust,
        journal_key=journal_key,
        lock_timeout_seconds=settings.LOCK_TIMEOUT.read(),
        lock_timeout_variable=settings.LOCK_TIMEOUT.name,
        limits=limits,
    )
