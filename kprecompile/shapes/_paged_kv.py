"""What the paged-KV attention families share: the fields a paged KV cache takes from the model
and serving settings, its storage classes, its element type and block count on meta tensors,
and how `plan` shows it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    import torch

    from ..inputs.models import ModelConfig
    from ..inputs.serving import ServingParams
    from ..inputs.targets import Target
    from ..vllm.releases import ReleaseLine

# On ROCm, Triton specializes a pointer on whether its tensor's storage fits in 2 GiB (buffer
# ops). A KV cache is one tensor per layer whose size depends on free GPU memory, so either
# side is reachable: attention families plan both.
# From vLLM 0.19 its TRITON_ATTN bounds key and value views by their layer's region: the keys of a
# layer can span more than 2 GiB while its values (one head later) do not (`triton_attn.py`).
StorageClass = Literal["under_2gib", "over_2gib", "straddles_2gib"]
KV_CACHE_STORAGE_CLASSES: tuple[StorageClass, ...] = ("under_2gib", "over_2gib")
TWO_GIB = 2**31


@dataclass(frozen=True)
class PagedAttentionShape:
    """One engine step of a paged-KV attention call: AITER's unified attention, vLLM's backends."""

    q_heads: int
    kv_heads: int
    head_size: int
    block_size: int
    # Columns of the engine's block table: blocks of the longest sequence.
    max_blocks_per_seq: int
    num_seqs: int
    tokens: int
    max_query_len: int
    max_seq_len: int
    # Tokens each query attends back to, 0 for full attention.
    sliding_window: int
    dtype: str
    kv_cache_fp8: bool
    kv_cache_storage: StorageClass
    # tanh soft-cap of the logits (0.0: none) and the sinks' dtype ("": none), as the layer has them.
    logits_soft_cap: float = 0.0
    sinks: str = ""


ShapeT = TypeVar("ShapeT")
Enumerate = Callable[["ModelConfig", "ServingParams", "ReleaseLine | None"], tuple[ShapeT, ...]]


def per_layer_kind(enumerate_shapes: Enumerate[ShapeT]) -> Enumerate[ShapeT]:
    """A family's shapes for every distinct attention layer of the model (`inputs/layers.py`):
    `enumerate_shapes` is written for one kind (`paged_kv_fields` reads it) and called once per kind."""

    @functools.wraps(enumerate_shapes)
    def each_kind(model: ModelConfig, serving: ServingParams, line: ReleaseLine | None) -> tuple[ShapeT, ...]:
        if model.mla is not None:
            return enumerate_shapes(model, serving, line)
        shapes: dict[ShapeT, None] = {}
        for kind in model.layer_kinds(serving):
            for shape in enumerate_shapes(replace(model, attention_layers=(kind,)), serving, line):
                shapes.setdefault(shape, None)
        return tuple(shapes)

    return each_kind


def paged_kv_fields(model: ModelConfig, serving: ServingParams) -> dict[str, Any]:
    """The fields every paged-KV attention shape takes from the model's one layer kind (see
    `per_layer_kind`) and the serving settings."""
    kinds = model.layer_kinds(serving)
    if len(kinds) != 1:
        raise ValueError(f"{model.name} has {len(kinds)} kinds of attention layers: enumerate with per_layer_kind")
    [kind] = kinds
    model_len = serving.model_len(model)
    return {
        "q_heads": kind.num_heads,
        "kv_heads": kind.num_kv_heads,
        "head_size": kind.head_size,
        "block_size": serving.block_size,
        "max_blocks_per_seq": -(-model_len // serving.block_size),
        "sliding_window": kind.sliding_window,
        "dtype": kind.dtype,
        "kv_cache_fp8": kind.kv_cache_dtype != "auto",
        "logits_soft_cap": kind.logits_soft_cap,
        "sinks": kind.sinks,
    }


def kv_cache_parameters(first: Any, shapes: tuple[Any, ...] = (), **varying: object) -> dict[str, object]:
    """What `plan` shows for a paged-attention family: heads, head and block size, what varies,
    the KV cache's type and the sliding window."""
    parameters: dict[str, object] = {
        "heads_per_rank": f"{first.q_heads}q/{first.kv_heads}kv",
        "head_size": first.head_size,
        "block_size": first.block_size,
        **varying,
        "kv_cache": "fp8" if first.kv_cache_fp8 else first.dtype,
    }
    windows = sorted({shape.sliding_window for shape in shapes}) if shapes else [first.sliding_window]
    if any(windows):
        parameters["sliding_window"] = ",".join(str(window or "full") for window in windows)
    if getattr(first, "logits_soft_cap", 0.0):
        parameters["logits_soft_cap"] = first.logits_soft_cap
    if getattr(first, "sinks", ""):
        parameters["sinks"] = first.sinks
    return parameters


def cache_element(model_dtype: str, fp8: bool, target: Target) -> tuple[torch.dtype, int]:
    """The KV cache's element type (the model dtype, or the target's FP8 type) and its size."""
    import torch

    if not fp8:
        element_type = getattr(torch, model_dtype)
    elif target.fp8_dtype is None:
        raise ValueError(f"{target.name} has no FP8 type for an FP8 KV cache")
    else:
        element_type = target.fp8_dtype
    return element_type, torch.empty((), dtype=element_type, device="meta").element_size()


def block_count(needed: int, bytes_per_block: int, storage: StorageClass) -> int:
    """Blocks in the per-layer KV tensor: enough for the call, and over 2 GiB in all when the
    shape's storage class says so (Triton's buffer-ops specialization on ROCm)."""
    if storage == "under_2gib":
        return max(needed, 1)
    return max(needed, TWO_GIB // bytes_per_block + 1)
