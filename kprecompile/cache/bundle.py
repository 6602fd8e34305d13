"""Bundles: a cache, or the part of it some configurations need, as one self-describing unit.

A bundle is a cache root (the same buckets: manifests, Triton entries, AITER's JIT directory, the
journals of kernels serving processes recorded) plus `bundle.json`, which lists its
configurations, the toolchain each target was built with, and every file with its size and
sha256. It serves as a read-only layer where it lies (an image layer), or travels as a `.tar.gz`
archive that `archive_install` unpacks into a cache. This module writes bundles and says what a
valid `bundle.json` is.
"""

from __future__ import annotations

import datetime
import json
import shutil
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BundleError, InputError
from .checked import CHECKED_SUFFIX
from .entries import compiled_files, driver_module_path, group_file
from .files import atomic_file, sha256_file, write_atomic
from .layout import Bucket, CacheLayout
from .manifest import HEX64, Manifest, is_file_record, locate_manifest
from .signing import FINGERPRINT, SIGNATURE_FILE, SigningKey, sign

BUNDLE_FILE = "bundle.json"
BUNDLE_SCHEMA = 1
# What a bundle may contain, besides its index.
BUNDLE_BUCKETS = (Bucket.MANIFESTS, Bucket.TRITON, Bucket.AITER_JIT, Bucket.JOURNALS)
BUNDLE_TOP_LEVEL = tuple(bucket.value for bucket in BUNDLE_BUCKETS)


@dataclass(frozen=True)
class BundleIndex:
    path: str
    configurations: tuple[dict[str, Any], ...]
    files: int
    bytes: int
    # The fingerprint of the key that signed it, or None.
    signing_key: str | None = None


def write_index(
    root: Path,
    configurations: Iterable[dict[str, Any]],
    toolchains: dict[str, dict[str, Any]],
    producer: str,
    signing_key: SigningKey | None = None,
    names: Iterable[str] | None = None,
) -> BundleIndex:
    """Write `bundle.json` for the cache at `root`: the configurations given, the toolchain of
    each target, and every file of the bundle's buckets (or only those `names`, relative) with its
    size and sha256; with
    `signing_key`, its fingerprint, and `bundle.sig` beside it (`cache/signing.py`)."""
    files = {}
    if names is None:
        names = [
            path.relative_to(root).as_posix()
            for top in BUNDLE_TOP_LEVEL
            for path in (sorted((root / top).rglob("*")) if (root / top).is_dir() else ())
            # A check's memo names this machine's inodes: it means nothing anywhere else.
            if not path.name.endswith(CHECKED_SUFFIX)
        ]
    for name in sorted(set(names)):
        path = root / name
        if path.is_file() and not path.is_symlink():
            files[name] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    configurations = tuple(configurations)
    document = {
        "schema": BUNDLE_SCHEMA,
        "kprecompile": producer,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "configurations": list(configurations),
        "toolchains": toolchains,
        "files": files,
        "signing_key": signing_key.fingerprint if signing_key is not None else None,
    }
    index = json.dumps(document, indent=1, sort_keys=True).encode()
    # The signature of an earlier index goes first: it never stands beside an index it did not sign.
    (root / SIGNATURE_FILE).unlink(missing_ok=True)
    write_atomic(root / BUNDLE_FILE, index)
    if signing_key is not None:
        write_atomic(root / SIGNATURE_FILE, sign(signing_key, index))
    return BundleIndex(
        str(root / BUNDLE_FILE),
        configurations,
        len(files),
        sum(f["size"] for f in files.values()),
        signing_key.fingerprint if signing_key is not None else None,
    )


BAKE_MARKER = ".kprecompile-bake"


def check_bake_directory(out: Path) -> None:
    """`out` is empty (or missing), or a bundle kprecompile baked there (a finished one, with its
    `bundle.json`, or one whose bake stopped, with `BAKE_MARKER`), so that a bundle lists nothing
    someone else put there. Files of AITER's JIT directory, which a bake lists without a manifest
    naming them, must be ones the earlier `bundle.json` lists, same size and sha256."""
    try:
        names = sorted(path.name for path in out.iterdir())
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise InputError("--out", str(out), "a directory") from None
    if not names:
        return
    index = out / BUNDLE_FILE
    if not (index.is_file() or (out / BAKE_MARKER).is_file()):
        raise InputError(
            "--out",
            str(out),
            f"an empty directory or a bundle kprecompile baked (it holds {names[0]}, no {BUNDLE_FILE})",
        )
    listed: dict[str, Any] = {}
    if index.is_file():
        try:
            document = json.loads(index.read_bytes())
            check_index(document)
            listed = document["files"]
        except (OSError, ValueError, RecursionError):
            raise InputError("--out", str(out), f"a bundle kprecompile baked (its {BUNDLE_FILE} is not one)") from None
    jit = out / Bucket.AITER_JIT.value
    for path in sorted(jit.rglob("*")) if jit.is_dir() else ():
        if path.is_dir() and not path.is_symlink():
            continue
        name = path.relative_to(out).as_posix()
        record = listed.get(name)
        if (
            record is None
            or path.is_symlink()
            or path.stat().st_size != record["size"]
            or sha256_file(path) != record["sha256"]
        ):
            raise InputError(
                "--out",
                str(out),
                f"an empty directory or a bundle kprecompile baked ({name} is not a file its {BUNDLE_FILE} lists: "
                "remove it, or bake into an empty directory)",
            )


