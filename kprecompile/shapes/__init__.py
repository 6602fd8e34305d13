"""Shape enumeration: model config + serving parameters -> the calls an engine will make.

Pure data, no torch: each family module turns the config into frozen shape records, one per
library call the engine makes within the serving limits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..models import ModelConfig
from ..serving import ServingParams
from . import fp8_bmm, mla_decode, mla_prefill, pa_prefill, paged_attention


@dataclass(frozen=True)
class FamilyShapes:
    family: str
    shapes: tuple[object, ...]
    # The dimensions that decide this family's kernels, for display.
    parameters: dict[str, object]
    # Why the family cannot be planned for this model and these settings, or None.
    unsupported: str | None = None


@dataclass(frozen=True)
class _Family:
    enumerate: Callable[[ModelConfig, ServingParams], tuple[object, ...]]
    describe: Callable[[tuple[object, ...]], dict[str, object]]
    unsupported: Callable[[ModelConfig, ServingParams], str | None] = lambda model, serving: None


_FAMILIES: dict[str, _Family] = {
    fp8_bmm.FAMILY: _Family(fp8_bmm.enumerate_fp8_bmm, fp8_bmm.describe_parameters),
    mla_decode.FAMILY: _Family(
        mla_decode.enumerate_mla_decode, mla_decode.describe_parameters, mla_decode.unsupported_reason
    ),
    mla_prefill.FAMILY: _Family(mla_prefill.enumerate_mla_prefill, mla_prefill.describe_parameters),
    paged_attention.PREFIX_PREFILL: _Family(
        paged_attention.enumerate_prefix_prefill, paged_attention.describe_parameters
    ),
    paged_attention.PAGED_DECODE: _Family(paged_attention.enumerate_paged_decode, paged_attention.describe_parameters),
    pa_prefill.FAMILY: _Family(pa_prefill.enumerate_pa_prefill, pa_prefill.describe_parameters),
}

FAMILIES = tuple(_FAMILIES)


def enumerate_shapes(
    model: ModelConfig, serving: ServingParams, families: Sequence[str] | None = None
) -> tuple[FamilyShapes, ...]:
    """The families (all, or those named) this model uses under these settings, with their shapes.

    Families with no shapes (for example FP8 BMM on a model without MLA) are left out; one the
    settings rule out is kept with its reason and no shapes.
    """
    found = []
    for name in FAMILIES if families is None else families:
        family = _FAMILIES[name]
        reason = family.unsupported(model, serving)
        if reason:
            found.append(FamilyShapes(name, (), {}, reason))
            continue
        shapes = family.enumerate(model, serving)
        if shapes:
            found.append(FamilyShapes(name, shapes, family.describe(shapes)))
    return tuple(found)
