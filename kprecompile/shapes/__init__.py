"""Shape enumeration: model config + serving parameters -> the calls an engine will make.

Pure data, no torch: each family module turns the config into frozen shape records, one per
library call the engine makes within the serving limits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..models import ModelConfig
from ..serving import ServingParams
from . import fp8_bmm


@dataclass(frozen=True)
class FamilyShapes:
    family: str
    shapes: tuple[object, ...]
    # The dimensions that decide this family's kernels, for display.
    parameters: dict[str, object]


@dataclass(frozen=True)
class _Family:
    enumerate: Callable[[ModelConfig, ServingParams], tuple[object, ...]]
    describe: Callable[[tuple[object, ...]], dict[str, object]]


_FAMILIES: dict[str, _Family] = {
    fp8_bmm.FAMILY: _Family(fp8_bmm.enumerate_fp8_bmm, fp8_bmm.describe_parameters),
}

FAMILIES = tuple(_FAMILIES)


def enumerate_shapes(model: ModelConfig, serving: ServingParams) -> tuple[FamilyShapes, ...]:
    """The kernel families this model uses under these settings, with their shapes.

    Families with no shapes (for example FP8 BMM on a model without MLA) are left out.
    """
    found = []
    for name, family in _FAMILIES.items():
        shapes = family.enumerate(model, serving)
        if shapes:
            found.append(FamilyShapes(name, shapes, family.describe(shapes)))
    return tuple(found)
