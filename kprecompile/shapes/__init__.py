"""Kernel families: one module each, one registry.

Each module exports one `KernelFamily` (`FAMILY`): the shapes the engine produces for a model
within the serving limits (pure data, no torch), how `plan` shows them, where the family does
not run, the library modules its call imports, and the engine's real call on meta tensors.
Adding a family is one new module, its name in `FamilyName`, one line here, and the engine
rule that selects it (`selection/engines.py`). Imports `vllm`, `tracing` and below.
"""

from __future__ import annotations

from typing import Any, get_args

from . import (
    aiter_fa_context,
    block_fp8_linear,
    fp8_bmm,
    mla_decode,
    mla_merge,
    mla_prefill,
    pa_prefill,
    paged_decode,
    prefix_prefill,
    rocm_attn,
    triton_attn,
    triton_mla,
)
from .family import FamilyName, KernelFamily

FAMILIES: dict[FamilyName, KernelFamily[Any]] = {
    family.name: family
    for family in (
        aiter_fa_context.FAMILY,
        block_fp8_linear.FAMILY,
        fp8_bmm.FAMILY,
        mla_decode.FAMILY,
        mla_merge.FAMILY,
        mla_prefill.FAMILY,
        prefix_prefill.FAMILY,
        paged_decode.FAMILY,
        pa_prefill.FAMILY,
        rocm_attn.FAMILY,
        triton_attn.FAMILY,
        triton_mla.FAMILY,
    )
}
FAMILY_NAMES: tuple[FamilyName, ...] = get_args(FamilyName)

__all__ = ["FAMILIES", "FAMILY_NAMES", "FamilyName", "KernelFamily"]
