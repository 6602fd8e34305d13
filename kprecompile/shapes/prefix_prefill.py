"""Steps with a prefill for GQA models: AITER's Triton `unified_attention` (ROCM_AITER_UNIFIED_ATTN)
over new tokens with a cached prefix, decodes possibly mixed in.

The plan walks sequence-count classes, the query lengths where the wrapper switches configs,
token counts one per power-of-two bucket, and short and long contexts.
"""

from __future__ import annotations

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..vllm.releases import ReleaseLine
from . import _unified_attention as unified
from ._paged_kv import KV_CACHE_STORAGE_CLASSES, PagedAttentionShape, paged_kv_fields, per_layer_kind
from ._points import geometric_points, int_class_representatives

# The wrapper switches prefill configs at 256 query tokens.
_QUERY_LEN_POINTS = (2, 255, 256)


def _context_lens(model_len: int, shortest: int) -> tuple[int, ...]:
    return tuple(sorted({min(shortest, model_len), min(unified.SHORT_CONTEXT, model_len), model_len}))


@per_layer_kind
def enumerate_prefix_prefill(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[PagedAttentionShape, ...]:
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


FAMILY = unified.unified_attention_family(
    "prefix_prefill",
    "AITER's Triton unified attention on steps with a prefill (decodes mixed in)",
    enumerate_prefix_prefill,
)
