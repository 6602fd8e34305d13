"""MLA prefill: AITER's Triton varlen flash attention as ROCM_AITER_TRITON_MLA calls it.

Prefill runs MLA unabsorbed: q and k have qk_nope_head_dim + qk_rope_head_dim per head, v has
v_head_dim and is a view of the up-projected KV (nope | v per head). The new tokens attend
causally to themselves; a cached prefix is attended in chunks, non-causally, and merged by LSE.
The kernel takes the batch size and both max sequence lengths as plain integers (specialized
as 1 / multiple of 16 / other), so the plan takes one length per class the engine can produce.

In the call, q is a slice of the full query (tokens, heads, nope + rope); k concatenates k_nope
with the shared k_pe broadcast over heads (contiguous); v is the second half of the
up-projected (tokens, heads, nope + v) KV: a strided view, not a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import AITER_DISTRIBUTION, import_library_module
from ..vllm.releases import ReleaseLine
from ._points import int_class_representatives
from .family import KernelFamily

WRAPPER_MODULE = "aiter.ops.triton.mha"

Kind = Literal["new_tokens", "context_chunk"]


@dataclass(frozen=True)
class MlaPrefillShape:
    kind: Kind
    heads: int
    batch: int
    # Total and longest query tokens over the batch's prefills.
    tokens: int
    max_query_len: int
    # Total and longest key tokens: the new tokens themselves, or one chunk of cached context.
    kv_tokens: int
    max_kv_len: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    dtype: str


def enumerate_mla_prefill(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[MlaPrefillShape, ...]:
    if model.mla is None:
        return ()
    mla = model.mla
    heads = serving.heads_per_rank(model)
    budget = serving.max_num_batched_tokens
    model_len = serving.model_len(model)
    # Requests with at most decode_query_len new tokens are decodes; prefills are longer.
    shortest_prefill = serving.decode_query_len + 1
    query_lens = int_class_representatives(min(budget, model_len), low=shortest_prefill)
    batches = int_class_representatives(min(serving.max_num_seqs, budget // shortest_prefill))
    context_lens = int_class_representatives(model_len - shortest_prefill)
    shapes = []

    def add(kind: Kind, batch: int, query_len: int, kv_len: int) -> None:
        # The longest request has query_len tokens, the others the fewest a prefill can have.
        tokens = query_len + (batch - 1) * shortest_prefill
        kv_tokens = tokens if kind == "new_tokens" else kv_len * batch
        if tokens <= budget:
            shapes.append(
                MlaPrefillShape(
                    kind,
                    heads,
                    batch,
                    tokens,
                    query_len,
                    kv_tokens,
                    kv_len,
                    mla.qk_nope_head_dim,
                    mla.qk_rope_head_dim,
                    mla.v_head_dim,
                    serving.activation_dtype(model),
                )
            )

    for batch in batches:
        for query_len in query_lens:
            add("new_tokens", batch, query_len, query_len)
            for context_len in context_lens:
                add("context_chunk", batch, query_len, context_len)
    return tuple(shapes)


def describe_shapes(shapes: tuple[MlaPrefillShape, ...]) -> dict[str, object]:
    first = shapes[0]
    return {
        "heads_per_rank": first.heads,
        "qk_head_dim": first.qk_nope_head_dim + first.qk_rope_head_dim,
        "v_head_dim": first.v_head_dim,
        "batch": ",".join(str(b) for b in sorted({shape.batch for shape in shapes})),
        "query_len": ",".join(str(q) for q in sorted({shape.max_query_len for shape in shapes})),
        "context_chunk_len": ",".join(
            str(k) for k in sorted({shape.max_kv_len for shape in shapes if shape.kind == "context_chunk"})
        ),
    }


def describe_call(shape: MlaPrefillShape) -> str:
    return (
        f"flash_attn_varlen_func({shape.kind}, batch={shape.batch}, max_seqlen_q={shape.max_query_len}, "
        f"max_seqlen_k={shape.max_kv_len})"
    )


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if not target.is_rocm:
        return "AITER's Triton MLA prefill configs carry AMD-only launch options; ROCm targets only"
    return None


def launch(shape: MlaPrefillShape, target: Target) -> None:
    import torch

    mha = import_library_module(WRAPPER_MODULE)
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    heads, nope, rope, v_dim = shape.heads, shape.qk_nope_head_dim, shape.qk_rope_head_dim, shape.v_head_dim
    q = torch.empty((shape.tokens, heads, nope + rope), dtype=dtype, device=meta)
    k = torch.empty((shape.kv_tokens, heads, nope + rope), dtype=dtype, device=meta)
    kv_nope = torch.empty((shape.kv_tokens, heads, nope + v_dim), dtype=dtype, device=meta)
    v = kv_nope.split([nope, v_dim], dim=-1)[1]
    cu_seqlens_q = torch.empty(shape.batch + 1, dtype=torch.int32, device=meta)
    cu_seqlens_k = cu_seqlens_q if shape.kind == "new_tokens" else torch.empty_like(cu_seqlens_q)
    causal = shape.kind == "new_tokens"
    mha.flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=shape.max_query_len,
        max_seqlen_k=shape.max_kv_len,
        softmax_scale=(nope + rope) ** -0.5,
        causal=causal,
        return_lse=not causal,
    )


FAMILY = KernelFamily(
    name="mla_prefill",
    description="AITER's Triton varlen flash attention for MLA prefill (qk head 192, v head 128)",
    library=AITER_DISTRIBUTION,
    traced_modules=("aiter.ops.triton",),
    enumerate_shapes=enumerate_mla_prefill,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
)
