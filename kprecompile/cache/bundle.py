"""Bundles: a cache, or the part of it some configurations need, as one self-describing unit.

A bundle is a cache root (the same buckets: manifests, Triton entries, AITER's JIT directory)
plus `bundle.json`, which lists its configurations, the toolchain each target was built with,
and every file with its size and sha256. It serves as a read-only layer where it lies (an
image layer), or travels as a `.tar.gz` archive that `import_archive` unpacks into a cache.

Importing validates everything before writing anything: member paths (absolute, escaping the
destination), member types (links, devices, FIFOs), the index (every file listed, sizes and
checksums), and, through the caller's check, the toolchain. Then it stages inside the
destination and moves entries into place, manifests last; a failure leaves the destination as
it was.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tarfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import BundleError, InputError
from .entries import compiled_files, group_file
from .files import atomic_file, sha256_file, sha256_of, write_atomic
from .layout import Bucket, CacheLayout
from .manifest import locate_manifest

BUNDLE_FILE = "bundle.json"
BUNDLE_SCHEMA = 1
# What a bundle may contain, besides its index.
BUNDLE_BUCKETS = (Bucket.MANIFESTS, Bucket.TRITON, Bucket.AITER_JIT)
_TOP_LEVEL = tuple(bucket.value for bucket in BUNDLE_BUCKETS)


@dataclass(frozen=True)
class BundleIndex:
    path: str
    configurations: tuple[dict[str, Any], ...]
    files: int
    bytes: int


def write_index(
    root: Path, configurations: Iterable[dict[str, Any]], toolchains: dict[str, dict[str, Any]], producer: str
) -> BundleIndex:
    """Write `bundle.json` for the cache at `root`: the configurations given, the toolchain of
    each target, and every file of the bundle's buckets with its size and sha256."""
    files = {}
    for top in _TOP_LEVEL:
        for path in sorted((root / top).rglob("*")) if (root / top).is_dir() else ():
            if path.is_file() and not path.is_symlink():
                files[path.relative_to(root).as_posix()] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    configurations = tuple(configurations)
    document = {
        "schema": BUNDLE_SCHEMA,
        "kprecompile": producer,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "configurations": list(configurations),
        "toolchains": toolchains,
        "files": files,
    }
    write_atomic(root / BUNDLE_FILE, json.dumps(document, indent=1, sort_keys=True).encode())
    return BundleIndex(str(root / BUNDLE_FILE), configurations, len(files), sum(f["size"] for f in files.values()))


def copy_configurations(layout: CacheLayout, manifests: dict[str, list[str]], out: Path) -> None:
    """Copy each manifest (by key) and the kernel entries it lists (by Triton key) into `out`."""
    for key, job_keys in sorted(manifests.items()):
        source = locate_manifest(layout, key)
        if source is None:
            raise BundleError(f"{Bucket.MANIFESTS.value}/{key}.json", "a manifest in the cache: warm it first")
        for job_key in job_keys:
            files = compiled_files(layout, job_key)
            if files is None:
                raise BundleError(job_key, "a kernel entry in the cache: warm the configuration first")
            entry = out / Bucket.TRITON.value / files[0].parent.name
            entry.mkdir(parents=True, exist_ok=True)
            for path in [*files, group_file(files[0].parent)]:
                shutil.copy2(path, entry / path.name)
        (out / Bucket.MANIFESTS.value).mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, out / Bucket.MANIFESTS.value / source.name)


