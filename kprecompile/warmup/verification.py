"""`verify`: is this configuration fully warm in this process's environment, and if not, why.

In-process and fast: the manifest key is recomputed from the live environment and toolchain
(no torch, no tracing, no workers), its manifest read and every kernel's cache entry checked
(sizes; checksums too with `deep`; nothing more where every file's stat is that of the last whole
check), and the configuration's journal for kernels serving
processes compiled that no warm has compiled yet. Without a manifest for the key, the cache's other
manifests for the same model, serving parameters, engine selection and target say what
differs: the toolchain (Triton key, install path, Python, ptxas, versions) or a variable.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..cache.checked import checked_before
from ..cache.entries import driver_module_problem
from ..cache.layout import CacheLayout
from ..cache.manifest import job_problems, read_all_manifest_parts
from ..inputs.targets import Target
from ..inputs.toolchain import toolchain_differences
from ..selection.request import Request
from .manifest_key import SAME_CONFIGURATION, ManifestLookup, find_manifest
from .replay import recorded_here, unsettled

# "recorded": every kernel of the manifest is there, but serving processes recorded kernels in
# the configuration's journal that no warm has compiled yet (they would compile while serving).
Status = Literal["warm", "incomplete", "recorded", "mismatch", "not_warmed"]


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


# A problem's `kernel` where it is one of Triton's driver modules (its `specialization` is then
# the module's file name).
DRIVER_MODULE = "Triton's driver module"


def verify(request: Request, layout: CacheLayout, *, deep: bool = False) -> VerifyReport:
    started = time.perf_counter()
    model = request.model
    request.serving.check(model)
    verdicts = []
    parts: dict[str, Any] = {}
    for target in request.targets:
        # Nothing is written: verify may run against a read-only cache.
        lookup = find_manifest(request, target, layout, remember=False)
        parts = lookup.parts
        verdicts.append(_verify_target(layout, lookup, target, deep))
    return VerifyReport(
        model=model.name,
        warm=all(verdict.status == "warm" for verdict in verdicts),
        targets=tuple(verdicts),
        manifest_key_parts=tuple(parts),
        deep=deep,
        seconds=time.perf_counter() - started,
        cache_dir=str(layout.root),
    )


def _verify_target(layout: CacheLayout, lookup: ManifestLookup, target: Target, deep: bool) -> TargetVerdict:
    manifest = lookup.manifest
    if manifest is not None:
        # Unchanged since a whole check passed (`cache/checked.py`): more than sizes would say.
        unchanged = not deep and checked_before(layout, lookup.key, lookup.path, (job.key for job in manifest.jobs))
        problems = tuple(
            KernelProblem(job.kernel, job.describe_specialization(), job.key, problem.message)
            for job, problem in ([] if unchanged else job_problems(layout, manifest, deep))
        )
        # Triton's driver modules: a few small files, hashed every time.
        problems += tuple(
            KernelProblem(DRIVER_MODULE, problem[0], key, problem[1])
            for key, files in manifest.launchers.items()
            if (problem := driver_module_problem(layout, key, files)) is not None
        )
        status: Status = "incomplete" if problems else "warm"
        if not problems:
            problems = tuple(
                KernelProblem(
                    record.kernel,
                    record.describe(),
                    record.triton_key,
                    "compiled while serving, not by a warm yet",
                )
                for record in unsettled(recorded_here(layout, lookup, target), manifest)
            )
            status = "recorded" if problems else "warm"
        return TargetVerdict(target.name, status, str(lookup.path), len(manifest.jobs), problems, ())
    reasons = _differences(layout, lookup.parts)
    if reasons:
        return TargetVerdict(target.name, "mismatch", None, 0, (), reasons)
    return TargetVerdict(target.name, "not_warmed", None, 0, (), ("no manifest for this configuration",))


def _differences(layout: CacheLayout, parts: dict[str, Any]) -> tuple[str, ...]:
    """What differs between this process and the closest manifest in the cache: of the same
    configuration (model, serving parameters, target) if there is one, else of the same model
    (another --max-num-seqs, --family, target, ...)."""
    documents = [
        document
        for document in read_all_manifest_parts(layout)
        if document["parts"].get("schema") == parts.get("schema")
    ]
    same = [d for d in documents if all(d["parts"].get(name) == parts.get(name) for name in SAME_CONFIGURATION)]
    candidates = same or [d for d in documents if d["parts"].get("model_digest") == parts.get("model_digest")]
    if not candidates:
        return ()
    # The candidate with the fewest differing parts explains best.
    best = min(candidates, key=lambda document: len(_describe(document["parts"], parts)))
    return tuple(f"{line} (manifest {best['path']})" for line in _describe(best["parts"], parts))


def _describe(baked: dict[str, Any], here: dict[str, Any]) -> list[str]:
    lines = []
    if baked.get("target") != here.get("target"):
        lines.append(f"target: {baked.get('target')} at warm, {here.get('target')} here")
    baked_serving, here_serving = baked.get("serving", {}), here.get("serving", {})
    for name in sorted(set(baked_serving) | set(here_serving)):
        if baked_serving.get(name) != here_serving.get(name):
            option = "--" + name.replace("_", "-")
            lines.append(
                f"serving: {option} was {_shown(baked_serving.get(name))} at warm, "
                f"{_shown(here_serving.get(name))} here"
            )
    baked_planned = baked.get("engine", {}).get("planned")
    here_planned = here.get("engine", {}).get("planned")
    if baked_planned != here_planned:
        lines.append(
            f"engine: families {', '.join(baked_planned or []) or 'none'} at warm, "
            f"{', '.join(here_planned or []) or 'none'} here"
        )
    lines += toolchain_differences(baked.get("toolchain", {}), here.get("toolchain", {}))
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
