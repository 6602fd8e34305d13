"""AITER's Triton varlen flash attention, called as vLLM's ROCM_AITER_TRITON_MLA prefill calls it.

q is a slice of the full query (tokens, heads, nope + rope); k concatenates k_nope with the
shared k_pe broadcast over heads (contiguous); v is the second half of the up-projected
(tokens, heads, nope + v) KV: a strided view, not a copy. New tokens run causally; chunks of a
cached prefix non-causally with the LSE returned for merging.
"""

from __future__ import annotations

from ..shapes.mla_prefill import MlaPrefillShape
from ..targets import Target
from ._imports import import_library_module

WRAPPER_MODULE = "aiter.ops.triton.mha"


def unsupported_reason(target: Target) -> str | None:
    if not target.is_rocm:
        return "AITER's Triton MLA prefill configs carry AMD-only launch options; ROCm targets only"
    return None


def describe(shape: MlaPrefillShape) -> str:
    return (
        f"flash_attn_varlen_func({shape.kind}, batch={shape.batch}, max_seqlen_q={shape.max_query_len}, "
        f"max_seqlen_k={shape.max_kv_len})"
    )


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
