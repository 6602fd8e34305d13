"""Prefix-prefill shapes for AITER's Triton `pa_prefill.context_attention_fwd`.

The kernel vLLM's older ROCm paths (and AITER's own API) use for prefill over a paged KV
cache: new tokens' q/k/v (tokens, heads, head_size), the cache in vLLM's paged layout (K as
[blocks, kv_heads, head_size / x, block_size, x] with x = 16 bytes of elements, V as
[blocks, kv_heads, head_size, block_size]), one block-table row per sequence. It carries no
AMD-only launch options, so it also runs on NVIDIA GPUs. Batch size and lengths only size the
grid; the plan still walks sequence counts and query lengths, and the coverage test checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models import ModelConfig
from ..serving import ServingParams
from ._common import KV_CACHE_STORAGE_CLASSES, geometric_points, int_class_representatives
from .paged_attention import StorageClass, kv_cache_parameters, paged_kv_fields

FAMILY = "pa_prefill"


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


def enumerate_pa_prefill(model: ModelConfig, serving: ServingParams) -> tuple[PaPrefillShape, ...]:
    if model.mla is not None:
        return ()
    model_len = serving.model_len(model)
    budget = min(serving.max_num_batched_tokens, model_len)
    base = paged_kv_fields(model, serving)
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


def describe_parameters(shapes: tuple[PaPrefillShape, ...]) -> dict[str, object]:
    return kv_cache_parameters(
        shapes[0],
        batch=",".join(str(b) for b in sorted({shape.batch for shape in shapes})),
        max_query_len=f"1..{max(shape.max_query_len for shape in shapes)}",
    )
