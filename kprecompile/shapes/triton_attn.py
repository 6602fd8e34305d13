"""vLLM's TRITON_ATTN backend: its own Triton kernels, traced from the installed vLLM.

The plan calls the backend's real `forward` on meta tensors (in a line whose `tracing` is
"engine_step", the engine's own step: vLLM's config, metadata builder and per-layer KV-cache view)
at every decode batch size and at steps with a prefill of each integer class, so that every integer
and storage class the kernels specialize on is reached, on ROCm and NVIDIA targets. What vLLM runs,
release by release, and why AITER's fused rope-and-cache is not planned: docs/engine-kernels.md,
"TRITON_ATTN".
"""

from __future__ import annotations

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..vllm.releases import ReleaseLine
from ._paged_kv import (
    KV_CACHE_STORAGE_CLASSES,
    PagedAttentionShape,
    kv_cache_parameters,
    paged_kv_fields,
    per_layer_kind,
)
from ._points import int_class_representatives
from ._vllm_backend import (
    PagedEngineStep,
    VllmBackend,
    layer_view_storage_classes,
    required_line,
    vllm_backend_family,
)

# Contexts a step attends over: a short one and the longest (the kernels do not specialize on
# it; both are walked so that a rule that did would be seen by the coverage sweep).
_SHORT_CONTEXT = 512


@per_layer_kind
def enumerate_triton_attn(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[PagedAttentionShape, ...]:
    """Decode steps at every batch size; steps with a prefill at one batch size per integer
    class; short and long contexts; both KV storage classes (engine steps: also the one whose keys
    span more than 2 GiB and values not, where whole blocks can end there)."""
    line = required_line(line, "triton_attn")
    if model.mla is not None:
        return ()
    if line.tracing == "engine_step":
        return _enumerate_engine_steps(model, serving)
    base = paged_kv_fields(model, serving)
    model_len = serving.model_len(model)
    budget = serving.max_num_batched_tokens
    decode = serving.decode_query_len
    prefill = min(budget, model_len, decode + 1)
    steps = [(batch, decode) for batch in serving.decode_batch_sizes() if batch * decode <= budget]
    if prefill > decode:
        steps += [
            (batch, prefill)
            for batch in int_class_representatives(min(serving.max_num_seqs, budget))
            if prefill + (batch - 1) * decode <= budget
        ]
    contexts = sorted({min(_SHORT_CONTEXT, model_len), model_len})
    shapes = []
    for storage in KV_CACHE_STORAGE_CLASSES:
        for seq_len in contexts:
            for batch, query_len in steps:
                if seq_len < query_len:
                    continue
                # A step with a prefill: one sequence prefills, the others decode.
                tokens = batch * query_len if query_len == decode else query_len + (batch - 1) * decode
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


def describe_shapes(shapes: tuple[PagedAttentionShape, ...]) -> dict[str, object]:
    serving = getattr(shapes[0], "serving", None)
    decode = serving.decode_query_len if serving is not None else min(shape.max_query_len for shape in shapes)
    batches = sorted({shape.num_seqs for shape in shapes if shape.max_query_len <= decode})
    prefill = sorted({shape.num_seqs for shape in shapes if shape.max_query_len > decode})
    return kv_cache_parameters(
        shapes[0],
        shapes,
        decode_num_seqs=f"1..{batches[-1]}" if batches else "-",
        prefill_num_seqs=",".join(map(str, prefill)) or "-",
    )


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if serving.block_size % 16:
        return f"vLLM's TRITON_ATTN takes block sizes that are multiples of 16, not {serving.block_size}"
    return None


BACKEND_MODULE = "vllm.v1.attention.backends.triton_attn"


def _enumerate_engine_steps(model: ModelConfig, serving: ServingParams) -> tuple[PagedEngineStep, ...]:
    """Decode steps at every batch size (the builder's 3D threshold, taken from the capture sizes,
    splits them between the 3D and the 2D kernel); with speculative decoding, at every query
    length up to 1 + k (requests verify 0 to k drafts: ngram proposes none where nothing matches,
    and whether a step fits the 3D kernel depends on its query blocks); steps with the longest
    prefill the budget leaves beside decodes (beyond the 3D kernel's query lengths: 2D) at one
    batch size per integer class; short and long contexts; the KV storage classes of a layer's
    view (see `layer_view_storage_classes`)."""
    base = paged_kv_fields(model, serving)
    model_len = serving.model_len(model)
    budget = serving.max_num_batched_tokens
    decode = serving.decode_query_len
    steps = [
        (batch, query_len, batch * query_len)
        for query_len in range(1, decode + 1)
        for batch in range(1, serving.max_num_seqs + 1)
        if batch * query_len <= budget
    ]
    for batch in int_class_representatives(min(serving.max_num_seqs, budget)):
        # One sequence prefills as much as the step's budget leaves, the others decode.
        query_len = min(budget - (batch - 1) * decode, model_len)
        if query_len > 1:
            steps.append((batch, query_len, query_len + (batch - 1) * decode))
    contexts = sorted({min(_SHORT_CONTEXT, model_len), model_len})
    return tuple(
        PagedEngineStep(
            **base,
            num_seqs=batch,
            tokens=tokens,
            max_query_len=query_len,
            max_seq_len=seq_len,
            kv_cache_storage=storage,
            config_json=model.config_json,
            serving=serving,
        )
        for storage in layer_view_storage_classes(model, serving)
        for seq_len in contexts
        for batch, query_len, tokens in steps
        if seq_len >= query_len
    )


BACKEND = VllmBackend(
    module=BACKEND_MODULE,
    backend_class="TritonAttentionBackend",
    metadata_class="TritonAttentionMetadata",
)


FAMILY = vllm_backend_family(
    "triton_attn",
    "vLLM's TRITON_ATTN: reshape-and-cache, unified attention 2D/3D and its segment reduce",
    BACKEND,
    enumerate_triton_attn,
    describe_shapes,
    limits,
)
