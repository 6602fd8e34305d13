"""Prefix prefill through AITER's Triton `pa_prefill.context_attention_fwd`, AITER's API called directly.

The kernel vLLM's older ROCm paths (and AITER's own API) use for prefill over a paged KV
cache: new tokens' q/k/v (tokens, heads, head_size), the cache in vLLM's paged layout (K as
[blocks, kv_heads, head_size / x, block_size, x] with x = 16 bytes of elements, V as
[blocks, kv_heads, head_size, block_size], both views of one per-layer tensor), one
block-table row per sequence; FP8 caches are viewed as the target's FP8 type with
`kv_cache_dtype="fp8"` and 0-d float32 scales. It carries no AMD-only launch options, so it
also runs on NVIDIA GPUs. Batch size and lengths only size the grid; the plan still walks
sequence counts and query lengths, and the coverage test checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import AITER_DISTRIBUTION, import_library_module
from ..vllm.releases import ReleaseLine
from ._paged_kv import (
    KV_CACHE_STORAGE_CLASSES,
    StorageClass,
    block_count,
    cache_element,
    kv_cache_parameters,
    paged_kv_fields,
    per_layer_kind,
)
from ._points import geometric_points, int_class_representatives
from .family import KernelFamily

WRAPPER_MODULE = "aiter.ops.triton.pa_prefill"


@dataclass(frozen=True)
class PaPrefillShape:
    q_heads: int
    kv_heads: int
    head_size: int
    block_size: int
    max_blocks_per_seq: int
    batch: int
    tokens: int
    max_query_len: int
    sliding_window: int
    dtype: str
    kv_cache_fp8: bool
    kv_cache_storage: StorageClass


@per_layer_kind
def enumerate_pa_prefill(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[PaPrefillShape, ...]:
    if model.mla is not None:
        return ()
    model_len = serving.model_len(model)
    budget = min(serving.max_num_batched_tokens, model_len)
    # AITER's context_attention_fwd takes neither a soft-cap nor sinks.
    base = {
        name: value
        for name, value in paged_kv_fields(model, serving).items()
        if name not in ("logits_soft_cap", "sinks")
    }
    shapes = []
    for storage in KV_CACHE_STORAGE_CLASSES:
        for batch in int_class_representatives(min(serving.max_num_seqs, budget)):
            for query_len in geometric_points(1, budget // batch):
                shapes.append(
                    PaPrefillShape(
                        **base, batch=batch, tokens=batch * query_len, max_query_len=query_len, kv_cache_storage=storage
                    )
                )
    return tuple(shapes)


def describe_shapes(shapes: tuple[PaPrefillShape, ...]) -> dict[str, object]:
    return kv_cache_parameters(
        shapes[0],
        shapes,
        batch=",".join(str(b) for b in sorted({shape.batch for shape in shapes})),
        max_query_len=f"1..{max(shape.max_query_len for shape in shapes)}",
    )


def describe_call(shape: PaPrefillShape) -> str:
    return f"context_attention_fwd(batch={shape.batch}, tokens={shape.tokens}, kv_cache {shape.kv_cache_storage})"


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    return None


def launch(shape: PaPrefillShape, target: Target) -> None:
    import torch

    wrapper = import_library_module(WRAPPER_MODULE)
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    element_type, element = cache_element(shape.dtype, shape.kv_cache_fp8, target)
    # K and V caches: the two halves of one per-layer tensor; K packs x = 16 bytes of elements.
    elements_per_block = shape.kv_heads * shape.head_size * shape.block_size
    blocks = block_count(
        shape.batch * shape.max_blocks_per_seq, 2 * elements_per_block * element, shape.kv_cache_storage
    )
    x = 16 // element
    storage = torch.empty((2, blocks * elements_per_block), dtype=element_type, device=meta)
    key_cache = storage[0].view(blocks, shape.kv_heads, shape.head_size // x, shape.block_size, x)
    value_cache = storage[1].view(blocks, shape.kv_heads, shape.head_size, shape.block_size)
    q = torch.empty((shape.tokens, shape.q_heads, shape.head_size), dtype=dtype, device=meta)
    k = torch.empty((shape.tokens, shape.kv_heads, shape.head_size), dtype=dtype, device=meta)
    v = torch.empty_like(k)
    out = torch.empty_like(q)
    block_table = torch.empty((shape.batch, shape.max_blocks_per_seq), dtype=torch.int32, device=meta)
    start_loc = torch.empty(shape.batch + 1, dtype=torch.int32, device=meta)
    seq_lens = torch.empty(shape.batch, dtype=torch.int32, device=meta)
    scale = torch.empty((), dtype=torch.float32, device=meta)
    wrapper.context_attention_fwd(
        q,
        k,
        v,
        out,
        "fp8" if shape.kv_cache_fp8 else "auto",
        key_cache,
        value_cache,
        block_table,
        start_loc,
        seq_lens,
        shape.max_query_len,
        scale,
        scale,
        sliding_window=shape.sliding_window or None,
    )


FAMILY = KernelFamily(
    name="pa_prefill",
    description="AITER's Triton prefix prefill (pa_prefill.context_attention_fwd) on vLLM's paged layout",
    library=AITER_DISTRIBUTION,
    traced_modules=("aiter.ops.triton",),
    enumerate_shapes=enumerate_pa_prefill,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
)
