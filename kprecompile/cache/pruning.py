"""Deleting from a cache: a plan first, then its execution (`--dry-run` prints the same plan).

`rm` removes chosen configurations: their manifests, and the kernel entries no remaining
configuration uses. `prune` removes what cannot serve: configurations built by another toolchain
than this process's for their target (another Triton, Python or install path: their keys can
never match), damaged manifests, buckets of other layout versions, kernel entries no
configuration references (older than a grace period: a serving process may be writing one it
just compiled), lock files nobody holds, and staging directories of imports that died; with a
size limit, it then evicts the least recently served configurations until the cache fits.

Only the writable root is ever touched; layers are read-only. The whole plan is made and
executed under the root's exclusive usage lock (`usage.py`), so no warm, import or preload
runs meanwhile (and no compile lock is taken). Manifests go first (a configuration without its
manifest is simply not warm; an entry without its manifest would be unreferenced).
Triton's own entries without a group file (driver modules: a server's own, or a bake's that
manifests record, shared by every configuration of a Triton) are not kernels and are left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from .checked import CHECKED_SUFFIX
from .inventory import Configuration, configurations, directory_size
from .layout import GROUP_PREFIX, Bucket, CacheLayout
from .locks import remove_if_free
from .staging import dead_staging, is_held
from .usage import SERVED_SUFFIX, USAGE_LOCK, served_stamp

# A kernel entry written this recently may belong to a serving process compiling a miss.
UNREFERENCED_GRACE_SECONDS = 600
_BUCKET_NAME = re.compile(r"(?P<name>[a-z]+(?:-[a-z]+)*)-v(?P<version>\d+)")

RemovalKind = Literal["configuration", "entry", "bucket", "manifest", "lock", "staging"]


@dataclass(frozen=True)
class Removal:
    kind: RemovalKind
    path: str
    bytes: int
    reason: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class DeletionPlan:
    removals: tuple[Removal, ...]

    @property
    def bytes(self) -> int:
        return sum(removal.bytes for removal in self.removals)

    def count(self, kind: RemovalKind) -> int:
        return sum(removal.kind == kind for removal in self.removals)


def plan_rm(layout: CacheLayout, chosen: Iterable[Configuration]) -> DeletionPlan:
    """The chosen configurations of the writable root and the entries only they use."""
    chosen = [configuration for configuration in chosen if configuration.writable]
    keys = {configuration.key for configuration in chosen}
    kept = [c for c in configurations(layout) if c.writable and c.key not in keys]
    removals = [_configuration_removal(configuration, "chosen") for configuration in chosen]
    removals += _entries_only_of(layout, chosen, kept)
    return DeletionPlan(tuple(removals))


def plan_prune(
    layout: CacheLayout,
    is_current: Callable[[Configuration], bool],
    max_size: int | None = None,
    now: float | None = None,
) -> DeletionPlan:
    now = time.time() if now is None else now
    removals: list[Removal] = []
    writable = [c for c in configurations(layout) if c.writable]
    stale = [c for c in writable if not is_current(c)]
    removals += [_configuration_removal(c, "built by another toolchain than this one") for c in stale]
    kept = [c for c in writable if c not in stale]
    removals += _unreadable_manifests(layout, writable)
    removals += _other_versions(layout)
    referenced = {name for configuration in kept for name in configuration.entries}
    removals += _unreferenced_entries(layout, referenced, now)
    removals += _free_locks(layout)
    removals += _dead_staging(layout)
    if max_size is not None:
        evicted = _evictions(layout, kept, removals, max_size)
        reason = f"least recently served or warmed, over {max_size} bytes"
        removals += [_configuration_removal(c, reason) for c in evicted]
        survivors = [c for c in kept if c not in evicted]
        already = {removal.path for removal in removals}
        removals += [removal for removal in _entries_only_of(layout, evicted, survivors) if removal.path not in already]
    return DeletionPlan(tuple(removals))


def execute(layout: CacheLayout, plan: DeletionPlan) -> None:
    """Delete what the plan lists: manifests first, then entries, buckets, staging, locks."""
    order = {"configuration": 0, "manifest": 0, "entry": 1, "bucket": 2, "staging": 2, "lock": 3}
    for removal in sorted(plan.removals, key=lambda removal: order[removal.kind]):
        path = Path(removal.path)
        if removal.kind == "lock":
            remove_if_free(path)  # taken meanwhile: its holder deletes it as it lets go
        elif removal.kind in ("configuration", "manifest"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            if removal.kind == "configuration":
                for companion in (served_stamp(path), path.with_suffix(CHECKED_SUFFIX)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(companion)
        else:
            shutil.rmtree(path, ignore_errors=True)


def _configuration_removal(configuration: Configuration, reason: str) -> Removal:
    size = configuration.path.stat().st_size if configuration.path.exists() else 0
    return Removal(
        "configuration",
        str(configuration.path),
        size,
        f"{configuration.model_name} on {configuration.target}: {reason}",
    )


def _entries_only_of(layout: CacheLayout, removed: list[Configuration], kept: list[Configuration]) -> list[Removal]:
    still_used = {name for configuration in kept for name in configuration.entries}
    names = sorted({name for configuration in removed for name in configuration.entries} - still_used)
    removals = []
    for name in names:
        entry = layout.triton_dir / name
        if entry.is_dir() and not entry.is_symlink():
            removals.append(Removal("entry", str(entry), directory_size(entry), "used by no remaining configuration"))
    return removals


def _unreadable_manifests(layout: CacheLayout, readable: list[Configuration]) -> list[Removal]:
    known = {configuration.path for configuration in readable}
    removals = []
    with contextlib.suppress(OSError), os.scandir(layout.manifests_dir) as items:
        for item in items:
            path = Path(item.path)
            if item.name.endswith(".json") and path not in known:
                removals.append(
                    Removal(
                        "manifest",
                        item.path,
                        item.stat(follow_symlinks=False).st_size,
                        "not a manifest this version of kprecompile reads",
                    )
                )
            elif item.name.endswith(SERVED_SUFFIX) and path.with_suffix(".json") not in known:
                removals.append(Removal("manifest", item.path, 0, "when a configuration no longer here was served"))
            elif item.name.endswith(CHECKED_SUFFIX) and path.with_suffix(".json") not in known:
                removals.append(
                    Removal("manifest", item.path, 0, "when a configuration no longer here was last checked whole")
                )
    return removals


def _other_versions(layout: CacheLayout) -> list[Removal]:
    """Buckets named like kprecompile's, with another version of their format."""
    current = {bucket.value for bucket in Bucket}
    names = {match["name"] for bucket in Bucket if (match := _BUCKET_NAME.fullmatch(bucket.value))}
    removals = []
    with contextlib.suppress(OSError), os.scandir(layout.root) as items:
        for item in items:
            match = _BUCKET_NAME.fullmatch(item.name)
            if match and match["name"] in names and item.name not in current and item.is_dir(follow_symlinks=False):
                removals.append(
                    Removal(
                        "bucket",
                        item.path,
                        directory_size(Path(item.path)),
                        "a layout version this kprecompile never reads",
                    )
                )
    return removals


