"""Reading Triton's cache entries without Triton: is a key compiled, what is in it, is it intact."""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .checked import stat_identity
from .files import sha256_file
from .layout import GROUP_PREFIX, Bucket, CacheLayout, triton_entry_name

# Why an entry would not be served as its manifest recorded it.
ProblemKind = Literal[
    "not_in_cache", "group_mismatch", "file_missing", "not_a_file", "size_mismatch", "checksum_mismatch"
]


@dataclass(frozen=True)
class EntryProblem:
    kind: ProblemKind
    # The same, said for a reader: which file and what is wrong with it.
    message: str


def read_group(directory: str | os.PathLike[str], group_name: str) -> dict[str, str] | None:
    """What a Triton group file maps, each child name to the file of that name in `directory`;
    None when it is not a group file or maps a name to another file.

    Triton writes each child under its own name (`k.hsaco` -> `<entry>/k.hsaco`) and opens what
    the group file names: a file swapped under another name (the binary's path given as the
    IR's) would hand Triton the wrong bytes while every file still matches its checksum.
    """
    import json

    try:
        with open(os.path.join(directory, group_name), "rb") as group:
            children = json.loads(group.read())["child_paths"]
        mapping = {name: os.path.join(directory, os.path.basename(path)) for name, path in children.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    named_as_written = all(os.path.basename(path) == name not in ("", ".", "..") for name, path in children.items())
    return mapping if mapping and named_as_written else None


def group_children(directory: str | os.PathLike[str], group_name: str) -> dict[str, str] | None:
    """The files a Triton group file names, found by name in its own directory, when all exist.

    Triton records them by absolute path at write time; looking them up beside the group file
    is what lets a moved cache (a bundle, an image layer) be read. Used here and by the
    layered Triton cache manager.
    """
    found = read_group(directory, group_name)
    if found is None:
        return None
    # A symbolic link is never served: it could point anywhere after the entry was checked.
    return found if all(os.path.isfile(path) and not os.path.islink(path) for path in found.values()) else None


def group_file(entry: Path) -> Path | None:
    """The entry's group file, if it has one."""
    try:
        return next((path for path in entry.iterdir() if path.name.startswith(GROUP_PREFIX)), None)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _complete_entry(
    layout: CacheLayout, key: str, stat_group: bool = False
) -> tuple[Path, os.stat_result | None, list[Path]] | None:
    """The group file of a complete entry for `key` in any of the layout's roots, its stat taken
    before it is read (`stat_group`; else None) and the files it names, or None (see
    `compiled_files`)."""
    for entry in layout.triton_entries(key):
        group = group_file(entry)
        if group is None:
            continue
        try:
            status = os.stat(group, follow_symlinks=False) if stat_group else None
        except OSError:
            continue
        children = group_children(entry, group.name)
        if children:
            return group, status, [Path(path) for path in children.values()]
    return None


def compiled_files(layout: CacheLayout, key: str) -> list[Path] | None:
    """The files of a complete entry for `key` in any of the layout's roots, or None.

    The entry is complete when its group file exists and every file it names is there, in the
    entry's own directory (so that a cache that moved is still read).
    """
    complete = _complete_entry(layout, key)
    return None if complete is None else complete[2]


def has_entries(layout: CacheLayout) -> bool:
    """Whether any root holds any Triton entry (a cold cache holds none)."""
    for triton_dir in _triton_dirs(layout):
        try:
            with os.scandir(triton_dir) as entries:
                if next(entries, None) is not None:
                    return True
        except (FileNotFoundError, NotADirectoryError):
            continue
    return False


def is_compiled(layout: CacheLayout, key: str) -> bool:
    return compiled_files(layout, key) is not None


def artifact_digests(layout: CacheLayout, key: str) -> dict[str, dict[str, object]] | None:
    """sha256 and size of each file of the entry for `key`, by file name; None when incomplete."""
    files = compiled_files(layout, key)
    if files is None:
        return None
    return {path.name: {"sha256": sha256_file(path), "size": path.stat().st_size} for path in sorted(files)}


@dataclass(frozen=True)
class HashedEntry:
    """An entry's `artifact_digests`, with the stat identity (`checked.stat_identity`) each of its
    files and its group file had before and after it was hashed, by path: the digests hold for as
    long as those keep their identities (any write changes one; a group file naming other files
    is a write)."""

    digests: dict[str, dict[str, object]]
    identities: dict[str, tuple[int, ...]]

    def holds(self, identities: dict[str, tuple[int, ...]]) -> bool:
        """Whether every file hashed still has its identity in `identities` (every file's now)."""
        return all(identities.get(path) == identity for path, identity in self.identities.items())


def still_true(hashed: Mapping[str, HashedEntry], identities: dict[str, tuple[int, ...]]) -> dict[str, dict]:
    """The digests of the entries of `hashed` whose files all still have the identities they had
    when hashed (`identities`: every file's now, `checked.entries_stats`), by key."""
    return {key: entry.digests for key, entry in hashed.items() if entry.holds(identities)}


def hashed_entry(layout: CacheLayout, key: str) -> HashedEntry | None:
    """The entry for `key` hashed now (a warm hashes each as its kernel compiles, beside the
    workers, instead of all of them after the last); None where it is incomplete or a file
    changed while it was hashed."""
    # The group file's stat is taken before it is read: one replaced since names other files.
    complete = _complete_entry(layout, key, stat_group=True)
    if complete is None:
        return None
    group, status, files = complete
    files = sorted(files)
    stated = [group, *files]
    before = [stat_identity(status), *(stat_identity(os.stat(path, follow_symlinks=False)) for path in files)]
    digests = {
        path.name: {"sha256": sha256_file(path), "size": identity[3]}
        for path, identity in zip(files, before[1:], strict=True)
    }
    if [stat_identity(os.stat(path, follow_symlinks=False)) for path in stated] != before:
        return None
    return HashedEntry(digests, {str(path): identity for path, identity in zip(stated, before, strict=True)})


@functools.lru_cache(maxsize=64)
def _triton_dirs(layout: CacheLayout) -> tuple[str, ...]:
    return tuple(str(layout.bucket(Bucket.TRITON, root)) for root in layout.roots)


def entry_problem(
    layout: CacheLayout, key: str, recorded: dict[str, dict[str, object]], deep: bool
) -> EntryProblem | None:
    """Why Triton would not serve the entry for `key` as recorded, or None when it would.

    The entry must have its group file (Triton's mark of a complete entry) and each recorded
    file its recorded size, and with `deep` its recorded sha256.
    Plain `os` calls: verify runs this for every kernel of a configuration, in well under a
    millisecond each.
    """
    files = None
    name = triton_entry_name(key)
    for triton_dir in _triton_dirs(layout):
        try:
            files = {item.name: item for item in os.scandir(os.path.join(triton_dir, name))}
        except (FileNotFoundError, NotADirectoryError):
            continue
        if any(file_name.startswith(GROUP_PREFIX) for file_name in files):
            break
        files = None
    if files is None:
        return EntryProblem("not_in_cache", "not in the cache")
    if not recorded:
        return None if compiled_files(layout, key) is not None else EntryProblem("not_in_cache", "not in the cache")
    group = next(file_name for file_name in files if file_name.startswith(GROUP_PREFIX))
    mapping = read_group(os.path.dirname(files[group].path), group)
    if mapping is None:
        return EntryProblem("group_mismatch", f"{group} maps a file name to another file, or is not a group file")
    if set(mapping) != set(recorded):
        return EntryProblem("group_mismatch", f"{group} names other files than the manifest records")
    # The recorded files are the group file's children at warm time: with the group file
    # present and each of them intact, Triton's own completeness test passes.
    for file_name, expected in recorded.items():
        item = files.get(file_name)
        if item is None:
            return EntryProblem("file_missing", f"{file_name} is missing")
        if not item.is_file(follow_symlinks=False):
            return EntryProblem("not_a_file", f"{file_name} is not a regular file (a link or a directory)")
        size = item.stat(follow_symlinks=False).st_size
        if size != expected["size"]:
            return EntryProblem("size_mismatch", f"{file_name} has {size} bytes, {expected['size']} recorded")
        if deep and sha256_file(item.path) != expected["sha256"]:
            return EntryProblem("checksum_mismatch", f"{file_name} does not match its recorded sha256")
    return None


def driver_module_path(layout: CacheLayout, key: str, name: str) -> Path | None:
    """The first root's file `name` of the driver module entry for `key`, or None."""
    return next((entry / name for entry in layout.triton_entries(key) if (entry / name).is_file()), None)


def driver_module_problem(
    layout: CacheLayout, key: str, recorded: dict[str, dict[str, object]]
) -> tuple[str, str] | None:
    """(file name, why) where one of Triton's driver modules a manifest records is not in any
    root as recorded, or None (its files hashed)."""
    for name, expected in recorded.items():
        path = driver_module_path(layout, key, name)
        if path is None:
            return name, "missing"
        if path.is_symlink() or path.stat().st_size != expected["size"] or sha256_file(path) != expected["sha256"]:
            return name, "does not match its record"
    return None


def remove_unfinished_entry(layout: CacheLayout, key: str) -> bool:
    """Delete the writable root's entry for `key` when it has a group file yet is not complete
    (a child missing, or a name mapped to another file): Triton's own cache manager would load
    it as it is instead of compiling. Call under the key's lock; returns whether it did."""
    entry = layout.triton_entry(key)
    group = group_file(entry)
    if group is None or group_children(entry, group.name) is not None:
        return False
    remove_entry(layout, key)
    return True


def remove_entry(layout: CacheLayout, key: str) -> None:
    """Delete a damaged entry of the writable root so that the next compile writes it anew."""
    shutil.rmtree(layout.triton_entry(key), ignore_errors=True)
