"""`verify`: is this configuration fully warm in this process's environment, and if not, why.

In-process and fast: the manifest key is recomputed from the live environment and toolchain
(no torch, no tracing, no workers), its manifest read and every kernel's cache entry checked
(sizes; checksums too with `deep`). Without a manifest for the key, the cache's other
manifests for the same model, serving parameters, engine selection and target say what
differs: the toolchain (Triton key, install path, Python, ptxas, versions) or a variable.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .cache.layout import CacheLayout
from .cache.manifest import configuration_parts, job_problems, manifest_key, read_all_manifests, read_manifest
from .engines import Selection, select
from .models import ModelConfig
from .serving import ServingParams
from .targets import Target

Status = Literal["warm", "incomplete", "mismatch", "not_warmed"]
# The parts that must be equal for another manifest to be "this configuration, elsewhere".
_SAME_CONFIGURATION = ("schema", "model_digest", "serving", "target")


@dataclass(frozen=True)
class KernelProblem:
    kernel: str
    specialization: str
    key: str
    problem: str


@dataclass(frozen=True)
class TargetVerdict:
    target: str
    status: Status
    manifest: str | None
    kernels: int
    problems: tuple[KernelProblem, ...]
    # Why no manifest matches: each differing part, baked value against this process's.
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class VerifyReport:
    model: str
    warm: bool
    targets: tuple[TargetVerdict, ...]
    manifest_key_parts: tuple[str, ...]
    deep: bool
    seconds: float
    cache_dir: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify(
    model: ModelConfig,
    serving: ServingParams,
    targets: Sequence[Target],
    layout: CacheLayout,
    *,
    selection: Selection | None = None,
    deep: bool = False,
) -> VerifyReport:
    started = time.perf_counter()
    if selection is None:
        selection = select(model)
    serving.check(model)
    verdicts = []
    parts: dict[str, Any] = {}
    for target in targets:
        # Nothing is written: verify may run against a read-only cache.
        parts = configuration_parts(model, serving, selection, target, layout, remember=False)
        verdicts.append(_verify_target(layout, parts, target, deep))
    return VerifyReport(
        model=model.name,
        warm=all(verdict.status == "warm" for verdict in verdicts),
        targets=tuple(verdicts),
        manifest_key_parts=tuple(parts),
        deep=deep,
        seconds=time.perf_counter() - started,
        cache_dir=str(layout.root),
    )


def _verify_target(layout: CacheLayout, parts: dict[str, Any], target: Target, deep: bool) -> TargetVerdict:
    key = manifest_key(parts)
    manifest = read_manifest(layout, key)
    if manifest is not None:
        problems = tuple(
            KernelProblem(job.kernel, job.describe_specialization(), job.key, problem)
            for job, problem in job_problems(layout, manifest, deep)
        )
        status: Status = "incomplete" if problems else "warm"
        path = str(layout.find_manifest(key) or layout.manifest_path(key))
        return TargetVerdict(target.name, status, path, len(manifest.jobs), problems, ())
    reasons = _differences(layout, parts)
    if reasons:
        return TargetVerdict(target.name, "mismatch", None, 0, (), reasons)
    return TargetVerdict(target.name, "not_warmed", None, 0, (), ("no manifest for this configuration",))


def _differences(layout: CacheLayout, parts: dict[str, Any]) -> tuple[str, ...]:
    """What differs between this process and the closest manifest of the same configuration."""
    candidates = [
        document
        for document in read_all_manifests(layout)
        if all(document["parts"].get(name) == parts.get(name) for name in _SAME_CONFIGURATION)
    ]
    if not candidates:
        return ()
    # The candidate with the fewest differing parts explains best.
    best = min(candidates, key=lambda document: len(_describe(document["parts"], parts)))
    return tuple(f"{line} (manifest {best['path']})" for line in _describe(best["parts"], parts))


def _describe(baked: dict[str, Any], here: dict[str, Any]) -> list[str]:
    lines = []
    baked_tool, here_tool = baked.get("toolchain", {}), here.get("toolchain", {})
    if baked_tool.get("triton_key") != here_tool.get("triton_key") or (
        baked_tool.get("triton_path") != here_tool.get("triton_path")
    ):
        lines.append(
            f"toolchain mismatch: baked with Triton key {baked_tool.get('triton_key')} at path "
            f"{baked_tool.get('triton_path')}; this process has {here_tool.get('triton_key')} at "
            f"{here_tool.get('triton_path')}"
        )
    for name in sorted(set(baked_tool) | set(here_tool)):
        if name not in ("triton_key", "triton_path") and baked_tool.get(name) != here_tool.get(name):
            lines.append(f"toolchain mismatch: {name} was {baked_tool.get(name)!r}, here {here_tool.get(name)!r}")
    baked_backend = baked.get("engine", {}).get("attention_backend")
    here_backend = here.get("engine", {}).get("attention_backend")
    if baked_backend != here_backend:
        lines.append(f"engine: attention backend was {baked_backend} at warm, {here_backend} here")
    baked_env, here_env = baked.get("environment", {}), here.get("environment", {})
    for group in ("variables", "triton"):
        old, new = baked_env.get(group, {}), here_env.get(group, {})
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                lines.append(f"environment: {name} was {_shown(old.get(name))} at warm, {_shown(new.get(name))} here")
    if baked.get("kprecompile") != here.get("kprecompile"):
        lines.append(f"kprecompile {baked.get('kprecompile')} wrote it; this is {here.get('kprecompile')}")
    return lines


def _shown(value: object) -> str:
    return "unset" if value is None else repr(value)
