"""Which configurations' kernels were last checked whole, remembered by the stat of their files.

A warm that finds its configuration warm checks every kernel file against the manifest's sha256
(DeepSeek-R1 TP8: 1,158 entries, 9,264 files, 132 MB). Most of the time nothing changed since
the last check. Git's index answers the same question for a work tree by each file's inode,
size, modification and change times: a write through the file system changes the change time
(`st_ctime`), which no user process can set back. So after a whole check, or after the warm
that hashed every file to write the manifest, the stat of the manifest and of every file of its
entries is remembered in `<key>.checked` beside the manifest in the writable root; a later
check whose stats are the same hashes nothing. Anything else (a file rewritten, replaced,
touched, an entry moved, another manifest under the key) checks everything again.

The memo only ever skips a check, never makes a kernel served: the serving process checks each
entry's bytes against a manifest as it loads it (`served.py`), and `verify --deep` and `export`
always hash. It is as trustworthy as the manifest beside it (one writer, the cache's owner). As with git's
index, a file rewritten in place to the same size within the file system's timestamp tick of
the stat is not noticed; the checks it skips are for damage, which the server's own check at
load catches all the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from .files import write_atomic
from .layout import GROUP_PREFIX, Bucket, CacheLayout, triton_entry_name

CHECKED_SUFFIX = ".checked"
# A memo is two sha256 digests in hex (the manifest file's stat, its entries' stats): read no
# more than that (a memo is input like any cache file).
_MEMO_CHARACTERS = 128


def checked_memo(layout: CacheLayout, manifest_key: str) -> Path:
    """Where the writable root remembers the last whole check of the configuration `manifest_key`."""
    return layout.manifests_dir / f"{manifest_key}{CHECKED_SUFFIX}"


def stat_identity(status: os.stat_result) -> tuple[int, ...]:
    """What a file's stat says of its content: any write through the file system changes it."""
    return (
        status.st_dev,
        status.st_ino,
        status.st_mode,
        status.st_size,
        status.st_mtime_ns,
        status.st_ctime_ns,
    )


def _stat_line(path: str, status: os.stat_result) -> bytes:
    return (path + "\0" + "\0".join(map(str, stat_identity(status))) + "\n").encode()


def manifest_stats(manifest_path: Path) -> str | None:
    """A digest of the manifest file's stat; None when it cannot be read."""
    try:
        status = os.stat(manifest_path, follow_symlinks=False)
    except OSError:
        return None
    return hashlib.sha256(_stat_line(str(manifest_path), status)).hexdigest()


def entries_stats(layout: CacheLayout, keys: Iterable[str]) -> tuple[str | None, dict[str, tuple[int, ...]]]:
    """One digest of the stat of every file of the entries for `keys`, each entry where Triton
    would find it (the first root whose entry has its group file), and each file's
    `stat_identity` by path; (None, ...) when one is missing (nothing to remember: the check
    says why)."""
    digest = hashlib.sha256()
    identities: dict[str, tuple[int, ...]] = {}
    triton_dirs = [str(layout.bucket(Bucket.TRITON, root)) for root in layout.roots]
    for key in keys:
        name = triton_entry_name(key)
        for triton_dir in triton_dirs:
            entry = os.path.join(triton_dir, name)
            try:
                with os.scandir(entry) as listing:
                    files = sorted(listing, key=lambda item: item.name)
            except OSError:
                continue
            if any(item.name.startswith(GROUP_PREFIX) for item in files):
                break
        else:
            return None, {}
        digest.update(f"{key}\0{entry}\n".encode())
        try:
            for item in files:
                status = item.stat(follow_symlinks=False)
                digest.update(_stat_line(item.name, status))
                identities[item.path] = stat_identity(status)
        except OSError:
            return None, {}
    return digest.hexdigest(), identities


def entries_digest(layout: CacheLayout, keys: Iterable[str]) -> str | None:
    """The digest part of `entries_stats`."""
    return entries_stats(layout, keys)[0]


def _memo(layout: CacheLayout, manifest_key: str) -> str:
    try:
        with open(checked_memo(layout, manifest_key), "rb") as memo:
            text = memo.read(_MEMO_CHARACTERS + 1).decode("ascii", "replace")
    except OSError:
        return ""
    return text if len(text) == _MEMO_CHARACTERS else ""


def manifest_checked_before(layout: CacheLayout, manifest_key: str, manifest_path: Path) -> bool:
    """Whether the manifest file is the one the last whole check read (its fields and checksum
    then checked: reading it again need not check them)."""
    stats = manifest_stats(manifest_path)
    return stats is not None and _memo(layout, manifest_key)[:64] == stats


def checked_before(layout: CacheLayout, manifest_key: str, manifest_path: Path, keys: Iterable[str]) -> bool:
    """Whether the manifest and every file of its entries (`keys`) have exactly the stats they had
    when they last passed a whole check."""
    return checked_files(layout, manifest_key, manifest_path, keys) is not None


def checked_files(
    layout: CacheLayout, manifest_key: str, manifest_path: Path, keys: Iterable[str]
) -> dict[str, tuple[int, ...]] | None:
    """Every file of the entries (`keys`) by path with its `stat_identity`, where these and the
    manifest's are the stats of the last whole check; else None."""
    memo = _memo(layout, manifest_key)
    if not memo or memo[:64] != manifest_stats(manifest_path):
        return None
    digest, identities = entries_stats(layout, keys)
    return identities if digest is not None and memo[64:] == digest else None


def remember_checked(layout: CacheLayout, manifest_key: str, manifest_path: Path, entries: str | None) -> None:
    """Remember a whole check of the manifest and of entries whose stats were `entries` before it
    (nothing where the writable root is read-only: the next check only costs more)."""
    stats = manifest_stats(manifest_path)
    if stats is not None and entries is not None:
        with contextlib.suppress(OSError):
            write_atomic(checked_memo(layout, manifest_key), (stats + entries).encode("ascii"))
