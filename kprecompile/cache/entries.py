"""Reading Triton's cache entries without Triton: is a key compiled, and what is in it."""

from __future__ import annotations

import json
from pathlib import Path

from .layout import CacheLayout


def compiled_files(layout: CacheLayout, key: str) -> list[Path] | None:
    """The files of a complete entry for `key`, or None when it is absent or incomplete.

    Triton writes an entry's files first and its `__grp__*.json` group file last, naming
    every file of the entry; the entry is a hit only when all of them exist. That is the
    test used here.
    """
    entry = layout.triton_entry(key)
    try:
        groups = [path for path in entry.iterdir() if path.name.startswith("__grp__")]
    except (FileNotFoundError, NotADirectoryError):
        return None
    for group in groups:
        try:
            children = json.loads(group.read_text())["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        paths = [Path(path) for path in children.values()]
        if paths and all(path.is_file() for path in paths):
            return paths
    return None


def is_compiled(layout: CacheLayout, key: str) -> bool:
    return compiled_files(layout, key) is not None
