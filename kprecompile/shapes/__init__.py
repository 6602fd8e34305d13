"""Kernel families: one module each, one registry.

Each module exports one `KernelFamily` (`FAMILY`): the shapes the engine produces for a model
within the serving limits (pure data, no torch), how `plan` shows them, where the family does
not run, the library modules its call imports, and the engine's real call on meta tensors.
Adding a family is one new module named as the family, its name in `FamilyName`, and the engine
rule that selects it (`selection/engines.py`). Imports `vllm`, `tracing` and below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, get_args

from .family import FamilyName, KernelFamily

FAMILY_NAMES: tuple[FamilyName, ...] = get_args(FamilyName)
# FAMILIES is built on first use (PEP 562), each family's module named as the family: what only
# names families (the engine rules, `verify`, a warm `warm`) does not import all thirteen.

if TYPE_CHECKING:
    FAMILIES: dict[FamilyName, KernelFamily[Any]]


def __getattr__(name: str) -> Any:
    if name != "FAMILIES":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    families = {}
    for module in FAMILY_NAMES:
        family = importlib.import_module(f"{__name__}.{module}").FAMILY
        families[family.name] = family
    globals()["FAMILIES"] = families
    return families


__all__ = ["FAMILIES", "FAMILY_NAMES", "FamilyName", "KernelFamily"]
