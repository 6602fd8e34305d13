"""What a cache holds, configuration by configuration, read from its manifests (no torch, no
Triton): the model as the user named it, the serving parameters, the engine's selection, the
target and toolchain, the kernels, their size on disk, when the configuration was last served,
and whether every kernel is there (`verify`'s quick check)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .entries import entry_problem
from .layout import Bucket, CacheLayout, triton_entry_name
from .manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest
from .usage import last_served


@dataclass(frozen=True)
class Configuration:
    key: str
    path: Path
    # False for a configuration of a read-only layer (listed, never deleted).
    writable: bool
    manifest: Manifest
    # Kernel entries (Triton's directory names) and their recorded sizes in bytes.
    entries: dict[str, int]
    # When it was last warmed (the manifest written) or served, whichever is later.
    last_used: float
    # Every entry present with its recorded files.
    complete: bool
    # When a serving process last loaded it (`usage.mark_used`); None: never.
    last_served: float | None = None
    # Triton's driver modules it records, likewise: counted in its size, never removed with it
    # (shared with every configuration of the same Triton, recorded or not; `prune` keeps them).
    modules: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.manifest.model.get("name") or self.manifest.parts.get("model_digest", "")[:12]

    @property
    def target(self) -> str:
        return str(self.manifest.parts.get("target", ""))

    @property
    def size(self) -> int:
        return sum(self.entries.values()) + sum(self.modules.values())

    def as_dict(self, current_toolchain: bool | None) -> dict[str, Any]:
        parts = self.manifest.parts
        engine = parts.get("engine", {})
        return {
            "manifest": self.key,
            "path": str(self.path),
            "writable": self.writable,
            "model": self.model_name,
            "model_source": self.manifest.model.get("source", ""),
            "serving": parts.get("serving", {}),
            "vllm_release": engine.get("vllm_release"),
            "attention_backend": engine.get("attention_backend"),
            "target": self.target,
            "toolchain": parts.get("toolchain", {}),
            "toolchain_current": current_toolchain,
            "kernels": len(self.manifest.jobs),
            "bytes": self.size,
            "last_used": self.last_used,
            "last_served": self.last_served,
            "status": "warm" if self.complete else "incomplete",
        }


def configurations(layout: CacheLayout) -> list[Configuration]:
    """Every readable manifest of every root (the writable one first), as configurations."""
    found = []
    for root in layout.roots:
        directory = layout.bucket(Bucket.MANIFESTS, root)
        for path in _manifest_files(directory):
            try:
                info = os.lstat(path)
                if info.st_size > MAX_MANIFEST_BYTES:
                    continue
                manifest = parse_manifest(path.read_bytes(), path.stem)
            except (OSError, ValueError):
                continue  # `verify` names a bad manifest; `prune` removes it
            entries, modules = (
                {triton_entry_name(key): sum(int(file["size"]) for file in files.values()) for key, files in records}
                for records in (manifest.artifacts.items(), manifest.launchers.items())
            )
            complete = not any(
                entry_problem(layout, job_key, files, deep=False) for job_key, files in manifest.artifacts.items()
            )
            served = last_served(path)
            used = max(info.st_mtime, served or 0.0)
            writable = root == layout.root
            found.append(
                Configuration(manifest.key, path, writable, manifest, entries, used, complete, served, modules)
            )
    return found


def _manifest_files(directory: Path) -> list[Path]:
    try:
        with os.scandir(directory) as items:
            return sorted(Path(item.path) for item in items if item.name.endswith(".json") and item.is_file())
    except OSError:
        return []


def directory_size(path: Path) -> int:
    """Bytes of the regular files under `path` (links not followed)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
    return total


def recorded_driver_modules(root: Path) -> dict[tuple[str, str], set[str]]:
    """{(Triton key, file name): the sha256s manifests of the cache at `root` record for that
    driver module} (manifests only, no entry checked: a bake asks this once per manifest it
    writes). Each manifest file is parsed once per process while unchanged."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in _manifest_files(root / Bucket.MANIFESTS.value):
        try:
            info = os.lstat(path)
            identity = (info.st_ino, info.st_size, info.st_mtime_ns)
            cached = _MODULE_RECORDS.get(path)
            if cached is None or cached[0] != identity:
                if info.st_size > MAX_MANIFEST_BYTES:
                    continue
                launchers = parse_manifest(path.read_bytes(), path.stem).launchers
                cached = _MODULE_RECORDS[path] = (identity, launchers)
        except (OSError, ValueError):
            continue
        for key, files in cached[1].items():
            for name, record in files.items():
                found.setdefault((key, name), set()).add(str(record["sha256"]))
    return found


_MODULE_RECORDS: dict[Path, tuple[tuple[int, int, int], dict[str, dict[str, dict[str, Any]]]]] = {}
