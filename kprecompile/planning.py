"""`plan`: model + serving parameters + engine selection + targets -> the unique kernels to compile.

The engine's selection says which families run (and why the others are not planned); each
planned family's shapes are enumerated, its provider says whether it runs on each target, and
the provider's real calls are traced into compile jobs. Nothing is compiled.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .cache.layout import CacheLayout
from .cache.toolchain import triton_key_text
from .engines import Selection, select
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
    # The engine backend (or flag) that runs this family.
    backend: str = ""


@dataclass(frozen=True)
class Plan:
    model: str
    serving: ServingParams
    selection: Selection
    targets: tuple[str, ...]
    families: tuple[FamilyPlan, ...]
    jobs: tuple[CompileJob, ...] = field(repr=False)
    # Tracing alone, and the library imports and toolchain key before it.
    trace_seconds: float
    import_seconds: float = 0.0

    @property
    def kernels(self) -> int:
        return len(self.jobs)

    def summary(self) -> dict[str, Any]:
        """The JSON document of `kprecompile plan --json`."""
        return {
            "model": self.model,
            "serving": self.serving.as_dict(),
            "engine": self.selection.as_dict(),
            "targets": list(self.targets),
            "families": [vars(family) for family in self.families],
            "kernels": self.kernels,
            "trace_seconds": self.trace_seconds,
            "import_seconds": self.import_seconds,
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


def plan_family(
    family: FamilyShapes, target: Target, backend: str = "", triton_key: str | None = None
) -> tuple[FamilyPlan, tuple[CompileJob, ...]]:
    provider = provider_for(family.family)
    skipped = family.unsupported or skip_reason(family.family, target)
    if skipped:
        plan = FamilyPlan(family.family, target.name, len(family.shapes), 0, family.parameters, skipped, backend)
        return plan, ()
    calls = ((provider.describe(shape), partial(provider.launch, shape, target)) for shape in family.shapes)
    result = trace_calls(calls, target, family.family, provider.module_prefixes, triton_key)
    plan = FamilyPlan(family.family, target.name, result.calls, len(result.jobs), family.parameters, None, backend)
    return plan, result.jobs


def planned_shapes(model: ModelConfig, serving: ServingParams, selection: Selection) -> tuple[FamilyShapes, ...]:
    """The shapes of every family the selection plans (input errors surface here)."""
    serving.check(model)
    return enumerate_shapes(model, serving, selection.planned)


def plan(
    model: ModelConfig,
    serving: ServingParams,
    targets: Sequence[Target],
    selection: Selection | None = None,
    families: Sequence[FamilyShapes] | None = None,
    layout: CacheLayout | None = None,
) -> Plan:
    """Trace every selected family's calls on every target.

    `selection` defaults to the default engine under this process's environment; `families`
    to `planned_shapes`. Families the engine runs but kprecompile does not plan are listed
    with the reason. `layout` is where Triton's toolchain key is remembered between runs.
    """
    imports_started = time.perf_counter()
    if selection is None:
        selection = select(model)
    if families is None:
        families = planned_shapes(model, serving, selection)
    by_name = {family.family: family for family in families}
    triton_key = None
    if any(family.shapes for family in families):
        # Libraries first, timed apart: importing torch alone takes about a second.
        import torch  # noqa: F401
        import triton  # noqa: F401

        triton_key = triton_key_text(layout)
    started = time.perf_counter()
    import_seconds = started - imports_started
    plans: list[FamilyPlan] = []
    jobs: dict[str, CompileJob] = {}
    for target in targets:
        for choice in selection.choices:
            if choice.not_planned is not None:
                plans.append(FamilyPlan(choice.family, target.name, 0, 0, {}, choice.not_planned, choice.backend))
                continue
            if choice.family not in by_name:
                continue
            family_plan, family_jobs = plan_family(by_name[choice.family], target, choice.backend, triton_key)
            plans.append(family_plan)
            for job in family_jobs:
                jobs.setdefault(job.key, job)
    return Plan(
        model=model.name,
        serving=serving,
        selection=selection,
        targets=tuple(target.name for target in targets),
        families=tuple(plans),
        jobs=tuple(jobs.values()),
        trace_seconds=time.perf_counter() - started,
        import_seconds=import_seconds,
    )
