"""Manifests: the jobs one configuration needs, written after all of them are in the cache.

A manifest's name is the hash of a named dict of everything that decides which kernels a
configuration compiles and what their binaries are: schema and kprecompile versions, the
model config's digest, serving parameters, the engine's selection and flags, target,
toolchain, and the environment variables Triton reports as invalidating its cache. "No valid manifest" means "not warm".
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..planning import FamilyPlan
from ..trace import CompileJob
from .files import write_atomic
from .layout import CacheLayout

logger = logging.getLogger(__name__)

MANIFEST_SCHEMA = 2


@dataclass(frozen=True)
class Manifest:
    key: str
    parts: dict[str, Any]
    families: tuple[FamilyPlan, ...]
    jobs: tuple[CompileJob, ...]

    def to_json(self) -> bytes:
        document = {
            "schema": MANIFEST_SCHEMA,
            "key": self.key,
            "parts": self.parts,
            "families": [vars(family) for family in self.families],
            "jobs": [job.as_dict() for job in self.jobs],
        }
        return json.dumps(document, indent=1).encode()


def manifest_parts(
    model_digest: str, serving: dict[str, Any], engine: dict[str, Any], target: str, toolchain: dict[str, Any]
) -> dict[str, Any]:
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return {
        "schema": MANIFEST_SCHEMA,
        "kprecompile": __version__,
        "model_digest": model_digest,
        "serving": serving,
        "engine": engine,
        "target": target,
        "toolchain": toolchain,
        "triton_environment": dict(sorted(get_cache_invalidating_env_vars().items())),
    }


def manifest_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def write_manifest(layout: CacheLayout, manifest: Manifest) -> str:
    path = layout.manifest_path(manifest.key)
    write_atomic(path, manifest.to_json())
    return str(path)


def read_manifest(layout: CacheLayout, key: str) -> Manifest | None:
    """The manifest for `key`, or None if absent; a corrupt one is logged and treated as absent."""
    path = layout.manifest_path(key)
    try:
        document = json.loads(path.read_bytes())
        if document["schema"] != MANIFEST_SCHEMA or document["key"] != key:
            raise ValueError("schema or key mismatch")
        return Manifest(
            key=key,
            parts=document["parts"],
            families=tuple(FamilyPlan(**family) for family in document["families"]),
            jobs=tuple(CompileJob(**job) for job in document["jobs"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning("ignoring unreadable manifest %s: %s", path, error)
        return None
