"""`plan`: model + serving parameters + engine selection + targets -> the unique kernels to compile.

The engine's selection says which families run (and why the others are not compiled); each
planned family's shapes are enumerated, the family says whether it runs on each target, and
its real calls are traced into compile jobs. Nothing is compiled. A family that cannot run here
for a known reason is a skipped row; one whose trace raises is a failed row (`FamilyPlan.error`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..cache.jobs import CompileJob
from ..cache.layout import CacheLayout
from ..errors import InputError, LibraryUnavailableError, TracingError
from ..inputs.environment import DEFAULT_ENGINE, engine_environment
from ..inputs.layers import AttentionLayer
from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..inputs.toolchain import aiter_version, triton_key_text
from ..selection.engines import Selection
from ..selection.request import Request
from ..shapes import FAMILIES, FamilyName
from ..tracing.libraries import AITER_DISTRIBUTION, VLLM_DISTRIBUTION, aiter_module_lacking
from ..tracing.trace import trace_calls
from ..vllm.aiter_source import AITER_REPOSITORY, AiterIdentity, aiter_identity, aiter_pin
from ..vllm.engine_config import remember_model_directory
from ..vllm.releases import DEFAULT_RELEASE, TESTED_RELEASES, ReleaseLine, release_line, serving_capture_sizes
from .family_plan import FamilyPlan

logger = logging.getLogger(__name__)

# Each planned family's shapes, in selection order.
PlannedShapes = Mapping[FamilyName, tuple[Any, ...]]


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
    # The serving parameters as the engine resolves them for this model (`dtype` "auto" and an
    # unset `max_model_len` replaced by their values): what the cache keys and the JSON shows; the
    # capture sizes are the first target's (from 0.28 sm100 GPUs capture up to 1024 by default).
    resolved_serving: dict[str, Any] = field(default_factory=dict, repr=False)
    # The model's distinct attention layers the families were planned for, and who built them.
    layers: tuple[AttentionLayer, ...] = ()
    layers_source: str = ""
    # The AITER this plan imported, where a target is ROCm (None otherwise).
    aiter: AiterIdentity | None = None

    @property
    def kernels(self) -> int:
        return len(self.jobs)

    @property
    def missing(self) -> tuple[FamilyPlan, ...]:
        """The families skipped because this builder lacks what they need."""
        return tuple(family for family in self.families if family.missing is not None)

    @property
    def failed(self) -> tuple[FamilyPlan, ...]:
        """The families whose planning failed: the plan lacks their kernels."""
        return tuple(family for family in self.families if family.error is not None)

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of `kprecompile plan --json`."""
        return {
            "model": self.model,
            "serving": {**self.resolved_serving, "enforce_eager": self.serving.enforce_eager},
            "engine": self.selection.as_dict(),
            "targets": list(self.targets),
            "layers": {"source": self.layers_source, "kinds": [layer.as_dict() for layer in self.layers]},
            "families": [family.as_dict() for family in self.families],
            "kernels": self.kernels,
            "failed": len(self.failed),
            "trace_seconds": self.trace_seconds,
            "import_seconds": self.import_seconds,
            "aiter": self.aiter.as_dict() if self.aiter is not None else None,
        }


def planned_line(selection: Selection) -> ReleaseLine | None:
    """The release line the families are planned for: the selection's vLLM release's (None under
    the aiter engine, which has no vLLM)."""
    return release_line(selection.vllm_release) if selection.vllm_release else None


def planned_shapes(model: ModelConfig, serving: ServingParams, selection: Selection) -> dict[FamilyName, tuple]:
    """The shapes of every family the selection plans (input errors surface here). Families
    with nothing to do for this model are left out."""
    serving.check(model)
    line = planned_line(selection)
    shapes = {
        choice.family: FAMILIES[choice.family].enumerate_shapes(_layers_of(model, choice.backend), serving, line)
        for choice in selection.choices
        if choice.skip_reason is None
    }
    return {name: found for name, found in shapes.items() if found}


def _layers_of(model: ModelConfig, backend: str) -> ModelConfig:
    """`model` with only the attention layers vLLM gave `backend`, where its own model chose them
    per layer (families of other backends see none of them); else `model` as it is."""
    if not any(layer.backend == backend for layer in model.attention_layers):
        return model
    return replace(model, attention_layers=tuple(layer for layer in model.attention_layers if layer.backend == backend))


def compiled_families(
    model: ModelConfig, serving: ServingParams, shapes: PlannedShapes, target: Target, line: ReleaseLine | None
) -> list[FamilyName]:
    """The families of `shapes` that compile something on `target` in the planned release line."""
    return [
        name
        for name, found in shapes.items()
        if found and FAMILIES[name].skip_reason(model, serving, target, line) is None
    ]


