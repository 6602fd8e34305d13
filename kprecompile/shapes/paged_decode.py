"""Pure decode steps for GQA models: AITER's Triton `unified_attention` (ROCM_AITER_UNIFIED_ATTN)
where every request decodes (the kernel's ALL_DECODE variant).

The plan walks every decode batch size, short and long contexts (up to 512 keys the wrapper
always takes the 2D kernel; beyond, it may take the 3D one), and both KV-cache storage classes.
"""

from __future__ import annotations

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..vllm.releases import ReleaseLine
from . import _unified_attention as unified
from ._paged_kv import KV_CACHE_STORAGE_CLASSES, PagedAttentionShape, paged_kv_fields, per_layer_kind


@per_layer_kind
def enumerate_paged_decode(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[PagedAttentionShape, ...]:
    """Pure decode steps: every batch size, short and long contexts, both KV-cache storage classes."""
    if model.mla is not None:
        return ()
    base = paged_kv_fields(model, serving)
    model_len = serving.model_len(model)
    query_len = serving.decode_query_len
    shapes = []
    seq_lens = sorted({min(unified.SHORT_CONTEXT, model_len), model_len})
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


FAMILY = unified.unified_attention_family(
    "paged_decode", "AITER's Triton unified attention on pure decode steps", enumerate_paged_decode
)
