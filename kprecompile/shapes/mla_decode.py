"""MLA decode shapes: AITER's `mla_decode_fwd` as vLLM's AITER MLA backends call it.

Per decode step and rank, vLLM calls `aiter.mla.mla_decode_fwd` with the absorbed query
(tokens, heads, kv_lora_rank + qk_rope_head_dim), the latent KV cache viewed as pages of one
token, and one sequence per request. Stage 1 is a prebuilt assembly kernel; stage 2, which
reduces the KV splits, is a Triton kernel that takes the batch size as a constexpr
(DESIGN.md fact 11), so every batch size the engine can reach is its own kernel: decodes in a
mixed prefill/decode step run at their exact count, so that is every size up to max_num_seqs
(`ServingParams.decode_batch_sizes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models import ModelConfig
from ..serving import ServingParams

FAMILY = "mla_decode"
# AITER 0.1.7's non-persistent MLA decode supports these head counts per rank.
SUPPORTED_HEADS = (16, 128)
# A context long enough that the KV is split (stage 2 runs) at every batch size.
_LONG_CONTEXT = 8192


@dataclass(frozen=True)
class MlaDecodeShape:
    heads: int
    batch: int
    # Query tokens per sequence: 1, or 1 + speculative tokens.
    query_len: int
    context_len: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    # Model dtype of q and the output; with an FP8 KV cache vLLM quantizes q to FP8 too.
    dtype: str
    kv_cache_fp8: bool


def unsupported_reason(model: ModelConfig, serving: ServingParams) -> str | None:
    if model.mla is None:
        return None
    heads = serving.heads_per_rank(model)
    if heads not in SUPPORTED_HEADS:
        return (
            f"AITER's MLA decode supports {' or '.join(map(str, SUPPORTED_HEADS))} heads per rank; "
            f"{model.name} at tp {serving.tensor_parallel_size} has {heads}"
        )
    return None


def enumerate_mla_decode(model: ModelConfig, serving: ServingParams) -> tuple[MlaDecodeShape, ...]:
    if model.mla is None or unsupported_reason(model, serving):
        return ()
    heads = serving.heads_per_rank(model)
    context = min(serving.model_len(model), _LONG_CONTEXT)
    shapes = []
    # With speculative decoding a request verifies up to 1 + spec tokens in one step.
    for query_len in range(1, serving.decode_query_len + 1):
        for batch in serving.decode_batch_sizes():
            shapes.append(
                MlaDecodeShape(
                    heads=heads,
                    batch=batch,
                    query_len=query_len,
                    context_len=context,
                    kv_lora_rank=model.mla.kv_lora_rank,
                    qk_rope_head_dim=model.mla.qk_rope_head_dim,
                    dtype=serving.activation_dtype(model),
                    kv_cache_fp8=serving.kv_cache_is_fp8,
                )
            )
    return tuple(shapes)


def describe_parameters(shapes: tuple[MlaDecodeShape, ...]) -> dict[str, object]:
    first = shapes[0]
    return {
        "heads_per_rank": first.heads,
        "head_dim": f"{first.kv_lora_rank}+{first.qk_rope_head_dim}",
        "batch": f"1..{max(shape.batch for shape in shapes)}",
        "query_len": ",".join(str(q) for q in sorted({shape.query_len for shape in shapes})),
        "page_size": 1,
        "kv_cache": "fp8" if first.kv_cache_fp8 else first.dtype,
    }
