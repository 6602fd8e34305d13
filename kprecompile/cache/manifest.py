"""Manifests: the jobs one configuration needs, written after all of them are in the cache.

A manifest's name is the hash of a named dict of everything that decides which kernels a
configuration compiles and what their binaries are: schema and kprecompile versions, the
model config's digest, serving parameters, the engine's selection and flags, target,
toolchain identity and the environment fingerprint. It lists each job with its Triton key
and the size and sha256 of each of its files. "No valid manifest" means "not warm".
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from ..engines import Selection
from ..environment import fingerprint
from ..models import ModelConfig
from ..planning import FamilyPlan
from ..serving import ServingParams
from ..targets import Target
from ..trace import CompileJob
from .entries import artifact_digests, entry_problem
from .files import write_atomic
from .layout import CacheLayout
from .toolchain import current_toolchain

logger = logging.getLogger(__name__)

MANIFEST_SCHEMA = 4


@dataclass(frozen=True)
class Manifest:
    key: str
    parts: dict[str, Any]
    families: tuple[FamilyPlan, ...]
    jobs: tuple[CompileJob, ...]
    # Per job key: {file name: {"sha256", "size"}} of its cache entry's files.
    artifacts: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        document = {
            "schema": MANIFEST_SCHEMA,
            "key": self.key,
            "parts": self.parts,
            "families": [vars(family) for family in self.families],
            "jobs": [{**job.as_dict(), "artifacts": self.artifacts.get(job.key, {})} for job in self.jobs],
        }
        return json.dumps(document, indent=1).encode()


def manifest_parts(
    model_digest: str,
    serving: dict[str, Any],
    engine: dict[str, Any],
    target: str,
    toolchain: dict[str, Any],
    environment: dict[str, Any],
) -> dict[str, Any]:
    return {
        "schema": MANIFEST_SCHEMA,
        "kprecompile": __version__,
        "model_digest": model_digest,
        "serving": serving,
        "engine": engine,
        "target": target,
        "toolchain": toolchain,
        "environment": environment,
    }


def configuration_parts(
    model: ModelConfig,
    serving: ServingParams,
    selection: Selection,
    target: Target,
    layout: CacheLayout,
    remember: bool = True,
) -> dict[str, Any]:
    """The manifest parts of this configuration in this process: no torch, no tracing."""
    toolchain = current_toolchain(layout, target, remember).as_dict()
    environment = fingerprint(engine=selection.engine).as_dict()
    return manifest_parts(
        model.digest, serving.resolved(model), selection.key_part(), target.name, toolchain, environment
    )


def job_problems(layout: CacheLayout, manifest: Manifest, deep: bool) -> list[tuple[CompileJob, str]]:
    """Each job of `manifest` whose cache entry is missing or does not match its record."""
    problems = []
    for job in manifest.jobs:
        if problem := entry_problem(layout, job.key, manifest.artifacts.get(job.key, {}), deep):
            problems.append((job, problem))
    return problems


def record_artifacts(layout: CacheLayout, jobs: tuple[CompileJob, ...]) -> dict[str, dict[str, dict[str, Any]]]:
    """Sizes and checksums of every job's cache entry, for the manifest."""
    return {job.key: artifact_digests(layout, job.key) or {} for job in jobs}


def manifest_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def write_manifest(layout: CacheLayout, manifest: Manifest) -> str:
    path = layout.manifest_path(manifest.key)
    write_atomic(path, manifest.to_json())
    return str(path)


def read_manifest(layout: CacheLayout, key: str) -> Manifest | None:
    """The manifest for `key` in any root, or None; a corrupt one is logged and treated as absent."""
    path = layout.find_manifest(key) or layout.manifest_path(key)
    try:
        document = json.loads(path.read_bytes())
        if document["schema"] != MANIFEST_SCHEMA or document["key"] != key:
            raise ValueError("schema or key mismatch")
        if manifest_key(document["parts"]) != key:
            raise ValueError("its parts do not hash to its key")
        return Manifest(
            key=key,
            parts=document["parts"],
            families=tuple(FamilyPlan(**family) for family in document["families"]),
            jobs=tuple(CompileJob(**{k: v for k, v in job.items() if k != "artifacts"}) for job in document["jobs"]),
            artifacts={job["key"]: job["artifacts"] for job in document["jobs"]},
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning("ignoring unreadable manifest %s: %s", path, error)
        return None


def read_all_manifests(layout: CacheLayout) -> list[dict[str, Any]]:
    """The parts of every readable manifest in the cache (to explain why a key has none)."""
    documents = []
    paths = []
    for root in layout.roots:
        try:
            paths += sorted((root / "manifests-v1").glob("*.json"))
        except OSError:
            continue
    for path in paths:
        try:
            document = json.loads(path.read_bytes())
            if document.get("schema") == MANIFEST_SCHEMA:
                documents.append({"path": str(path), "parts": document["parts"]})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return documents
