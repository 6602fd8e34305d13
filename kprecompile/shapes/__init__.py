"""Kernel families: one module each, one registry.

Each module exports one `KernelFamily` (`FAMILY`): the shapes the engine produces for a model
within the serving limits (pure data, no torch), how `plan` shows them, where the family does
not run, the library modules its call imports, and the engine's real call on meta tensors.
Adding a family is one new module, its name in `FamilyName`, its module's name here, and the
engine rule that selects it (`selection/engines.py`). Imports `vllm`, `tracing` and below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, get_args

from .family import FamilyName, KernelFamily

# Each family's module, in the registry's order: imported with the registry, on first use of
# FAMILIES (PEP 562), so that what only names families (the engine rules, `verify`, a warm
# `warm`) does not import all twelve.
_MODULES = (
    "aiter_fa_context",
    "block_fp8_linear",
    "fp8_bmm",
    "mla_decode",
    "mla_merge",
    "mla_prefill",
    "prefix_prefill",
    "paged_decode",
    "pa_prefill",
    "rocm_attn",
    "triton_attn",
    "triton_mla",
)
FAMILY_NAMES: tuple[FamilyName, ...] = get_args(FamilyName)

if TYPE_CHECKING:
    FAMILIES: dict[FamilyName, KernelFamily[Any]]


def __getattr__(name: str) -> Any:
    if name != "FAMILIES":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    families = {}
    for module in _MODULES:
        family = importlib.import_module(f"{__name__}.{module}").FAMILY
        families[family.name] = family
    globals()["FAMILIES"] = families
    return families


__all__ = ["FAMILIES", "FAMILY_NAMES", "FamilyName", "KernelFamily"]
