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


def _stat_line(path: str, status: os.stat_result) -> bytes:
    return (
        f"{path}\0{status.st_dev}\0{status.st_ino}\0{status.st_mode}\0{status.st_size}\0"
        f"{status.st_mtime_ns}\0{status.st_ctime_ns}\n"
    ).encode()


def manifest_stats(manifest_path: Path) -> str | None:
    """A digest of the manifest file's stat; None when it cannot be read."""
    try:
        status = os.stat(manifest_path, follow_symlinks=False)
    except OSError:
        return None
    return hashlib.sha256(_stat_line(str(manifest_path), status)).hexdigest()


def entries_digest(layout: CacheLayout, keys: Iterable[str]) -> str | None:
    """One digest of the stat of every file of the entries for `keys`, each entry where Triton
    would find it (the first root whose entry has its group file); None when one is missing
    (nothing to remember: the check says why)."""
    digest = hashlib.sha256()
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
            return None
        digest.update(f"{key}\0{entry}\n".encode())
        try:
            for item in files:
                digest.update(_stat_line(item.name, item.stat(follow_symlinks=False)))
        except OSError:
            return None
    return digest.hexdigest()


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
    memo = _memo(layout, manifest_key)
    if not memo or memo[:64] != manifest_stats(manifest_path):
        return False
    return memo[64:] == entries_digest(layout, keys)


def remember_checked(layout: CacheLayout, manifest_key: str, manifest_path: Path, entries: str | None) -> None:
    """Remember a whole check of the manifest and of entries whose stats were `entries` before it
    (nothing where the writable root is read-only: the next check only costs more)."""
    stats = manifest_stats(manifest_path)
    if stats is not None and entries is not None:
        with contextlib.suppress(OSError):
            write_atomic(checked_memo(layout, manifest_key), (stats + entries).encode("ascii"))
