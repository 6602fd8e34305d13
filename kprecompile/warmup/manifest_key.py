"""The key recipe: which manifest describes a configuration, and where it is.

A configuration is one model, served one way (serving parameters, engine selection), on one
target. Its manifest is named by the hash of a named dict of everything that decides which
kernels it compiles and what their binaries are: the manifest schema and kprecompile
versions, the model's digest, the effective serving parameters, the engine's selection, the
target, the toolchain identity and the environment fingerprint. The parts are stored in the
manifest, so that `verify` can say which one differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..cache.keys import hash_named_dict
from ..cache.layout import MANIFEST_SCHEMA, CacheLayout
from ..cache.manifest import Manifest, locate_manifest, manifest_key, read_manifest
from ..inputs.environment import fingerprint
from ..inputs.targets import Target
from ..inputs.toolchain import Toolchain, current_toolchain
from ..selection.request import Request
from ..vllm.releases import DEFAULT_RELEASE, serving_capture_sizes

# The parts that must be equal for another manifest to be "this configuration, elsewhere".
SAME_CONFIGURATION = ("schema", "model_digest", "serving", "target")
# A journal is shared by every toolchain and kprecompile version serving a configuration: what
# one recorded, a builder with another Triton build or release still sees (and says it cannot
# replay when the toolchain differs).
_NOT_IN_JOURNAL_KEY = ("schema", "kprecompile", "toolchain")


def configuration_parts(
    request: Request,
    target: Target,
    layout: CacheLayout,
    *,
    remember: bool = True,
    toolchain: Toolchain | None = None,
) -> dict[str, Any]:
    """The named parts of this configuration's manifest key in this process: no torch, no tracing.

    `remember` false (verify, preload) writes nothing to the cache, not even the Triton-key
    memo; `toolchain` replaces this process's toolchain (tests, explanations).
    """
    model, serving, selection = request.model, request.serving, request.selection
    toolchain = toolchain or current_toolchain(layout, target, remember)
    return {
        "schema": MANIFEST_SCHEMA,
        "kprecompile": __version__,
        "model_digest": model.digest,
        "serving": serving.resolved(
            model, serving_capture_sizes(serving, selection.vllm_release or DEFAULT_RELEASE, model, target)
        ),
        "engine": selection.key_part(),
        "target": target.name,
        "toolchain": toolchain.as_dict(),
        "environment": fingerprint(
            engine=selection.engine, layout=layout, remember=remember, release=selection.vllm_release
        ).as_dict(),
    }


def journal_key(parts: dict[str, Any]) -> str:
    """The key of the journal of the configuration with manifest `parts` (see cache/journal.py)."""
    return hash_named_dict({name: value for name, value in parts.items() if name not in _NOT_IN_JOURNAL_KEY})


def toolchain_digest(parts: dict[str, Any]) -> str:
    """One hash for the toolchain part: a record is replayed only under the toolchain that made it."""
    return hash_named_dict(parts["toolchain"])


@dataclass(frozen=True)
class ManifestLookup:
    """A configuration's manifest key and parts, and its manifest when the cache has one."""

    key: str
    parts: dict[str, Any]
    manifest: Manifest | None
    # Where the manifest was found, or where the writable cache keeps it once written.
    path: Path

    @property
    def journal_key(self) -> str:
        return journal_key(self.parts)

    @property
    def toolchain_digest(self) -> str:
        return toolchain_digest(self.parts)


def find_manifest(
    request: Request,
    target: Target,
    layout: CacheLayout,
    *,
    remember: bool = True,
) -> ManifestLookup:
    """Parts -> key -> the manifest in any root of `layout` (None when not there or unreadable)."""
    parts = configuration_parts(request, target, layout, remember=remember)
    key = manifest_key(parts)
    manifest = read_manifest(layout, key)
    path = (locate_manifest(layout, key) if manifest is not None else None) or layout.manifest_path(key)
    return ManifestLookup(key, parts, manifest, path)
