"""Which cache files a serving process loads: those a manifest records, checked, and its own.

The same holds for Triton's driver modules (utilities, launchers) a manifest records: in a
read-only layer one is served only as recorded.

A cache entry is executable code. Before kprecompile's Triton cache manager hands Triton an
entry's files, they are checked against what a manifest of the cache recorded when the entry
was compiled (the same file names, each a regular file of the recorded size and sha256);
files this process wrote itself (kernels compiled while serving) are served as written. An
entry no manifest records, or whose files do not match, is not served: Triton compiles the
kernel again into the writable cache. Checking costs one sha256 per kernel, once per process
(Triton keeps what it loaded in memory); a stat per file where `preload` found every file of
its configuration with the stats of the last whole check (`checked.py`: a warm's, which hashed
them all), since no write leaves a file's stat as it was.

Manifests are read when needed: `preload` hands over the configuration's manifest; an entry
of another configuration makes this read the manifests of every root once more (new files
only).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path

from .checked import stat_identity
from .files import sha256_file
from .layout import triton_entry_name
from .manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest

logger = logging.getLogger(__name__)

# {file name: (size, sha256)}: one entry's files as a manifest recorded them.
Record = dict[str, tuple[int, str]]


class ServedFiles:
    def __init__(self) -> None:
        self._records: dict[str, list[Record]] = {}
        # The records of the configurations this process serves (handed over by `preload`).
        self._own: dict[str, list[Record]] = {}
        self._written: set[str] = set()
        self._read_manifests: set[Path] = set()
        self._warned: set[str] = set()
        # Files a whole check found as their own manifest records them (`checked.py`), by path:
        # their stat then. Unchanged since, they are not hashed again.
        self._checked: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def record(self, manifest: Manifest, own: bool = True) -> None:
        """Serve the entries `manifest` records (as it recorded them). The manifest of a
        configuration this process serves (`own`) is then the only one that vouches for its
        entries: another configuration's manifest (an imported one) never covers them."""
        with self._lock:
            for job_key, files in [*manifest.artifacts.items(), *manifest.launchers.items()]:
                record = {name: (int(file["size"]), str(file["sha256"])) for name, file in files.items()}
                for table in (self._records, self._own) if own else (self._records,):
                    records = table.setdefault(triton_entry_name(job_key), [])
                    if record not in records:
                        records.append(record)

    def checked(self, identities: dict[str, tuple[int, ...]]) -> None:
        """Files of the configurations this process serves that passed a whole check with these
        stats (`checked.checked_files`, read after the memo matched)."""
        with self._lock:
            self._checked.update(identities)

    def wrote(self, path: str | os.PathLike[str]) -> None:
        """A file this process wrote into the writable cache."""
        with self._lock:
            self._written.add(os.fspath(path))

    def problem(self, entry_name: str, files: dict[str, str], manifest_dirs: Iterable[Path]) -> str | None:
        """Why the entry's `files` (Triton's names -> paths) must not be served, or None."""
        if all(path in self._written for path in files.values()):
            return None
        records = (
            self._own.get(entry_name)
            or self._records.get(entry_name)
            or self._read_new_manifests(manifest_dirs, entry_name)
        )
        if not records:
            return "no manifest records it"
        # Each name must be the file of that name: Triton reads what the name maps to.
        if any(os.path.basename(path) != name for name, path in files.items()):
            return "its group file maps a file name to another file"
        names = dict(files)
        candidates = [record for record in records if set(record) == set(names)]
        if not candidates:
            return "its files are not the ones its manifest records"
        if entry_name in self._own and self._unchanged_since_checked(names.values()):
            return None
        digests = {}
        for name, path in names.items():
            try:
                info = os.lstat(path)
            except OSError as error:
                return f"{name}: {error.strerror or error}"
            if not stat.S_ISREG(info.st_mode):
                return f"{name} is not a regular file"
            if not any(record[name][0] == info.st_size for record in candidates):
                return f"{name} has {info.st_size} bytes, not the {candidates[0][name][0]} recorded"
            digests[name] = sha256_file(path)
        if any(all(record[name][1] == digests[name] for name in names) for record in candidates):
            return None
        return "its files' checksums are not the ones recorded"

    def _unchanged_since_checked(self, paths: Iterable[str]) -> bool:
        try:
            return all(self._checked.get(path) == stat_identity(os.lstat(path)) for path in paths)
        except OSError:
            return False

    def warn_once(self, entry: str, problem: str) -> None:
        with self._lock:
            if entry in self._warned:
                return
            self._warned.add(entry)
        logger.warning("kprecompile: not serving cache entry %s (%s): compiling it again", entry, problem)

    def _read_new_manifests(self, manifest_dirs: Iterable[Path], entry_name: str) -> list[Record]:
        for directory in manifest_dirs:
            try:
                paths = [Path(item.path) for item in os.scandir(directory) if item.name.endswith(".json")]
            except OSError:
                continue
            for path in paths:
                if path in self._read_manifests:
                    continue
                self._read_manifests.add(path)
                try:
                    if os.lstat(path).st_size > MAX_MANIFEST_BYTES:
                        continue
                    self.record(parse_manifest(path.read_bytes(), path.stem), own=False)
                except (OSError, ValueError):
                    continue  # `verify` and `warm` report a bad manifest; here it just serves nothing
        return self._records.get(entry_name, [])


# One per process: what the process's Triton cache managers serve.
SERVED = ServedFiles()
