"""Reading a bundle archive and checking all of it, before anything is written.

Each member is checked as its header is read: a relative path inside the destination, named
once after normalizing (`E/./x` is `E/x`), shaped as its bucket's files are
(`manifests-v8/<key>.json`, `triton-v1/<entry>/<file>`, `aiter-jit-v1/<path>`,
`journals-v1/<key>.jsonl`), a regular file (no link, device or sparse file), within the size
bounds (per member, in total, for `bundle.json`), then its content is hashed. Then `bundle.json`
(every field's type), each manifest (as `read_manifest` checks it), each Triton group file, the
content against the index, and the manifests against the entries they need. An archive that
ends early says so. `archive_install.py` writes what passed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import json
import logging
import lzma
import os
import posixpath
import re
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BundleError, InputError
from . import journal as journals
from .bundle import BUNDLE_FILE, BUNDLE_TOP_LEVEL, check_index
from .files import sha256_file
from .layout import GROUP_PREFIX, Bucket, CacheLayout, entry_key, triton_entry_name
from .manifest import FILE_NAME, MAX_MANIFEST_BYTES, Manifest, parse_manifest
from .signing import MAX_SIGNATURE_BYTES, SIGNATURE_FILE, signature_problem

logger = logging.getLogger(__name__)

_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class ImportLimits:
    """What one archive may hold. A whole DeepSeek-R1 TP8 configuration is 1,158 kernels in about
    10,000 files and 159 MB, its `bundle.json` about 2 MB: these leave room for many of them
    while an archive bomb (a few KB that would write GBs) is refused before anything is written."""

    member_bytes: int = 1 << 30
    total_bytes: int = 32 << 30
    index_bytes: int = 64 << 20
    members: int = 500_000
    # Unpacked bytes per byte of the archive file: a bake's archive unpacks to about 6 times its
    # size; gzip reaches 1,000 on zeros. Archives below `ratio_floor_bytes` unpacked are not held to it.
    ratio: int = 100
    ratio_floor_bytes: int = 16 << 20
    # Journals: what serving processes recorded, a few records a configuration. Their bytes and
    # records in all, and the bytes of what is kept in memory to be parsed (index, manifests,
    # group files): import's memory does not grow with the number of members.
    journal_bytes: int = 64 << 20
    journal_records: int = 16_384
    document_bytes: int = 512 << 20


DEFAULT_LIMITS = ImportLimits()


@dataclass(frozen=True)
class ArchiveTrust:
    """Whose archives import accepts: those signed by one of `keys` (fingerprint -> ed25519 public
    key); any other only with `allow_unsigned` (`--allow-unsigned`), with a warning."""

    keys: dict[str, Any] = field(default_factory=dict)
    allow_unsigned: bool = False


_JIT_PART = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_.+\-]{0,254}")


_JIT_DEPTH = 16


_GROUP_BYTES = 1 << 20


_SHAPES = (
    f"{BUNDLE_FILE}, {SIGNATURE_FILE}, {Bucket.MANIFESTS.value}/<64 hex digits>.json, "
    f"{Bucket.TRITON.value}/<entry>/<file name>, "
    f"{Bucket.AITER_JIT.value}/<path> or {Bucket.JOURNALS.value}/<64 hex digits>.jsonl"
)


@dataclass
class CheckedArchive:
    """What reading the archive found: each file member by normalized name, its sha256, and the
    checked documents."""

    members: dict[str, tarfile.TarInfo] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    # Contents kept for parsing: bundle.json, manifests, group files (each bounded).
    documents: dict[str, bytes] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)
    manifests: dict[str, Manifest] = field(default_factory=dict)
    # Triton entry name -> {file name: member name}; and the names its group file lists.
    entries: dict[str, dict[str, str]] = field(default_factory=dict)
    groups: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)
    jit_files: list[str] = field(default_factory=list)
    # Journal key -> its records, damaged lines left out.
    journals: dict[str, dict[str, journals.Record]] = field(default_factory=dict)
    # The fingerprint of the trusted key whose signature was checked; None when accepted unsigned.
    signing_key: str | None = None


def _truncated(archive: Path) -> InputError:
    return InputError("archive", str(archive), "a complete archive: it ends early (a truncated download or copy?)")


@contextlib.contextmanager
def reading(archive: Path) -> Iterator[None]:
    """Say what is wrong with an archive that ends early or is corrupt, on one line (a truncated
    gzip stream raises EOFError, which click would report as `aborted`)."""
    try:
        yield
    except EOFError:
        raise _truncated(archive) from None
    except tarfile.ReadError as error:
        if "unexpected end of data" in str(error):
            raise _truncated(archive) from None
        raise InputError("archive", str(archive), f"an intact archive ({str(error)[:200]})") from None
    except (zlib.error, gzip.BadGzipFile, lzma.LZMAError, tarfile.TarError) as error:
        raise InputError("archive", str(archive), f"an intact archive ({str(error)[:200]})") from None


def read_archive(
    tar: tarfile.TarFile,
    limits: ImportLimits,
    trust: ArchiveTrust,
    archive: Path,
    journal_key: Callable[[dict[str, Any]], str],
) -> CheckedArchive:
    """Read and check all of `archive` (module doc); `journal_key`: the key of the journal of the
    configuration with these manifest parts (the recipe lives above storage)."""
    bundle = CheckedArchive()
    total = count = journal_bytes = document_bytes = 0
    parsers: dict[str, journals.JournalParser] = {}
    expansion = max(limits.ratio * archive.stat().st_size, limits.ratio_floor_bytes)
    while (member := tar.next()) is not None:
        count += 1
        if count > limits.members:
            raise BundleError(member.name[:300], f"an archive of at most {limits.members:,} members")
        name = _check_member(member)
        if name is None:
            continue
        if name in bundle.members:
            raise BundleError(member.name[:300], f"one member per path: {name} is in the archive twice")
        bound = limits.index_bytes if name == BUNDLE_FILE else limits.member_bytes
        if member.size > bound:
            raise BundleError(name, f"a file of at most {bound:,} bytes, not {member.size:,}")
        total += member.size
        if total > limits.total_bytes:
            raise BundleError(name, f"an archive of at most {limits.total_bytes:,} bytes unpacked")
        if total > expansion:
            raise BundleError(
                name,
                f"an archive that unpacks to at most {limits.ratio} times its size ({expansion:,} bytes), "
                f"not {total:,} bytes so far (an archive bomb?)",
            )
        keep = _kept_bytes(name, limits)
        if keep is not None and member.size > keep:
            raise BundleError(name, f"a file of at most {keep:,} bytes, not {member.size:,}")
        parser = None
        if name.startswith(Bucket.JOURNALS.value + "/"):
            journal_bytes += member.size
            if journal_bytes > limits.journal_bytes:
                raise BundleError(name, f"journals of at most {limits.journal_bytes:,} bytes in all")
            parser = parsers[name] = journals.JournalParser()
            keep = None
        elif keep is not None:
            document_bytes += member.size
            if document_bytes > limits.document_bytes:
                raise BundleError(
                    name, f"an index, manifests and group files of at most {limits.document_bytes:,} bytes in all"
                )
        bundle.members[name] = member
        bundle.digests[name] = _hash_member(tar, member, bundle.documents if keep is not None else None, name, parser)
        if parser is not None and sum(parser.count for parser in parsers.values()) > limits.journal_records:
            raise BundleError(name, f"journals of at most {limits.journal_records:,} records in all")
    _check_end(tar)
    _check_index(bundle)
    _check_signature(bundle, trust, archive)
    _check_entries(bundle)
    _check_manifests(bundle)
    _read_journals(bundle, parsers, journal_key)
    return bundle


def _check_member(member: tarfile.TarInfo) -> str | None:
    """The member's normalized name, None for a directory; BundleError when it may not be here."""
    name = member.name if len(member.name) <= 300 else member.name[:297] + "..."
    if not name or name.startswith(("/", "\\")) or posixpath.isabs(name) or (len(name) > 1 and name[1] == ":"):
        raise BundleError(name, "a relative path")
    if ".." in name.split("/"):
        raise BundleError(name, "a path inside the destination")
    if member.issym() or member.islnk():
        raise BundleError(name, f"a regular file, not a link to {member.linkname!r}")
    if member.issparse() or member.type == tarfile.GNUTYPE_SPARSE:
        raise BundleError(name, "a regular file, not a sparse one (kprecompile never writes those)")
    if not (member.isfile() or member.isdir()):
        raise BundleError(name, "a regular file, not a device, FIFO or other special file")
    if member.size < 0:
        raise BundleError(name, "a file with a size")
    normal = posixpath.normpath(member.name)
    top = normal.split("/")[0]
    if member.isdir():
        if normal != "." and top not in BUNDLE_TOP_LEVEL:
            raise BundleError(name, f"a path under {', '.join(BUNDLE_TOP_LEVEL)}, or {BUNDLE_FILE}")
        return None
    if normal not in (BUNDLE_FILE, SIGNATURE_FILE) and top not in BUNDLE_TOP_LEVEL:
        raise BundleError(name, f"a path under {', '.join(BUNDLE_TOP_LEVEL)}, or {BUNDLE_FILE}")
    if not _is_bundle_path(normal):
        raise BundleError(name, f"a path shaped like a bundle's files: {_SHAPES}")
    return normal