def plan_family(
    name: FamilyName,
    shapes: tuple[Any, ...],
    model: ModelConfig,
    serving: ServingParams,
    target: Target,
    line: ReleaseLine | None,
    backend: str = "",
    triton_key: str | None = None,
    engine: str = DEFAULT_ENGINE,
    release: str | None = None,
    on_jobs: Callable[[tuple[CompileJob, ...]], None] | None = None,
) -> tuple[FamilyPlan, tuple[CompileJob, ...]]:
    """One family's row and jobs on `target`; `on_jobs` is handed its jobs while it traces."""
    family = FAMILIES[name]
    parameters = family.describe_shapes(shapes) if shapes else {}
    skip_reason = family.skip_reason(model, serving, target, line)
    if skip_reason:
        return FamilyPlan(name, target.name, len(shapes), 0, parameters, skip_reason, backend), ()
    try:
        with engine_environment(engine):
            calls = family.calls(shapes, target)
            groups = family.groups(shapes)
            result = trace_calls(calls, target, name, family.traced_modules, triton_key, on_jobs, groups)
    except TracingError as error:
        cause = error.__cause__
        if isinstance(cause, InputError):
            raise cause from None
        if isinstance(cause, LibraryUnavailableError):
            plan = FamilyPlan(name, target.name, len(shapes), 0, parameters, str(cause), backend, missing=cause.library)
            return plan, ()
        lacking = aiter_module_lacking(cause)
        if lacking is not None:
            pin = aiter_pin(release)
            own = f"AITER {pin}, which vLLM {release}'s ROCm image builds" if pin else "the release's own AITER"
            reason = (
                f"{backend or name} imports {lacking}, which the installed {AITER_DISTRIBUTION} "
                f"{aiter_version()} lacks: planning it needs {own} (kprecompile engine install "
                f"vllm=={release or 'VERSION'} --aiter-source <a clone of {AITER_REPOSITORY}>)"
            )
            plan = FamilyPlan(name, target.name, len(shapes), 0, parameters, reason, backend, missing=lacking)
            return plan, ()
        # A failed family fails the command, never the rest of the plan (or a server's warm).
        reason = str(error)
        if family.library == VLLM_DISTRIBUTION:
            reason += f" (kprecompile is tested against vLLM {', '.join(TESTED_RELEASES)})"
        logger.debug("%s on %s failed", name, target.name, exc_info=cause)
        return FamilyPlan(name, target.name, len(shapes), 0, parameters, None, backend, reason), ()
    return FamilyPlan(name, target.name, result.calls, len(result.jobs), parameters, None, backend), result.jobs


def _nothing_for_lack(plans: list[FamilyPlan]) -> list[FamilyPlan]:
    """A target's family plans, where it compiles nothing because this builder lacks what its
    families need, with those families failed: an empty warm must not pass (a CI bake would go
    green with an empty cache), and the target must never be recorded as warm."""
    if any(family.kernels for family in plans) or not any(family.missing for family in plans):
        return plans
    return [
        replace(
            family,
            skip_reason=None,
            error=f"nothing compiles on this builder without {family.missing}: {family.skip_reason}",
        )
        if family.missing
        else family
        for family in plans
    ]


def plan(
    request: Request,
    *,
    shapes: PlannedShapes | None = None,
    layout: CacheLayout | None = None,
    on_jobs: Callable[[tuple[CompileJob, ...]], None] | None = None,
) -> Plan:
    """Trace every selected family's calls on every target of the request.

    `shapes` defaults to `planned_shapes`. Families the engine runs but kprecompile does not
    compile are listed with the reason; a family whose trace failed, with its error (`Plan.failed`:
    the plan lacks its kernels; the rest is planned). `layout` is where Triton's toolchain key is remembered
    between runs. `on_jobs` is handed jobs as they are traced, each step's (a warm's workers compile
    them while the trace goes on), then each family's again with those forked processes found (a key
    can come twice: the receiver keeps the first). A family that fails has handed over what it
    traced before failing (a warm takes it back: `CompilePool.cancel`).
    """
    imports_started = time.perf_counter()
    model, serving, selection, targets = request.model, request.serving, request.selection, request.targets
    if shapes is None:
        shapes = planned_shapes(model, serving, selection)
    remember_model_directory(model.config_json, model.directory)
    triton_key = None
    if any(shapes.values()):
        # Libraries first, timed apart: importing torch alone takes about a second.
        import torch  # noqa: F401
        import triton  # noqa: F401

        triton_key = triton_key_text(layout)
    started = time.perf_counter()
    import_seconds = started - imports_started
    logger.info("shapes, torch, Triton and the toolchain's key in %.2f s", import_seconds)
    plans: list[FamilyPlan] = []
    jobs: dict[str, CompileJob] = {}
    line = planned_line(selection)
    for target in targets:
        first = len(plans)
        for choice in selection.choices:
            # The target's own reason first: where the engine runs prebuilt kernels on it, what
            # this builder lacks does not matter there.
            skip_reason = choice.skip_reason_on(target.name) or choice.skip_reason
            if skip_reason is not None:
                missing = choice.missing if choice.skip_reason_on(target.name) is None else None
                plans.append(
                    FamilyPlan(choice.family, target.name, 0, 0, {}, skip_reason, choice.backend, None, missing)
                )
                continue
            if choice.family not in shapes:
                continue
            family_plan, family_jobs = plan_family(
                choice.family,
                shapes[choice.family],
                model,
                serving,
                target,
                line,
                choice.backend,
                triton_key,
                selection.engine,
                selection.vllm_release,
                on_jobs,
            )
            plans.append(family_plan)
            new = tuple(job for job in family_jobs if job.key not in jobs)
            jobs.update((job.key, job) for job in new)
            if on_jobs is not None and new:
                on_jobs(new)
        plans[first:] = _nothing_for_lack(plans[first:])
    return Plan(
        model=model.name,
        serving=serving,
        selection=selection,
        targets=tuple(target.name for target in targets),
        families=tuple(plans),
        jobs=tuple(jobs.values()),
        trace_seconds=time.perf_counter() - started,
        import_seconds=import_seconds,
        layers=model.layer_kinds(serving),
        aiter=aiter_identity(selection.vllm_release) if any(target.is_rocm for target in targets) else None,
        layers_source=model.attention_layers and model.layers_source or ModelConfig.layers_source,
        resolved_serving=serving.resolved(
            model,
            serving_capture_sizes(
                serving, selection.vllm_release or DEFAULT_RELEASE, model, targets[0] if targets else None
            ),
        ),
    )
