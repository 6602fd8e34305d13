"""AITER's `pa_prefill.context_attention_fwd` on vLLM's paged KV-cache layout.

K cache [blocks, kv_heads, head_size / x, block_size, x] and V cache [blocks, kv_heads,
head_size, block_size] (x = 16 bytes of elements), both views of one per-layer tensor; FP8
caches are viewed as the target's FP8 type with `kv_cache_dtype="fp8"` and 0-d float32 scales;
the block table is the first rows of a (max_num_seqs, max_blocks_per_seq) int32 table.
"""

from __future__ import annotations

from ..shapes.pa_prefill import PaPrefillShape
from ..targets import Target
from ._imports import import_library_module
from ._kv_cache import block_count, cache_dtype

WRAPPER_MODULE = "aiter.ops.triton.pa_prefill"


def unsupported_reason(target: Target) -> str | None:
    return None


def describe(shape: PaPrefillShape) -> str:
    return f"context_attention_fwd(batch={shape.batch}, tokens={shape.tokens}, kv_cache {shape.kv_cache_storage})"


def kv_cache_views(shape: PaPrefillShape, blocks: int, cache_dtype, device):
    """K and V caches in vLLM's paged layout, views of one per-layer tensor."""
    import torch

    x = 16 // torch.empty((), dtype=cache_dtype, device="meta").element_size()
    per_block = shape.kv_heads * shape.head_size * shape.block_size
    storage = torch.empty((2, blocks * per_block), dtype=cache_dtype, device=device)
    key_cache = storage[0].view(blocks, shape.kv_heads, shape.head_size // x, shape.block_size, x)
    value_cache = storage[1].view(blocks, shape.kv_heads, shape.head_size, shape.block_size)
    return key_cache, value_cache


def launch(shape: PaPrefillShape, target: Target) -> None:
    import torch

    wrapper = import_library_module(WRAPPER_MODULE)
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    element_type = cache_dtype(shape.dtype, shape.kv_cache_fp8, target)
    element = torch.empty((), dtype=element_type, device=meta).element_size()
    per_block = 2 * shape.kv_heads * shape.head_size * shape.block_size * element
    blocks = block_count(shape.batch * shape.max_blocks_per_seq, per_block, shape.kv_cache_storage)
    key_cache, value_cache = kv_cache_views(shape, blocks, element_type, meta)
    q = torch.empty((shape.tokens, shape.q_heads, shape.head_size), dtype=dtype, device=meta)
    k = torch.empty((shape.tokens, shape.kv_heads, shape.head_size), dtype=dtype, device=meta)
    v = torch.empty_like(k)
    out = torch.empty_like(q)
    block_table = torch.empty((shape.batch, shape.max_blocks_per_seq), dtype=torch.int32, device=meta)
    start_loc = torch.empty(shape.batch + 1, dtype=torch.int32, device=meta)
    seq_lens = torch.empty(shape.batch, dtype=torch.int32, device=meta)
    scale = torch.empty((), dtype=torch.float32, device=meta)
    wrapper.context_attention_fwd(
        q, k, v, out, "fp8" if shape.kv_cache_fp8 else "auto", key_cache, value_cache, block_table, start_loc,
        seq_lens, shape.max_query_len, scale, scale, sliding_window=shape.sliding_window or None,
    )  # fmt: skip
