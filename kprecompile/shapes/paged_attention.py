"""Paged attention shapes for GQA models: AITER's Triton `unified_attention` as vLLM's
ROCM_AITER_UNIFIED_ATTN backend calls it, once per step over the whole batch.

Two families share the kernel: `paged_decode` is a step where every request decodes one token
(the kernel's ALL_DECODE variant), `prefix_prefill` a step with at least one prefill, possibly
with a cached prefix and decodes mixed in. The wrapper picks a 2D kernel, or a 3D kernel with
a reduction whose segment count depends on the GPU's compute units and the number of query
blocks, so the plan walks the batch sizes and token counts that move those choices: every
decode batch size, and token counts one per power-of-two bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..models import ModelConfig
from ..serving import ServingParams
from ._common import KV_CACHE_STORAGE_CLASSES, geometric_points, int_class_representatives

PREFIX_PREFILL = "prefix_prefill"
PAGED_DECODE = "paged_decode"
# The wrapper switches prefill configs at 256 query tokens and to the 3D kernel above 512 keys.
_QUERY_LEN_POINTS = (2, 255, 256)
_SHORT_CONTEXT = 512

StorageClass = Literal["under_2gib", "over_2gib"]

if TYPE_CHECKING:
    from .pa_prefill import PaPrefillShape


@dataclass(frozen=True)
class PagedAttentionShape:
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


def paged_kv_fields(model: ModelConfig, serving: ServingParams) -> dict[str, object]:
    """The fields every paged-KV attention shape takes from the model and serving settings."""
    model_len = serving.model_len(model)
    return {
        "q_heads": serving.heads_per_rank(model),
        "kv_heads": serving.kv_heads_per_rank(model),
        "head_size": model.head_dim,
        "block_size": serving.block_size,
        "max_blocks_per_seq": -(-model_len // serving.block_size),
        "sliding_window": model.sliding_window or 0,
        "dtype": serving.activation_dtype(model),
        "kv_cache_fp8": serving.kv_cache_is_fp8,
    }


def _context_lens(model_len: int, shortest: int) -> tuple[int, ...]:
    return tuple(sorted({min(shortest, model_len), min(_SHORT_CONTEXT, model_len), model_len}))


def enumerate_paged_decode(model: ModelConfig, serving: ServingParams) -> tuple[PagedAttentionShape, ...]:
    """Pure decode steps: every batch size, short and long contexts, both KV-cache storage classes."""
    if model.mla is not None:
        return ()
    base = paged_kv_fields(model, serving)
    model_len = serving.model_len(model)
    query_len = serving.decode_query_len
    shapes = []
    # Up to 512 keys the wrapper always takes the 2D kernel; beyond, it may take the 3D one.
    seq_lens = sorted({min(_SHORT_CONTEXT, model_len), model_len})
    for storage in KV_CACHE_STORAGE_CLASSES:
        for seq_len in seq_lens:
            for batch in serving.decode_batch_sizes():
                tokens = batch * query_len
                if tokens <= serving.max_num_batched_tokens:
                    shapes.append(
                        PagedAttentionShape(
                            **base,
                            num_seqs=batch,
                            tokens=tokens,
                            max_query_len=query_len,
                            max_seq_len=seq_len,
                            kv_cache_storage=storage,
                        )
                    )
    return tuple(shapes)


def enumerate_prefix_prefill(model: ModelConfig, serving: ServingParams) -> tuple[PagedAttentionShape, ...]:
    """Steps with a prefill: sequence-count classes x query lengths x token counts x contexts."""
    if model.mla is not None:
        return ()
    base = paged_kv_fields(model, serving)
    model_len = serving.model_len(model)
    budget = serving.max_num_batched_tokens
    shortest_prefill = serving.decode_query_len + 1
    shapes = []
    for storage in KV_CACHE_STORAGE_CLASSES:
        for num_seqs in int_class_representatives(min(serving.max_num_seqs, budget)):
            for query_len in _QUERY_LEN_POINTS:
                if query_len < shortest_prefill or query_len > min(budget, model_len):
                    continue
                # The other sequences hold at least one token each (decodes or short prefills).
                fewest = query_len + num_seqs - 1
                for tokens in geometric_points(fewest, budget) if fewest <= budget else ():
                    for seq_len in _context_lens(model_len, query_len):
                        if seq_len < query_len:
                            continue
                        shapes.append(
                            PagedAttentionShape(
                                **base,
                                num_seqs=num_seqs,
                                tokens=tokens,
                                max_query_len=query_len,
                                max_seq_len=seq_len,
                                kv_cache_storage=storage,
                            )
                        )
    return tuple(shapes)


def kv_cache_parameters(first: PagedAttentionShape | PaPrefillShape, **varying: object) -> dict[str, object]:
    """What `plan` shows for a paged-attention family: heads, head and block size, what varies,
    the KV cache's type and the sliding window."""
    parameters: dict[str, object] = {
        "heads_per_rank": f"{first.q_heads}q/{first.kv_heads}kv",
        "head_size": first.head_size,
        "block_size": first.block_size,
        **varying,
        "kv_cache": "fp8" if first.kv_cache_fp8 else first.dtype,
    }
    if first.sliding_window:
        parameters["sliding_window"] = first.sliding_window
    return parameters


def describe_parameters(shapes: tuple[PagedAttentionShape, ...]) -> dict[str, object]:
    counts = sorted({shape.num_seqs for shape in shapes})
    # Every count for decode; one per Triton integer class for steps with a prefill.
    contiguous = counts == list(range(1, counts[-1] + 1))
    return kv_cache_parameters(
        shapes[0],
        num_seqs=f"1..{counts[-1]}" if contiguous and len(counts) > 2 else ",".join(map(str, counts)),
        max_query_len=",".join(str(q) for q in sorted({shape.max_query_len for shape in shapes})),
    )
