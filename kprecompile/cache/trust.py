"""Whom a cache's directories let write: the trust boundary of executable code servers load.

A cache root, a read-only layer, and each of their buckets are refused, as ssh's StrictModes
and sudo refuse their files, when another user could change what is in them: writable by group
or others, or owned by a user other than this one or root. A bucket may not be a symbolic link
(a planted link would send writes, or reads, elsewhere); nor may a parent of a root be writable by
others without the sticky bit (/tmp is fine). A directory that does not exist yet is fine:
kprecompile creates it 0755. A serving process does not serve an entry whose directory or files
others could write (`others_can_write`).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from ..errors import InputError
from .files import make_directories
from .layout import Bucket, CacheLayout


def check_layout(layout: CacheLayout) -> None:
    """Refuse the layout's roots and buckets that other users could write (see module doc)."""
    for root in layout.roots:
        role = "cache root" if root == layout.root else "cache layer"
        check_parents(root, role)
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


def check_parents(path: Path, role: str) -> None:
    """Refuse `path` when one of its existing parents lets every user write without the sticky
    bit: anyone could rename the cache away and put their own in its place (/tmp, 1777, is fine;
    a group-writable parent is left to its group, as /usr/local often is)."""
    for parent in Path(os.path.realpath(path)).parents:
        try:
            status = parent.stat()
        except OSError:
            continue
        if status.st_mode & stat.S_IWOTH and not status.st_mode & stat.S_ISVTX:
            mode = oct(stat.S_IMODE(status.st_mode))
            raise InputError(
                role,
                str(path),
                f"a directory whose parents only their owners can write, not {parent} (mode {mode}, no sticky bit: "
                f"chmod go-w {parent}, or choose another directory)",
            )


def others_can_write(path: str | os.PathLike[str]) -> str | None:
    """Why another user could change what is at `path` (a link, group or other write, another
    owner), or None; an entry directory or file of a cache is not served then."""
    try:
        status = os.lstat(path)
    except OSError as error:
        return f"{os.path.basename(path)}: {error.strerror or error}"
    if stat.S_ISLNK(status.st_mode):
        return f"{os.path.basename(path)} is a symbolic link"
    # Group write is others' write unless the group is this user's own (a umask of 002 with a
    # group per user makes every directory Triton creates group-writable).
    if status.st_mode & stat.S_IWOTH or (status.st_mode & stat.S_IWGRP and status.st_gid != os.getgid()):
        return f"{os.path.basename(path)} is writable by others (mode {oct(stat.S_IMODE(status.st_mode))})"
    if status.st_uid not in (os.getuid(), 0):
        return f"{os.path.basename(path)} is owned by uid {status.st_uid}"
    return None


def make_writable_root(layout: CacheLayout) -> None:
    """The writable root and the buckets Triton and AITER would make with the umask's mode
    (group-writable under umask 002, which `check_layout` then refuses), made owner-only first."""
    for directory in (layout.root, layout.triton_dir, layout.aiter_jit_dir):
        make_directories(directory)


def check_writable(layout: CacheLayout, field: str = "--cache-dir") -> None:
    """The writable root is a directory this user can write, made if missing: found out once,
    up front (after the other inputs are checked), instead of once per kernel when the first
    write fails."""
    try:
        make_writable_root(layout)
        with tempfile.TemporaryFile(dir=layout.root, prefix=".kprecompile-probe-"):
            pass
    except OSError as error:
        raise InputError(field, str(layout.root), f"a directory this user can write ({error.strerror})") from None
