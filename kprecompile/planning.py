"""`plan`: model + serving parameters + targets -> the unique kernels to compile.

Enumerates each family's shapes, asks its provider whether it runs on each target, and
traces the provider's real calls into compile jobs. Nothing is compiled.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .models import ModelConfig
from .providers import Provider, provider_for
from .serving import ServingParams
from .shapes import FamilyShapes, enumerate_shapes
from .targets import Target
from .trace import CompileJob, trace_calls


@dataclass(frozen=True)
class FamilyPlan:
    name: str
    target: str
    # Library calls enumerated for this family (one per shape record).
    calls: int
    # Unique kernels those calls compile.
    kernels: int
    parameters: dict[str, Any]
    # Why this family is not compiled for this target, or None.
    skipped: str | None = None


@dataclass(frozen=True)
class Plan:
    model: str
    serving: ServingParams
    targets: tuple[str, ...]
    families: tuple[FamilyPlan, ...]
    jobs: tuple[CompileJob, ...] = field(repr=False)
    trace_seconds: float

    @property
    def kernels(self) -> int:
        return len(self.jobs)

    def summary(self) -> dict[str, Any]:
        """The JSON document of `kprecompile plan --json`."""
        return {
            "model": self.model,
            "serving": self.serving.as_dict(),
            "targets": list(self.targets),
            "families": [vars(family) for family in self.families],
            "kernels": self.kernels,
            "trace_seconds": self.trace_seconds,
        }


def _missing_library(provider: Provider) -> str | None:
    top_level = provider.module_prefixes[0].partition(".")[0]
    if importlib.util.find_spec(top_level) is None:
        return f"{provider.library} is not installed here"
    return None


def skip_reason(family: str, target: Target) -> str | None:
    """Why `family` is not compiled for `target` (unsupported there, library missing), or None."""
    provider = provider_for(family)
    return provider.unsupported_reason(target) or _missing_library(provider)


def plan_family(family: FamilyShapes, target: Target) -> tuple[FamilyPlan, tuple[CompileJob, ...]]:
    provider = provider_for(family.family)
    skipped = skip_reason(family.family, target)
    if skipped:
        return FamilyPlan(family.family, target.name, len(family.shapes), 0, family.parameters, skipped), ()
    calls = ((provider.describe(shape), partial(provider.launch, shape, target)) for shape in family.shapes)
    result = trace_calls(calls, target, family.family, provider.module_prefixes)
    return FamilyPlan(family.family, target.name, result.calls, len(result.jobs), family.parameters), result.jobs


def plan(
    model: ModelConfig,
    serving: ServingParams,
    targets: Sequence[Target],
    families: Sequence[FamilyShapes] | None = None,
) -> Plan:
    """Trace every family's calls on every target. `families` defaults to `enumerate_shapes`."""
    started = time.perf_counter()
    if families is None:
        families = enumerate_shapes(model, serving)
    plans: list[FamilyPlan] = []
    jobs: dict[str, CompileJob] = {}
    for target in targets:
        for family in families:
            family_plan, family_jobs = plan_family(family, target)
            plans.append(family_plan)
            for job in family_jobs:
                jobs.setdefault(job.key, job)
    return Plan(
        model=model.name,
        serving=serving,
        targets=tuple(target.name for target in targets),
        families=tuple(plans),
        jobs=tuple(jobs.values()),
        trace_seconds=time.perf_counter() - started,
    )
