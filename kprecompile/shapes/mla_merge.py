"""vLLM's `merge_attn_states` around AITER's MLA prefill: traced from the installed vLLM.

ROCM_AITER_MLA (and ROCM_AITER_TRITON_MLA, whose impl is a subclass of it) run the prefill
attention in AITER, but a prefill whose sequences have cached context (prefix caching, chunked
prefill) also runs vLLM's own code: the context in chunks of the prefill workspace, each
chunk's partial result merged into the previous ones (`merge_attn_states` with the merged
log-sum-exp), and the context's result merged with the new tokens' one. On ROCm up to 0.31
that merge is vLLM's Triton `merge_attn_states_kernel` on every arch, compiled on the first
request that hits a cached prefix. The plan runs that step as the
installed release does (`_vllm_mla.py`: the impl's own `_forward_prefill` up to 0.15, vLLM's
MLAAttention layer with its builder's metadata from 0.17), once with one context chunk and once
with two where the engine's workspace makes several chunks reachable. The kernel specializes on
the model's head sizes and whether the merged log-sum-exp is kept, and on token counts from 0.20:
0.20 to 0.26 take the count of tokens with context as a constexpr (every count is planned); from
0.27 the count and the log-sum-exp strides are ordinary integers (every Triton class of each is
planned, `_vllm_backend.merges_for_every_token_count`).
0.26 and 0.27 first mask a context chunk that some prefill has no context in (a new prompt beside
cached ones, or a context shorter than the chunk's start) with a Triton kernel of their own
(`mask_empty_context_kernel`, called from `mla_attention.py`): the one-chunk step runs once more
beside a new prompt, and each mask is launched for every class of its count of prefills and
log-sum-exp head stride, and a later chunk's row of offsets aligned or not
(`_vllm_backend.empty_context_masks_for_every_class`).
From 0.32, CDNA3 and newer merge with vLLM's compiled operator (`selection/engines.py` says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import VLLM_DISTRIBUTION
from ..vllm.releases import ReleaseLine
from ._vllm_backend import VLLM_ATTENTION_OPS
from ._vllm_mla import prefill_with_context
from .family import KernelFamily

BACKEND_MODULE = "vllm.v1.attention.backends.mla.rocm_aiter_mla"
BACKEND_CLASS = "AiterMLABackend"


@dataclass(frozen=True)
class MlaMergeShape:
    heads: int
    v_head_dim: int
    max_blocks_per_seq: int
    prefills: int
    tokens: int
    # Chunks of the prefill workspace the context is attended in.
    context_chunks: int
    # The longest cached context a sequence can have.
    longest_context: int
    dtype: str
    # What vLLM builds its engine configuration from (the impl reads it).
    config_json: str
    serving: ServingParams


def enumerate_mla_merge(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[MlaMergeShape, ...]:
    """A prefill with its context in one chunk, and one with it in two (traced where the engine's
    workspace makes it reachable: `launch`)."""
    if model.mla is None:
        return ()
    model_len = serving.model_len(model)
    prefills = min(2, serving.max_num_seqs)
    return tuple(
        MlaMergeShape(
            heads=serving.heads_per_rank(model),
            v_head_dim=model.mla.v_head_dim,
            max_blocks_per_seq=-(-model_len // serving.block_size),
            prefills=prefills,
            tokens=max(prefills, min(serving.max_num_batched_tokens, 512)),
            context_chunks=chunks,
            longest_context=model_len - 1,
            dtype=serving.activation_dtype(model),
            config_json=model.config_json,
            serving=serving,
        )
        for chunks in (1, 2)
    )


def describe_shapes(shapes: tuple[MlaMergeShape, ...]) -> dict[str, object]:
    first = shapes[0]
    chunks = ",".join(str(shape.context_chunks) for shape in shapes)
    return {
        "heads_per_rank": first.heads,
        "v_head_dim": first.v_head_dim,
        "context_chunks": chunks,
        "dtype": first.dtype,
    }


def describe_call(shape: MlaMergeShape) -> str:
    chunks = shape.context_chunks
    return f"prefill with context(prefills={shape.prefills}, tokens={shape.tokens}, context in {chunks} chunks)"


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if not target.is_rocm:
        return "vLLM's ROCM_AITER_MLA runs on ROCm only"
    return None


def launch(shape: MlaMergeShape, target: Target) -> None:
    prefill_with_context(
        BACKEND_MODULE,
        BACKEND_CLASS,
        heads=shape.heads,
        config_json=shape.config_json,
        serving=shape.serving,
        target=target,
        tokens=shape.tokens,
        prefills=shape.prefills,
        context_chunks=shape.context_chunks,
        longest_context=shape.longest_context,
        max_blocks_per_seq=shape.max_blocks_per_seq,
        dtype=shape.dtype,
    )


FAMILY = KernelFamily(
    name="mla_merge",
    description="vLLM's merge_attn_states around AITER's MLA prefill on steps with cached context",
    library=VLLM_DISTRIBUTION,
    traced_modules=(BACKEND_MODULE, *VLLM_ATTENTION_OPS),
    enumerate_shapes=enumerate_mla_merge,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
)