def _is_bundle_path(name: str) -> bool:
    parts = name.split("/")
    if name in (BUNDLE_FILE, SIGNATURE_FILE):
        return True
    if parts[0] == Bucket.MANIFESTS.value:
        return len(parts) == 2 and re.fullmatch(r"[0-9a-f]{64}\.json", parts[1]) is not None
    if parts[0] == Bucket.TRITON.value:
        return len(parts) == 3 and entry_key(parts[1]) is not None and FILE_NAME.fullmatch(parts[2]) is not None
    if parts[0] == Bucket.JOURNALS.value:
        return len(parts) == 2 and re.fullmatch(r"[0-9a-f]{64}\.jsonl", parts[1]) is not None
    return 1 < len(parts) <= _JIT_DEPTH + 1 and all(_JIT_PART.fullmatch(part) for part in parts[1:])


def _kept_bytes(name: str, limits: ImportLimits) -> int | None:
    """The size up to which a member is kept in memory to be parsed; None for one only hashed."""
    if name == BUNDLE_FILE:
        return limits.index_bytes
    if name == SIGNATURE_FILE:
        return MAX_SIGNATURE_BYTES
    if name.startswith(Bucket.MANIFESTS.value + "/"):
        return MAX_MANIFEST_BYTES
    if name.startswith(Bucket.JOURNALS.value + "/"):
        return journals.MAX_JOURNAL_BYTES
    if name.startswith(Bucket.TRITON.value + "/") and name.rpartition("/")[2].startswith(GROUP_PREFIX):
        return _GROUP_BYTES
    return None