def write_archive(bundle: Path, archive: Path) -> None:
    """A gzip-compressed tar of the bundle's index and contents, deterministic (sorted, no owners)."""
    index = json.loads((bundle / BUNDLE_FILE).read_text())
    with atomic_file(archive) as output, tarfile.open(fileobj=output, mode="w:gz", compresslevel=6) as tar:
        for name in [BUNDLE_FILE, *sorted(index["files"])]:
            info = tar.gettarinfo(str(bundle / name), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with (bundle / name).open("rb") as file:
                tar.addfile(info, file)


@dataclass(frozen=True)
class ImportReport:
    archive: str
    cache_dir: str
    configurations: int
    entries_added: int
    entries_present: int
    manifests: int


# Called with bundle.json's toolchains (target name -> toolchain fields) before anything is
# written; raises BundleError when this machine cannot serve them.
ToolchainCheck = Callable[[dict[str, dict[str, Any]]], None]


def import_archive(archive: Path, layout: CacheLayout, check_toolchains: ToolchainCheck) -> ImportReport:
    """Validate all of `archive`, then add it to the cache at `layout`; all or nothing."""
    try:
        tar = tarfile.open(archive, "r:*")
    except (OSError, tarfile.TarError) as error:
        reason = (str(error).splitlines() or [type(error).__name__])[0].rstrip(":")
        raise InputError("archive", str(archive), f"a readable .tar.gz bundle ({reason})") from None
    with tar:
        members = tar.getmembers()
        index = _validate(tar, members)
        check_toolchains(index["toolchains"])
        return _install(tar, members, index, archive, layout)


def _validate(tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> dict[str, Any]:
    for member in members:
        _check_member(member)
    by_name = {member.name: member for member in members if member.isfile()}
    if BUNDLE_FILE not in by_name:
        raise BundleError(BUNDLE_FILE, "an index of the bundle: this is not a kprecompile bundle")
    try:
        index = json.loads(tar.extractfile(by_name[BUNDLE_FILE]).read())
        files = index["files"]
        if not isinstance(index["toolchains"], dict):
            raise TypeError("toolchains is not an object")
        if index["schema"] != BUNDLE_SCHEMA:
            raise ValueError(f"schema {index['schema']}, expected {BUNDLE_SCHEMA}")
    except (ValueError, KeyError, TypeError) as error:
        raise BundleError(BUNDLE_FILE, f"a valid bundle index ({error})") from None
    for name, member in by_name.items():
        if name == BUNDLE_FILE:
            continue
        expected = files.get(name)
        if expected is None:
            raise BundleError(name, "a file listed in bundle.json")
        if member.size != expected["size"]:
            raise BundleError(name, f"{expected['size']} bytes as bundle.json lists (it has {member.size})")
        if sha256_of(_member_blocks(tar, member)) != expected["sha256"]:
            raise BundleError(name, "the sha256 bundle.json lists")
    for name in files:
        if name not in by_name:
            raise BundleError(name, "in the archive, as bundle.json lists it")
    return index


def _member_blocks(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[bytes]:
    stream = tar.extractfile(member)
    yield from iter(lambda: stream.read(1 << 20), b"")


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    path = PurePosixPath(name)
    if not name or name.startswith(("/", "\\")) or path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise BundleError(name, "a relative path")
    if ".." in path.parts:
        raise BundleError(name, "a path inside the destination")
    if member.issym() or member.islnk():
        raise BundleError(name, f"a regular file, not a link to {member.linkname!r}")
    if not (member.isfile() or member.isdir()):
        raise BundleError(name, "a regular file, not a device, FIFO or other special file")
    if name != BUNDLE_FILE and path.parts[0] not in _TOP_LEVEL:
        raise BundleError(name, f"a path under {', '.join(_TOP_LEVEL)}, or {BUNDLE_FILE}")


def _install(
    tar: tarfile.TarFile, members: list[tarfile.TarInfo], index: dict[str, Any], archive: Path, layout: CacheLayout
) -> ImportReport:
    root = layout.root
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".import-{uuid.uuid4().hex}"
    added = present = manifests = 0
    try:
        for member in members:
            if member.isfile() and member.name != BUNDLE_FILE:
                target = staging / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as source, target.open("wb") as destination:
                    shutil.copyfileobj(source, destination)
        # Kernel entries first (whole directories, renamed: atomic), manifests last.
        staged_triton = staging / Bucket.TRITON.value
        for entry in sorted(staged_triton.iterdir()) if staged_triton.is_dir() else ():
            final = layout.triton_dir / entry.name
            if final.exists():
                present += 1
                continue
            _point_group_at(entry, final)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(entry, final)
            added += 1
        jit = staging / Bucket.AITER_JIT.value
        if jit.is_dir():
            shutil.copytree(jit, layout.aiter_jit_dir, dirs_exist_ok=True)
        staged_manifests = staging / Bucket.MANIFESTS.value
        for manifest in sorted(staged_manifests.glob("*.json")) if staged_manifests.is_dir() else ():
            layout.manifests_dir.mkdir(parents=True, exist_ok=True)
            os.replace(manifest, layout.manifests_dir / manifest.name)
            manifests += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ImportReport(str(archive), str(root), len(index["configurations"]), added, present, manifests)


def _point_group_at(entry: Path, final: Path) -> None:
    """Rewrite the group file's absolute child paths for the entry's new home (Triton's own
    cache manager opens them by absolute path)."""
    group = group_file(entry)
    if group is None:
        return
    document = json.loads(group.read_text())
    children = document.get("child_paths", {})
    document["child_paths"] = {name: str(final / os.path.basename(path)) for name, path in children.items()}
    write_atomic(group, json.dumps(document).encode())
