"""Whom a cache's directories let write: the trust boundary of executable code servers load.

A cache root, a read-only layer, and each of their buckets are refused, as ssh's StrictModes
and sudo refuse their files, when another user could change what is in them: writable by group
or others, or owned by a user other than this one or root. A bucket may not be a symbolic link
(a planted link would send writes, or reads, elsewhere). A directory that does not exist yet is
fine: kprecompile creates it 0755.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from ..errors import InputError
from .layout import Bucket, CacheLayout


def check_layout(layout: CacheLayout) -> None:
    """Refuse the layout's roots and buckets that other users could write (see module doc)."""
    for root in layout.roots:
        role = "cache root" if root == layout.root else "cache layer"
        check_directory(root, role, follow=True)
        for bucket in Bucket:
            check_directory(root / bucket.value, f"{role} bucket", follow=False)


def check_directory(path: Path, role: str, *, follow: bool) -> None:
    """Refuse `path` (named by its `role`) where another user could write it (module doc)."""
    try:
        status = path.stat() if follow else path.lstat()
    except FileNotFoundError:
        return
    except OSError as error:
        raise InputError(role, str(path), f"a directory kprecompile can inspect ({error.strerror})") from None
    if stat.S_ISLNK(status.st_mode):
        raise InputError(role, str(path), "a directory, not a symbolic link (remove the link)")
    if not stat.S_ISDIR(status.st_mode):
        raise InputError(role, str(path), "a directory")
    if status.st_uid not in (os.getuid(), 0):
        raise InputError(role, str(path), f"a directory owned by you or root, not by uid {status.st_uid}")
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = oct(stat.S_IMODE(status.st_mode))
        raise InputError(role, str(path), f"a directory only its owner can write, not mode {mode} (chmod go-w {path})")


def check_writable(layout: CacheLayout, field: str = "--cache-dir") -> None:
    """The writable root is a directory this user can write, made if missing: found out once,
    up front (after the other inputs are checked), instead of once per kernel when the first
    write fails."""
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=layout.root, prefix=".kprecompile-probe-"):
            pass
    except OSError as error:
        raise InputError(field, str(layout.root), f"a directory this user can write ({error.strerror})") from None