def _hash_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    keep: dict[str, bytes] | None,
    name: str,
    parser: journals.JournalParser | None = None,
) -> str:
    """The member's sha256; its content kept in `keep` or fed to a journal `parser` on the way."""
    import hashlib

    digest = hashlib.sha256()
    kept = []
    for block in member_blocks(tar, member):
        digest.update(block)
        if keep is not None:
            kept.append(block)
        if parser is not None:
            parser.feed(block)
    if keep is not None:
        keep[name] = b"".join(kept)
    return digest.hexdigest()


def member_blocks(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[bytes]:
    stream = tar.extractfile(member)
    yield from iter(lambda: stream.read(_BLOCK_BYTES), b"")


def _check_end(tar: tarfile.TarFile) -> None:
    """tarfile ends its listing quietly at a header cut short or unreadable: the end-of-archive
    block (zeros) must follow the last member, or the archive is truncated or damaged."""
    stream = tar.fileobj
    stream.seek(tar.offset)
    block = stream.read(tarfile.BLOCKSIZE)
    if len(block) < tarfile.BLOCKSIZE:
        raise EOFError
    if block.count(0) != tarfile.BLOCKSIZE:
        raise tarfile.ReadError(f"an unreadable member header at byte {tar.offset:,}")


def _check_index(bundle: CheckedArchive) -> None:
    data = bundle.documents.get(BUNDLE_FILE)
    if data is None:
        raise BundleError(BUNDLE_FILE, "an index of the bundle: this is not a kprecompile bundle")
    try:
        index = json.loads(data)
        check_index(index)
    except RecursionError:
        raise BundleError(BUNDLE_FILE, "a valid bundle index (nested too deeply)") from None
    except ValueError as error:
        raise BundleError(BUNDLE_FILE, f"a valid bundle index ({str(error)[:300]})") from None
    files = index["files"]
    for name, member in bundle.members.items():
        if name in (BUNDLE_FILE, SIGNATURE_FILE):
            continue
        expected = files.get(name)
        if expected is None:
            raise BundleError(name, "a file listed in bundle.json")
        if member.size != expected["size"]:
            raise BundleError(name, f"{expected['size']} bytes as bundle.json lists (it has {member.size})")
        if bundle.digests[name] != expected["sha256"]:
            raise BundleError(name, "the sha256 bundle.json lists")
    for name in files:
        if name not in bundle.members:
            raise BundleError(name[:300], "in the archive, as bundle.json lists it")
    bundle.index = index


def _check_signature(bundle: CheckedArchive, trust: ArchiveTrust, archive: Path) -> None:
    """The archive is signed by a trusted key (its `bundle.json`, which lists every other member's
    size and sha256), or refused unless `trust.allow_unsigned`."""
    fingerprint = bundle.index.get("signing_key")
    problem = signature_problem(
        bundle.documents[BUNDLE_FILE], fingerprint, bundle.documents.get(SIGNATURE_FILE), trust.keys
    )
    if problem is None:
        bundle.signing_key = fingerprint
        return
    if not trust.allow_unsigned:
        raise InputError(
            "archive",
            str(archive),
            f"an archive signed by a trusted key: {problem} (trust its signer's public key with --trusted-key or "
            "KPRECOMPILE_TRUSTED_KEYS, or import it anyway with --allow-unsigned)",
        )
    logger.warning("importing %s without a trusted signature (--allow-unsigned): %s", archive, problem)


def _check_entries(bundle: CheckedArchive) -> None:
    """Group the Triton files by entry; each group file must name the other files of its entry,
    and only those (nothing rides along in a kernel's entry: a module there would be loaded)."""
    for name in bundle.members:
        parts = name.split("/")
        if parts[0] == Bucket.TRITON.value:
            bundle.entries.setdefault(parts[1], {})[parts[2]] = name
        elif parts[0] == Bucket.AITER_JIT.value:
            bundle.jit_files.append(name)
    for entry, files in bundle.entries.items():
        groups = [file_name for file_name in files if file_name.startswith(GROUP_PREFIX)]
        if len(groups) > 1:
            raise BundleError(f"{Bucket.TRITON.value}/{entry}/", f"one group file per entry, not {len(groups)}")
        if groups:
            member = files[groups[0]]
            children = _group_children(bundle.documents[member])
            if children is None or not children or children != set(files) - {groups[0]}:
                raise BundleError(
                    member, "a Triton group file: an object whose child_paths names every other file of its entry"
                )
            bundle.groups[entry] = (groups[0], children)


def _group_children(data: bytes) -> frozenset[str] | None:
    """The file names a group file lists, or None when it is not a group file."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return None
    children = document.get("child_paths") if isinstance(document, dict) else None
    if not isinstance(children, dict):
        return None
    names = set()
    for name, path in children.items():
        if not isinstance(path, str) or os.path.basename(path) != name or not FILE_NAME.fullmatch(name):
            return None
        names.add(name)
    return frozenset(names)


def _check_manifests(bundle: CheckedArchive) -> None:
    """Each manifest as `read_manifest` checks it, its kernels' entries and driver modules in the
    bundle with the files it records, no other entry without a group file; each configuration of
    the index names one of them."""
    files = bundle.index["files"]
    modules: set[str] = set()
    for name, data in bundle.documents.items():
        if not name.startswith(Bucket.MANIFESTS.value + "/"):
            continue
        key = name.rpartition("/")[2].removesuffix(".json")
        try:
            manifest = parse_manifest(data, key)
        except ValueError as error:
            raise BundleError(name, f"a valid manifest ({str(error)[:300]})") from None
        for job in manifest.jobs:
            entry = triton_entry_name(job.key)
            recorded = manifest.artifacts.get(job.key, {})
            group = bundle.groups.get(entry)
            if entry not in bundle.entries or group is None or set(recorded) != group[1]:
                raise BundleError(
                    name,
                    f"kernel entries in the bundle for its jobs ({Bucket.TRITON.value}/{entry}/ "
                    "is missing or its group file lists other files)",
                )
            for file_name, record in recorded.items():
                listed = files.get(f"{Bucket.TRITON.value}/{entry}/{file_name}")
                if listed != record:
                    raise BundleError(
                        name,
                        f"files in the bundle as it records them ({Bucket.TRITON.value}/{entry}/{file_name} differs)",
                    )
        for launcher_key, recorded in manifest.launchers.items():
            entry = triton_entry_name(launcher_key)
            if set(bundle.entries.get(entry, {})) != set(recorded) or entry in bundle.groups:
                raise BundleError(
                    name, f"Triton's driver modules in the bundle as it records them ({Bucket.TRITON.value}/{entry}/)"
                )
            for file_name, record in recorded.items():
                if files.get(f"{Bucket.TRITON.value}/{entry}/{file_name}") != record:
                    raise BundleError(
                        name,
                        f"files in the bundle as it records them ({Bucket.TRITON.value}/{entry}/{file_name} differs)",
                    )
            modules.add(entry)
        if manifest.launchers and bundle.signing_key is None:
            raise BundleError(
                name,
                "Triton's driver modules (host code a server loads) only in an archive signed by a trusted key: "
                "not imported with --allow-unsigned",
            )
        bundle.manifests[key] = manifest
    # An entry without a group file is a driver module Triton would load: only one a manifest records.
    for entry in bundle.entries:
        if entry not in bundle.groups and entry not in modules:
            raise BundleError(
                f"{Bucket.TRITON.value}/{entry}/",
                "a kernel entry with its group file, or a driver module a manifest of the bundle records",
            )
    for number, configuration in enumerate(bundle.index["configurations"]):
        if configuration["manifest"] not in bundle.manifests:
            raise BundleError(
                BUNDLE_FILE,
                f"configurations naming manifests in the bundle (configurations[{number}] "
                f"names {configuration['manifest']})",
            )


def _read_journals(
    bundle: CheckedArchive, parsers: dict[str, journals.JournalParser], journal_key: Callable[[dict[str, Any]], str]
) -> None:
    """Each journal's records, read while hashing; a damaged line is skipped (one warning per
    journal), never fatal: records only add work to a later warm, which checks each one again
    before compiling it. A journal must be one of a configuration the bundle lists: recorded
    kernels are replayed under that configuration's key. Every record is marked imported, whatever
    its line says: replay trusts an imported record to name only kernels of the libraries
    kprecompile traces (`warmup/replay.py`)."""
    listed = {
        journal_key(bundle.manifests[configuration["manifest"]].parts)
        for configuration in bundle.index["configurations"]
    }
    for name, parser in parsers.items():
        key = name.rpartition("/")[2].removesuffix(".jsonl")
        if key not in listed:
            raise BundleError(name, "the journal of a configuration bundle.json lists")
        contents = parser.contents()
        contents.warn(Path(name))
        bundle.journals[key] = {
            record_key: dataclasses.replace(record, origin="imported")
            for record_key, record in contents.records.items()
        }


def same_file(path: Path, digest: str, size: int) -> bool | None:
    """Whether `path` is a regular file with this content; None when there is nothing at `path`."""
    try:
        status = path.lstat()
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return False  # a file where one of its directories belongs
    return stat.S_ISREG(status.st_mode) and status.st_size == size and sha256_file(path) == digest


def check_jit_files(bundle: CheckedArchive, layout: CacheLayout) -> None:
    """AITER loads modules from its JIT directory: a file there is never overwritten silently."""
    for name in bundle.jit_files:
        record = bundle.index["files"][name]
        path = layout.root / name
        if same_file(path, record["sha256"], record["size"]) is False:
            raise BundleError(
                name,
                f"a file the cache does not hold with other content ({path} differs: remove it to take the bundle's)",
            )


def check_free_space(bundle: CheckedArchive, root: Path) -> None:
    needed = sum(member.size for member in bundle.members.values())
    existing = next(parent for parent in (root, *root.parents) if parent.exists())
    free = shutil.disk_usage(existing).free
    if needed > free:
        raise OSError(errno.ENOSPC, f"the bundle needs {needed:,} bytes, {free:,} are free", str(root))
