"""Reading Triton's cache entries without Triton: is a key compiled, what is in it, is it intact."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

from .layout import CacheLayout, triton_entry_name


def compiled_files(layout: CacheLayout, key: str) -> list[Path] | None:
    """The files of a complete entry for `key` in any of the layout's roots, or None.

    Triton writes an entry's files first and its `__grp__*.json` group file last, naming every
    file of the entry; the entry is complete when all of them exist. The group file names them
    by absolute path at write time; they are looked up by name in the entry's own directory,
    so that a cache that moved (a bundle, an image layer) is still read.
    """
    for entry in layout.triton_entries(key):
        files = _group_files(entry)
        if files is not None:
            return files
    return None


def group_children(directory: str | os.PathLike[str], group_name: str) -> dict[str, str] | None:
    """The files a Triton group file names, found by name in its own directory, when all exist.

    Triton records them by absolute path at write time; looking them up beside the group file
    is what lets a moved cache (a bundle, an image layer) be read. Used here and by the
    layered Triton cache manager.
    """
    try:
        with open(os.path.join(directory, group_name), "rb") as group:
            children = json.loads(group.read())["child_paths"]
        found = {name: os.path.join(directory, os.path.basename(path)) for name, path in children.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return found if all(os.path.isfile(path) for path in found.values()) else None


def _group_files(entry: Path) -> list[Path] | None:
    try:
        groups = [path.name for path in entry.iterdir() if path.name.startswith("__grp__")]
    except (FileNotFoundError, NotADirectoryError):
        return None
    for group in groups:
        children = group_children(entry, group)
        if children:
            return [Path(path) for path in children.values()]
    return None


def is_compiled(layout: CacheLayout, key: str) -> bool:
    return compiled_files(layout, key) is not None


def artifact_digests(layout: CacheLayout, key: str) -> dict[str, dict[str, object]] | None:
    """sha256 and size of each file of the entry for `key`, by file name; None when incomplete."""
    files = compiled_files(layout, key)
    if files is None:
        return None
    return {path.name: {"sha256": _sha256(path), "size": path.stat().st_size} for path in sorted(files)}


@functools.lru_cache(maxsize=64)
def _triton_dirs(layout: CacheLayout) -> tuple[str, ...]:
    return tuple(os.path.join(root, "triton-v1") for root in layout.roots)


def entry_problem(layout: CacheLayout, key: str, recorded: dict[str, dict[str, object]], deep: bool) -> str | None:
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
        if any(name.startswith("__grp__") for name in files):
            break
        files = None
    if files is None:
        return "not in the cache"
    if not recorded:
        return None if compiled_files(layout, key) is not None else "not in the cache"
    # The recorded files are the group file's children at warm time: with the group file
    # present and each of them intact, Triton's own completeness test passes.
    for name, expected in recorded.items():
        item = files.get(name)
        if item is None:
            return f"{name} is missing"
        size = item.stat().st_size
        if size != expected["size"]:
            return f"{name} has {size} bytes, {expected['size']} recorded"
        if deep and _sha256(Path(item.path)) != expected["sha256"]:
            return f"{name} does not match its recorded sha256"
    return None


def remove_entry(layout: CacheLayout, key: str) -> None:
    """Delete a damaged entry of the writable root so that the next compile writes it anew."""
    shutil.rmtree(layout.triton_entry(key), ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
