"""Manifests: the jobs one configuration needs, written after all of them are in the cache.

A manifest is named by the hash of its parts, a named dict of everything that decides which
kernels a configuration compiles and what their binaries are (the recipe is
`kprecompile.configuration`'s; storage only checks that the parts hash to the name). It lists
each job with its Triton key and the size and sha256 of each of its files, and the plan's
family rows. "No valid manifest" means "not warm".
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .entries import EntryProblem, artifact_digests, entry_problem
from .files import write_atomic
from .jobs import CompileJob
from .keys import hash_named_dict
from .layout import MANIFEST_SCHEMA, Bucket, CacheLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Manifest:
    key: str
    parts: dict[str, Any]
    # The plan's family rows for this configuration, as `plan --json` shows them.
    families: tuple[dict[str, Any], ...]
    jobs: tuple[CompileJob, ...]
    # Per job key: {file name: {"sha256", "size"}} of its cache entry's files.
    artifacts: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        document = {
            "schema": MANIFEST_SCHEMA,
            "key": self.key,
            "parts": self.parts,
            "families": list(self.families),
            "jobs": [{**job.as_dict(), "artifacts": self.artifacts.get(job.key, {})} for job in self.jobs],
        }
        return json.dumps(document, indent=1).encode()


def manifest_key(parts: dict[str, Any]) -> str:
    return hash_named_dict(parts)


def locate_manifest(layout: CacheLayout, key: str) -> Path | None:
    """The first root holding a manifest named `key`, or None."""
    return next((path for path in layout.manifest_paths(key) if path.is_file()), None)


def write_manifest(layout: CacheLayout, manifest: Manifest) -> str:
    path = layout.manifest_path(manifest.key)
    write_atomic(path, manifest.to_json())
    return str(path)


def read_manifest(layout: CacheLayout, key: str) -> Manifest | None:
    """The manifest for `key` in any root, or None; a corrupt one is logged and treated as absent."""
    path = locate_manifest(layout, key)
    if path is None:
        return None
    try:
        document = json.loads(path.read_bytes())
        if document["schema"] != MANIFEST_SCHEMA or document["key"] != key:
            raise ValueError("schema or key mismatch")
        if manifest_key(document["parts"]) != key:
            raise ValueError("its parts do not hash to its key")
        return Manifest(
            key=key,
            parts=document["parts"],
            families=tuple(dict(family) for family in document["families"]),
            jobs=tuple(CompileJob(**{k: v for k, v in job.items() if k != "artifacts"}) for job in document["jobs"]),
            artifacts={job["key"]: job["artifacts"] for job in document["jobs"]},
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning("ignoring unreadable manifest %s: %s", path, error)
        return None


def read_all_manifest_parts(layout: CacheLayout) -> list[dict[str, Any]]:
    """`{"path", "parts"}` of every readable manifest in every root (to explain a missing key)."""
    paths: list[Path] = []
    for root in layout.roots:
        try:
            paths += sorted(layout.bucket(Bucket.MANIFESTS, root).glob("*.json"))
        except OSError:
            continue
    documents = []
    for path in paths:
        try:
            document = json.loads(path.read_bytes())
            if document.get("schema") == MANIFEST_SCHEMA:
                documents.append({"path": str(path), "parts": document["parts"]})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return documents


def job_problems(layout: CacheLayout, manifest: Manifest, deep: bool) -> list[tuple[CompileJob, EntryProblem]]:
    """Each job of `manifest` whose cache entry is missing or does not match its record."""
    problems = []
    for job in manifest.jobs:
        if problem := entry_problem(layout, job.key, manifest.artifacts.get(job.key, {}), deep):
            problems.append((job, problem))
    return problems


def record_artifacts(layout: CacheLayout, jobs: tuple[CompileJob, ...]) -> dict[str, dict[str, dict[str, Any]]]:
    """Sizes and checksums of every job's cache entry, for the manifest."""
    return {job.key: artifact_digests(layout, job.key) or {} for job in jobs}
