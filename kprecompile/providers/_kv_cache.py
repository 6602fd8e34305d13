"""What the attention providers share about a paged KV cache on meta tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..shapes._common import TWO_GIB
from ..targets import Target

if TYPE_CHECKING:
    import torch


def cache_dtype(model_dtype: str, fp8: bool, target: Target) -> torch.dtype:
    """The KV cache's element type: the model dtype, or the target's FP8 type."""
    import torch

    if not fp8:
        return getattr(torch, model_dtype)
    if target.fp8_dtype is None:
        raise ValueError(f"{target.name} has no FP8 type for an FP8 KV cache")
    return target.fp8_dtype


def block_count(needed: int, bytes_per_block: int, storage: str) -> int:
    """Blocks in the per-layer KV tensor: enough for the call, and over 2 GiB in all when the
    shape's storage class says so (Triton's buffer-ops specialization on ROCm)."""
    if storage == "under_2gib":
        return max(needed, 1)
    return max(needed, TWO_GIB // bytes_per_block + 1)