def _unreferenced_entries(layout: CacheLayout, referenced: set[str], now: float) -> list[Removal]:
    removals = []
    with contextlib.suppress(OSError), os.scandir(layout.triton_dir) as items:
        for item in items:
            if item.name in referenced or not item.is_dir(follow_symlinks=False):
                continue
            try:
                files = os.listdir(item.path)
                newest = max([os.lstat(os.path.join(item.path, f)).st_mtime for f in files] or [item.stat().st_mtime])
            except OSError:
                continue
            if (
                files
                and not any(name.startswith(GROUP_PREFIX) for name in files)
                and any(name.endswith((".so", ".pyd")) for name in files)
            ):
                continue  # a launcher or driver module: not a kernel, rebuilt only with a host compiler
            if now - newest < UNREFERENCED_GRACE_SECONDS:
                continue
            removals.append(
                Removal("entry", item.path, directory_size(Path(item.path)), "a kernel no configuration references")
            )
    return removals


def _free_locks(layout: CacheLayout) -> list[Removal]:
    """Lock files nobody holds: a holder deletes its own as it lets go, so these are left by a
    process killed while holding one, or by an earlier kprecompile that kept them."""
    removals = []
    with contextlib.suppress(OSError), os.scandir(layout.locks_dir) as items:
        for item in items:
            if item.name == USAGE_LOCK or not item.is_file(follow_symlinks=False):
                continue
            if item.name.startswith("import-"):
                continue  # an import's ownership lock: `_dead_staging` decides
            if is_held(item.path):
                continue
            removals.append(Removal("lock", item.path, 0, "held by no process"))
    return removals


def _dead_staging(layout: CacheLayout) -> list[Removal]:
    removals = []
    for staging, lock in dead_staging(layout):
        removals.append(
            Removal("staging", str(staging), directory_size(staging), "left by an import that did not finish")
        )
        if lock.exists():
            removals.append(Removal("lock", str(lock), 0, "held by no process"))
    return removals


def _evictions(
    layout: CacheLayout, kept: list[Configuration], planned: list[Removal], max_size: int
) -> list[Configuration]:
    """Least recently served configurations whose removal brings the root under `max_size`."""
    size = directory_size(layout.root) - sum(removal.bytes for removal in planned)
    evicted: list[Configuration] = []
    remaining = list(kept)
    for configuration in sorted(kept, key=lambda c: c.last_used):
        if size <= max_size:
            break
        evicted.append(configuration)
        remaining.remove(configuration)
        still_used = {name for c in remaining for name in c.entries}
        freed = sum(size_ for name, size_ in configuration.entries.items() if name not in still_used)
        size -= freed + (configuration.path.stat().st_size if configuration.path.exists() else 0)
    return evicted


__all__ = ["DeletionPlan", "Removal", "execute", "plan_prune", "plan_rm"]