def copy_configurations(layout: CacheLayout, manifests: dict[str, Manifest], out: Path) -> None:
    """Copy each manifest (by key), the kernel entries it lists and the driver modules it records
    into `out` (each checked first: `driver_module_problem`)."""
    for key, manifest in sorted(manifests.items()):
        source = locate_manifest(layout, key)
        if source is None:
            raise BundleError(f"{Bucket.MANIFESTS.value}/{key}.json", "a manifest in the cache: warm it first")
        for module_key, recorded in manifest.launchers.items():
            for name in recorded:
                path = driver_module_path(layout, module_key, name)
                if path is None:
                    raise BundleError(
                        f"{Bucket.TRITON.value}/{module_key}", f"Triton's driver module {name} in the cache"
                    )
                entry = out / Bucket.TRITON.value / path.parent.name
                entry.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, entry / name)
        for job_key in (job.key for job in manifest.jobs):
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
    """A gzip-compressed tar of the bundle's index, its signature and contents, deterministic
    (sorted, no owners)."""
    index = json.loads((bundle / BUNDLE_FILE).read_text())
    signature = [SIGNATURE_FILE] if (bundle / SIGNATURE_FILE).is_file() else []
    with atomic_file(archive) as output, tarfile.open(fileobj=output, mode="w:gz", compresslevel=6) as tar:
        for name in [BUNDLE_FILE, *signature, *sorted(index["files"])]:
            info = tar.gettarinfo(str(bundle / name), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with (bundle / name).open("rb") as file:
                tar.addfile(info, file)


# A toolchain field is a version, a path or a hash: far below this.
_MAX_TOOLCHAIN_VALUE = 4096
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def check_index(document: Any) -> None:
    """Every field of `bundle.json` that import relies on, as `write_index` writes it, or
    ValueError naming the first field that is not."""
    if not isinstance(document, dict):
        raise ValueError(f"a JSON {json_type(document)}, not an object")
    schema = document.get("schema")
    if type(schema) is not int or schema != BUNDLE_SCHEMA:
        raise ValueError(f"schema is {schema!r}, expected {BUNDLE_SCHEMA}")
    configurations = document.get("configurations")
    if not isinstance(configurations, list):
        raise ValueError(f"configurations is a JSON {json_type(configurations)}, expected an array")
    for number, configuration in enumerate(configurations):
        if not isinstance(configuration, dict):
            raise ValueError(f"configurations[{number}] is a JSON {json_type(configuration)}, expected an object")
        manifest = configuration.get("manifest")
        if not isinstance(manifest, str) or not HEX64.fullmatch(manifest):
            raise ValueError(f"configurations[{number}].manifest is {_short(manifest)}, expected 64 hex digits")
        if not isinstance(configuration.get("target"), str):
            raise ValueError(
                f"configurations[{number}].target is {_short(configuration.get('target'))}, expected a target name"
            )
    toolchains = document.get("toolchains")
    if not isinstance(toolchains, dict):
        raise ValueError(f"toolchains is a JSON {json_type(toolchains)}, expected an object")
    for target, fields in toolchains.items():
        if not isinstance(fields, dict):
            raise ValueError(f"toolchains[{target[:80]!r}] is a JSON {json_type(fields)}, expected an object")
        for name, value in fields.items():
            if not (value is None or isinstance(value, str) and len(value) <= _MAX_TOOLCHAIN_VALUE):
                raise ValueError(f"toolchains[{target[:80]!r}].{name[:80]} is {_short(value)}, expected a string")
    signing_key = document.get("signing_key")
    if signing_key is not None and not (isinstance(signing_key, str) and FINGERPRINT.fullmatch(signing_key)):
        raise ValueError(f"signing_key is {_short(signing_key)}, expected a key fingerprint (SHA256:...) or null")
    files = document.get("files")
    if not isinstance(files, dict):
        raise ValueError(f"files is a JSON {json_type(files)}, expected an object")
    for name, record in files.items():
        if not is_file_record(record):
            raise ValueError(f"files[{name[:80]!r}] is {_short(record)}, expected a size and a sha256")


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str | int | float | bool | type(None)) else f"a JSON {json_type(value)}"
    return text if len(text) <= 80 else text[:77] + "..."
