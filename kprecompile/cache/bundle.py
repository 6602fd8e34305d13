"""Bundles: a cache, or the part of it some configurations need, as one self-describing unit.

A bundle is a cache root (the same layout: `manifests-v1/`, `triton-v1/`, `aiter-jit-v1/`)
plus `bundle.json`, which lists its configurations, the toolchain each target was built with,
and every file with its size and sha256. It serves as a read-only layer where it lies (an
image layer), or travels as a `.tar.gz` archive that `import_archive` unpacks into a cache.

Importing validates everything before writing anything: member paths (absolute, escaping the
destination), member types (links, devices, FIFOs), the index (every file listed, sizes and
checksums), and the toolchain (a bundle for another Triton build or install path can never be
served here). Then it stages inside the destination and moves entries into place, manifests
last; a failure leaves the destination as it was.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import tarfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .. import __version__
from ..errors import InputError
from .entries import compiled_files
from .files import write_atomic
from .layout import CacheLayout
from .manifest import read_manifest
from .toolchain import current_toolchain

BUNDLE_FILE = "bundle.json"
BUNDLE_SCHEMA = 1
# What a bundle may contain, besides its index.
_TOP_LEVEL = ("manifests-v1", "triton-v1", "aiter-jit-v1")
# The toolchain fields that must match for a bundle's binaries to be served here.
_TOOLCHAIN_MUST_MATCH = ("triton_key", "triton_path", "python", "ptxas")


class BundleError(InputError):
    """A bundle or archive that cannot be used here: names the member and the reason."""

    def __init__(self, member: str, reason: str):
        self.member, self.reason = member, reason
        ValueError.__init__(self, f"archive member {member!r}: {reason}")

    def __reduce__(self):
        return type(self), (self.member, self.reason)


@dataclass(frozen=True)
class BundleIndex:
    path: str
    configurations: tuple[dict[str, Any], ...]
    files: int
    bytes: int


def _sha256(data: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for block in data:
        digest.update(block)
    return digest.hexdigest()


def _file_blocks(path: Path) -> Iterable[bytes]:
    with path.open("rb") as file:
        yield from iter(lambda: file.read(1 << 20), b"")


def write_index(root: Path, manifest_keys: Iterable[str]) -> BundleIndex:
    """Write `bundle.json` for the cache at `root`, describing the named manifests."""
    layout = CacheLayout(root)
    configurations, toolchains = [], {}
    for key in sorted(set(manifest_keys)):
        manifest = read_manifest(layout, key)
        if manifest is None:
            raise BundleError(f"manifests-v1/{key}.json", "missing or unreadable")
        parts = manifest.parts
        toolchains[parts["target"]] = parts["toolchain"]
        configurations.append({"manifest": key, "target": parts["target"], "model_digest": parts["model_digest"],
                               "serving": parts["serving"], "kernels": len(manifest.jobs)})  # fmt: skip
    files = {}
    for top in _TOP_LEVEL:
        for path in sorted((root / top).rglob("*")) if (root / top).is_dir() else ():
            if path.is_file() and not path.is_symlink():
                files[path.relative_to(root).as_posix()] = {"sha256": _sha256(_file_blocks(path)),
                                                            "size": path.stat().st_size}  # fmt: skip
    document = {
        "schema": BUNDLE_SCHEMA,
        "kprecompile": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "configurations": configurations,
        "toolchains": toolchains,
        "files": files,
    }
    write_atomic(root / BUNDLE_FILE, json.dumps(document, indent=1, sort_keys=True).encode())
    return BundleIndex(
        str(root / BUNDLE_FILE), tuple(configurations), len(files), sum(f["size"] for f in files.values())
    )


def export_bundle(layout: CacheLayout, manifest_keys: Iterable[str], out: Path) -> BundleIndex:
    """Copy the named manifests and every kernel entry they list from `layout` into `out`."""
    keys = sorted(set(manifest_keys))
    for key in keys:
        manifest = read_manifest(layout, key)
        if manifest is None:
            raise BundleError(f"manifests-v1/{key}.json", "not in the cache: warm the configuration first")
        for job in manifest.jobs:
            files = compiled_files(layout, job.key)
            if files is None:
                raise BundleError(job.key, f"kernel {job.kernel_name} is not in the cache: warm first")
            entry = out / "triton-v1" / files[0].parent.name
            entry.mkdir(parents=True, exist_ok=True)
            for path in files:
                shutil.copy2(path, entry / path.name)
            group = _group_file(files[0].parent)
            shutil.copy2(group, entry / group.name)
        source = layout.find_manifest(key)
        (out / "manifests-v1").mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, out / "manifests-v1" / source.name)
    return write_index(out, keys)


def _group_file(entry: Path) -> Path:
    return next(path for path in entry.iterdir() if path.name.startswith("__grp__"))


def write_archive(bundle: Path, archive: Path) -> None:
    """A gzip-compressed tar of the bundle's index and contents, deterministic (sorted, no owners)."""
    temporary = archive.with_name(f".{archive.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tarfile.open(temporary, "w:gz", compresslevel=6) as tar:
            index = json.loads((bundle / BUNDLE_FILE).read_text())
            for name in [BUNDLE_FILE, *sorted(index["files"])]:
                info = tar.gettarinfo(str(bundle / name), arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                with (bundle / name).open("rb") as file:
                    tar.addfile(info, file)
        os.replace(temporary, archive)
    finally:
        temporary.unlink(missing_ok=True)


@dataclass(frozen=True)
class ImportReport:
    archive: str
    cache_dir: str
    configurations: int
    entries_added: int
    entries_present: int
    manifests: int


def import_archive(archive: Path, layout: CacheLayout) -> ImportReport:
    """Validate all of `archive`, then add it to the cache at `layout`; all or nothing."""
    try:
        tar = tarfile.open(archive, "r:*")
    except (OSError, tarfile.TarError) as error:
        reason = (str(error).splitlines() or [type(error).__name__])[0].rstrip(":")
        raise InputError("archive", str(archive), f"a readable .tar.gz bundle ({reason})") from None
    with tar:
        members = tar.getmembers()
        index = _validate(tar, members)
        return _install(tar, members, index, archive, layout)


def _validate(tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> dict[str, Any]:
    for member in members:
        _check_member(member)
    by_name = {member.name: member for member in members if member.isfile()}
    if BUNDLE_FILE not in by_name:
        raise BundleError(BUNDLE_FILE, "missing: not a kprecompile bundle")
    try:
        index = json.loads(tar.extractfile(by_name[BUNDLE_FILE]).read())
        files, toolchains = index["files"], index["toolchains"]
        if index["schema"] != BUNDLE_SCHEMA:
            raise ValueError(f"schema {index['schema']}, expected {BUNDLE_SCHEMA}")
    except (ValueError, KeyError, TypeError) as error:
        raise BundleError(BUNDLE_FILE, f"not a valid index ({error})") from None
    for name, member in by_name.items():
        if name == BUNDLE_FILE:
            continue
        expected = files.get(name)
        if expected is None:
            raise BundleError(name, "not listed in bundle.json")
        if member.size != expected["size"]:
            raise BundleError(name, f"{member.size} bytes, bundle.json says {expected['size']}")
        if _sha256(_member_blocks(tar, member)) != expected["sha256"]:
            raise BundleError(name, "sha256 does not match bundle.json")
    for name in files:
        if name not in by_name:
            raise BundleError(name, "listed in bundle.json but missing from the archive")
    _check_toolchains(toolchains)
    return index


def _member_blocks(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Iterable[bytes]:
    stream = tar.extractfile(member)
    yield from iter(lambda: stream.read(1 << 20), b"")


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    path = PurePosixPath(name)
    if not name or name.startswith(("/", "\\")) or path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise BundleError(name, "absolute path")
    if ".." in path.parts:
        raise BundleError(name, "path escapes the destination")
    if member.issym() or member.islnk():
        raise BundleError(name, f"link to {member.linkname!r}: bundles hold regular files only")
    if not (member.isfile() or member.isdir()):
        raise BundleError(name, "device, FIFO or other special file: bundles hold regular files only")
    if name != BUNDLE_FILE and path.parts[0] not in _TOP_LEVEL:
        raise BundleError(name, f"outside the bundle layout ({', '.join(_TOP_LEVEL)}, {BUNDLE_FILE})")


def _check_toolchains(toolchains: dict[str, dict[str, Any]]) -> None:
    from ..targets import TARGETS

    for target_name, baked in toolchains.items():
        target = TARGETS.get(target_name)
        if target is None:
            raise BundleError(BUNDLE_FILE, f"unknown target {target_name!r}")
        here = current_toolchain(None, target).as_dict()
        for field in _TOOLCHAIN_MUST_MATCH:
            if baked.get(field) != here.get(field):
                if field in ("triton_key", "triton_path"):
                    reason = (
                        f"{target_name} was baked with Triton key {baked.get('triton_key')} at "
                        f"{baked.get('triton_path')}; this machine has {here.get('triton_key')} at "
                        f"{here.get('triton_path')}"
                    )
                else:
                    reason = (
                        f"{target_name} was baked with {field} {baked.get(field)!r}; "
                        f"this machine has {here.get(field)!r}"
                    )
                raise BundleError(BUNDLE_FILE, f"toolchain mismatch: {reason}")


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
        for entry in sorted((staging / "triton-v1").iterdir()) if (staging / "triton-v1").is_dir() else ():
            final = layout.triton_dir / entry.name
            if final.exists():
                present += 1
                continue
            _point_group_at(entry, final)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(entry, final)
            added += 1
        jit = staging / "aiter-jit-v1"
        if jit.is_dir():
            shutil.copytree(jit, layout.aiter_jit_dir, dirs_exist_ok=True)
        for manifest in (
            sorted((staging / "manifests-v1").glob("*.json")) if (staging / "manifests-v1").is_dir() else ()
        ):
            layout.manifests_dir.mkdir(parents=True, exist_ok=True)
            os.replace(manifest, layout.manifests_dir / manifest.name)
            manifests += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ImportReport(str(archive), str(root), len(index["configurations"]), added, present, manifests)


def _point_group_at(entry: Path, final: Path) -> None:
    """Rewrite the group file's absolute child paths for the entry's new home (Triton's own
    cache manager opens them by absolute path)."""
    for group in entry.glob("__grp__*"):
        document = json.loads(group.read_text())
        children = document.get("child_paths", {})
        document["child_paths"] = {name: str(final / os.path.basename(path)) for name, path in children.items()}
        group.write_text(json.dumps(document))
