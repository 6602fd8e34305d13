"""Importing a bundle archive into a cache: all of it or none of it, safe beside other writers.

`archive_check.py` reads and checks everything first (the signature, and the caller's check, the
toolchain);
only then is anything written, in a staging directory inside the cache root (`staging`: the next
run removes one a killed import left), then installed: each kernel entry under its compile lock,
so that a concurrent warm or import waits instead of racing the rename; AITER's JIT files without
overwriting; manifests, then journals, merged into the cache's own (their damaged lines skipped
with one warning), last. An entry or manifest already there and intact is kept (a manifest is
replaced by one listing all of its kernels and more: a warm that replayed recorded kernels), a
damaged one replaced and reported. A failure undoes every step (`UndoLog`), and the cache is as
it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import BundleError, InputError
from . import journal as journals
from .archive_check import (
    DEFAULT_LIMITS,
    ArchiveTrust,
    CheckedArchive,
    ImportLimits,
    check_free_space,
    check_jit_files,
    member_blocks,
    read_archive,
    reading,
    same_file,
)
from .bundle import BUNDLE_FILE
from .entries import group_children
from .files import FILE_MODE, make_directories, write_atomic
from .layout import Bucket, CacheLayout, entry_key
from .locks import hold_lock
from .manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest
from .signing import SIGNATURE_FILE
from .staging import remove_stale_staging, staging_directory
from .usage import tag_cache_dir, using

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportReport:
    archive: str
    cache_dir: str
    configurations: int
    entries_added: int
    # Kernel entries the cache already held intact (kept as they were).
    entries_present: int
    # Kernel entries the cache held damaged (a file missing, truncated or altered): replaced.
    entries_replaced: int
    manifests_added: int
    manifests_present: int
    manifests_replaced: int
    # AITER's JIT files (aiter-jit-v1/): added, or already there with the same content.
    jit_files_added: int
    jit_files_present: int
    # Records of kernels compiled while serving, merged into the cache's journals.
    journal_records: int = 0
    # The fingerprint of the trusted key that signed the archive; None when it was accepted
    # unsigned (or wrongly signed) with --allow-unsigned.
    signing_key: str | None = None


# Called with bundle.json's toolchains (target name -> toolchain fields) before anything is
# written; raises BundleError when this machine cannot serve them.
ToolchainCheck = Callable[[dict[str, dict[str, Any]]], None]
# The key of the journal of the configuration with these manifest parts.
JournalKey = Callable[[dict[str, Any]], str]


def install_archive(
    archive: Path,
    layout: CacheLayout,
    check_toolchains: ToolchainCheck,
    *,
    trust: ArchiveTrust,
    journal_key: JournalKey,
    lock_timeout_seconds: float,
    lock_timeout_variable: str,
    limits: ImportLimits = DEFAULT_LIMITS,
) -> ImportReport:
    """Validate all of `archive` (its signature by one of `trust`'s keys first), then add it to
    the writable root of `layout`; all or nothing."""
    with reading(archive):
        try:
            tar = tarfile.open(archive, "r:*")
        except (OSError, tarfile.TarError) as error:
            reason = (str(error).splitlines() or [type(error).__name__])[0].rstrip(":")
            raise InputError("archive", str(archive), f"a readable .tar.gz bundle ({reason})") from None
    with tar:
        with reading(archive):
            bundle = read_archive(tar, limits, trust, archive, journal_key)
        check_toolchains(bundle.index["toolchains"])
        check_jit_files(bundle, layout)
        check_free_space(bundle, layout.root)
        # Only now, with everything checked, anything is written: held while installing, so that
        # `cache prune` never takes entries whose manifest is not installed yet (`usage.py`).
        with using(layout):
            report = _install(tar, bundle, archive, layout, lock_timeout_seconds, lock_timeout_variable)
            tag_cache_dir(layout)
            return report


StepKind = Literal["entry", "file", "directory"]


@dataclass
class UndoLog:
    """Every step taken, undone in reverse when a later one fails: what was installed (an entry
    directory, a file, a directory created for one) and what it displaced, kept in staging."""

    steps: list[tuple[StepKind, Path, Path | None]] = field(default_factory=list)

    def add(self, kind: StepKind, installed: Path, displaced: Path | None = None) -> None:
        self.steps.append((kind, installed, displaced))

    def undo(self) -> None:
        for kind, installed, displaced in reversed(self.steps):
            with contextlib.suppress(OSError):
                if kind == "entry":
                    shutil.rmtree(installed)
                elif kind == "file":
                    installed.unlink()
                else:
                    installed.rmdir()
            if displaced is not None:
                with contextlib.suppress(OSError):
                    os.rename(displaced, installed)


@dataclass
class _Counts:
    entries_added: int = 0
    entries_present: int = 0
    entries_replaced: int = 0
    manifests_added: int = 0
    manifests_present: int = 0
    manifests_replaced: int = 0
    jit_files_added: int = 0
    jit_files_present: int = 0
    journal_records: int = 0


def _install(
    tar: tarfile.TarFile,
    bundle: CheckedArchive,
    archive: Path,
    layout: CacheLayout,
    lock_timeout_seconds: float,
    lock_timeout_variable: str,
) -> ImportReport:
    counts = _Counts()
    journal = UndoLog()
    make_directories(layout.root)  # what it installs is made owner-only as it goes
    remove_stale_staging(layout)
    with staging_directory(layout) as staging:
        try:
            with reading(archive):
                _extract(tar, bundle, staging)
            for entry in sorted(bundle.entries):
                lock = layout.lock_path(str(entry_key(entry)))
                with hold_lock(lock, f"kernel entry {entry}", lock_timeout_seconds, lock_timeout_variable):
                    _install_entry(bundle, entry, staging, layout, journal, counts)
            for name in sorted(bundle.jit_files):
                _install_jit_file(bundle, name, staging, layout, journal, counts)
            for key in sorted(bundle.manifests):
                _install_manifest(key, staging, layout, journal, counts, bundle.manifests[key])
            for key in sorted(bundle.journals):
                _merge_journal(key, bundle.journals[key], staging, layout, journal, counts)
        except BaseException:
            journal.undo()
            raise
    configurations = len(bundle.index["configurations"])
    return ImportReport(str(archive), str(layout.root), configurations, **vars(counts), signing_key=bundle.signing_key)


def _missing_directories(directory: Path) -> list[Path]:
    """`directory` and its parents that do not exist yet, outermost first."""
    missing = []
    for path in (directory, *directory.parents):
        if path.exists():
            break
        missing.append(path)
    return list(reversed(missing))


def _extract(tar: tarfile.TarFile, bundle: CheckedArchive, staging: Path) -> None:
    """Every file into the staging directory, hashed again on the way (the archive may have
    changed since it was read)."""
    import hashlib

    for name, member in bundle.members.items():
        if name in (BUNDLE_FILE, SIGNATURE_FILE):
            continue
        target = staging / name
        make_directories(target.parent)
        digest = hashlib.sha256()
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        with os.fdopen(descriptor, "wb") as output:
            for block in member_blocks(tar, member):
                digest.update(block)
                output.write(block)
        if digest.hexdigest() != bundle.digests[name]:
            raise BundleError(name, "the same content on a second read (the archive changed while importing)")


EntryState = Literal["absent", "intact", "damaged"]


def _entry_state(final: Path, bundle: CheckedArchive, entry: str) -> tuple[EntryState, str]:
    """Whether the cache's entry is absent, intact (every file of the bundle's entry, same
    content, its group file naming them), or damaged, and why."""
    try:
        status = final.lstat()
    except FileNotFoundError:
        return "absent", ""
    if not stat.S_ISDIR(status.st_mode):
        return "damaged", "not a directory"
    group = bundle.groups.get(entry)
    for file_name, name in bundle.entries[entry].items():
        if group is not None and file_name == group[0]:
            continue
        record = bundle.index["files"][name]
        same = same_file(final / file_name, record["sha256"], record["size"])
        if not same:
            return "damaged", f"{file_name} is {'missing' if same is None else 'not the same file'}"
    if group is not None:
        found = group_children(final, group[0])
        if found is None or set(found) != group[1]:
            return "damaged", f"{group[0]} is missing or does not name the entry's files"
    return "intact", ""


def _install_entry(
    bundle: CheckedArchive, entry: str, staging: Path, layout: CacheLayout, journal: UndoLog, counts: _Counts
) -> None:
    """Under the entry's compile lock: keep an intact entry, move a damaged one aside, rename the
    staged one into place."""
    staged = staging / Bucket.TRITON.value / entry
    final = layout.triton_dir / entry
    state, reason = _entry_state(final, bundle, entry)
    if state == "intact":
        counts.entries_present += 1
        return
    displaced = None
    if state == "damaged" and entry not in bundle.groups:
        # A driver module this host's Triton built itself (its own bytes): the bundle's, recorded
        # by its manifest, takes its place.
        logger.info("replacing Triton's driver module %s with the bundle's: %s", final, reason)
    elif state == "damaged":
        logger.warning("replacing damaged kernel entry %s: %s", final, reason)
    if state == "damaged":
        displaced = staging / "displaced" / Bucket.TRITON.value / entry
        make_directories(displaced.parent)
        os.rename(final, displaced)
    if entry in bundle.groups:
        _point_group_at(staged / bundle.groups[entry][0], final)
    make_directories(final.parent)
    try:
        os.rename(staged, final)
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        # Written meanwhile by a process that takes no lock (a serving process's own compile):
        # the entry is the same key's, so take it as it is when it is intact.
        if _entry_state(final, bundle, entry)[0] != "intact":
            raise
        counts.entries_present += 1
        if displaced is not None:
            shutil.rmtree(displaced, ignore_errors=True)
        return
    journal.add("entry", final, displaced)
    if displaced is None:
        counts.entries_added += 1
    else:
        counts.entries_replaced += 1


def _point_group_at(group: Path, final: Path) -> None:
    """Rewrite the group file's absolute child paths for the entry's new home (Triton's own
    cache manager opens them by absolute path)."""
    document = json.loads(group.read_bytes())
    children = document["child_paths"]
    document["child_paths"] = {name: str(final / os.path.basename(path)) for name, path in children.items()}
    write_atomic(group, json.dumps(document).encode())


def _install_jit_file(
    bundle: CheckedArchive, name: str, staging: Path, layout: CacheLayout, journal: UndoLog, counts: _Counts
) -> None:
    """Link the staged file into place, which never replaces a file: one written meanwhile is
    accepted only with the same content."""
    record = bundle.index["files"][name]
    final = layout.root / name
    for directory in _missing_directories(final.parent):
        os.mkdir(directory, 0o755)  # owner-only whatever the umask (`files.make_directories`)
        journal.add("directory", directory)
    try:
        os.link(staging / name, final)
    except FileExistsError:
        if not same_file(final, record["sha256"], record["size"]):
            raise BundleError(
                name,
                f"a file the cache does not hold with other content ({final} differs: remove it to take the bundle's)",
            ) from None
        counts.jit_files_present += 1
        return
    journal.add("file", final)
    counts.jit_files_added += 1


def _merge_journal(
    key: str,
    records: dict[str, journals.Record],
    staging: Path,
    layout: CacheLayout,
    journal: UndoLog,
    counts: _Counts,
) -> None:
    """Merge the bundle's records into the cache's journal; its previous content (copied under
    the journal's lock) waits in staging until the import succeeded."""
    final = journals.journal_path(layout, key)
    for directory in _missing_directories(final.parent):
        os.mkdir(directory, 0o755)  # owner-only whatever the umask (`files.make_directories`)
        journal.add("directory", directory)
    backup = staging / "displaced" / Bucket.JOURNALS.value / final.name
    journals.merge(layout, key, records.values(), backup=backup)
    journal.add("file", final, backup if backup.exists() else None)
    counts.journal_records += len(records)


def _manifest_state(path: Path, key: str) -> tuple[EntryState, str, Manifest | None]:
    """Whether the cache's manifest is absent, intact (then also the manifest) or damaged, and why."""
    try:
        status = path.lstat()
    except FileNotFoundError:
        return "absent", "", None
    if not stat.S_ISREG(status.st_mode):
        return "damaged", "not a regular file", None
    if status.st_size > MAX_MANIFEST_BYTES:
        return "damaged", f"larger than {MAX_MANIFEST_BYTES:,} bytes", None
    try:
        return "intact", "", parse_manifest(path.read_bytes(), key)
    except ValueError as error:
        return "damaged", str(error), None


def _install_manifest(
    key: str, staging: Path, layout: CacheLayout, journal: UndoLog, counts: _Counts, incoming: Manifest
) -> None:
    """Keep a valid manifest (same key, same configuration) unless the bundle's lists every kernel
    it does and more (the bundle's warm also compiled recorded kernels); replace a damaged one.
    What is replaced waits in staging until the import succeeded."""
    staged = staging / Bucket.MANIFESTS.value / f"{key}.json"
    final = layout.manifest_path(key)
    make_directories(final.parent)
    state, reason, present = _manifest_state(final, key)
    if state == "absent":
        try:
            os.link(staged, final)  # never replaces: another import or warm may have written it
        except FileExistsError:
            state, reason, present = _manifest_state(final, key)
        else:
            journal.add("file", final)
            counts.manifests_added += 1
            return
    if present is not None:
        if not {job.key for job in present.jobs} < {job.key for job in incoming.jobs}:
            # Lists every kernel the bundle's does, or others (its own recorded ones): kept; the
            # journal merged below lets the next warm settle the difference.
            counts.manifests_present += 1
            return
        logger.info("replacing manifest %s: the bundle's lists more kernels (recorded while serving)", final)
    else:
        logger.warning("replacing damaged manifest %s: %s", final, reason)
    displaced = staging / "displaced" / Bucket.MANIFESTS.value / final.name
    make_directories(displaced.parent)
    os.rename(final, displaced)
    os.rename(staged, final)
    journal.add("file", final, displaced)
    counts.manifests_replaced += 1
