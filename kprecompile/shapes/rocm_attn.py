"""vLLM's ROCM_ATTN backend: its own Triton kernels, traced from the installed vLLM.

Each step, the backend's `forward` calls vLLM's `chunked_prefill_paged_decode`: steps with a
prefill run the prefix-prefill kernel (`context_attention_fwd`'s `_fwd_kernel`, decodes skipped),
and decodes run vLLM's HIP `paged_attention_rocm` where vLLM's rule takes it, else the Triton
`kernel_paged_attention_2d` (sliding window, sinks, head or block sizes, GQA ratios, dtypes or
context lengths the HIP kernel does not take, or `VLLM_ROCM_CUSTOM_PAGED_ATTN=0`). The plan
calls the backend's real `forward` (vLLM's impl, metadata and call, as the release has them) on
meta tensors, so vLLM's own rule picks the kernels; its HIP operators are prebuilt (nothing to
compile) and skipped while tracing. In a line whose `tracing` is "engine_step" the step is the
engine's (`_vllm_backend.engine_step`): its configuration, the runner's KV-cache spec and layout
(0.31 packs K and V as two head groups for the HIP kernels, and writes the cache with Triton's
`reshape_and_cache_kernel_flash` where a layer's view is not that), the backend's builder, then
`do_kv_cache_update` and `forward`.

The kernels' specializations depend on the model, the KV cache's type and size class and the
kind of step, not on batch sizes (those only shape the grid): the plan walks steps with and
without a prefill, on contexts either side of the HIP kernel's limit.
"""

from __future__ import annotations

import functools
from typing import Any

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
from ._vllm_backend import (
    PagedEngineStep,
    VllmBackend,
    layer_view_storage_classes,
    required_line,
    vllm_backend_family,
)

# vLLM's HIP paged attention takes contexts up to this many tokens.
HIP_CONTEXT_LIMIT = 128 * 1024


@per_layer_kind
def enumerate_rocm_attn(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[PagedAttentionShape, ...]:
    """Decode-only steps and steps with a prefill, on a short context, one at the HIP kernel's
    limit and the longest one, for each KV storage class; in a line whose `tracing` is
    "engine_step", as the engine's steps (its configuration, KV-cache layout and the storage
    classes of a layer's view: `layer_view_storage_classes`)."""
    if model.mla is not None:
        return ()
    line = required_line(line, "rocm_attn")
    base = paged_kv_fields(model, serving)
    model_len = serving.model_len(model)
    query_lens = sorted({1, min(serving.max_num_batched_tokens, model_len, 2 * serving.decode_query_len + 1)})
    contexts = sorted({min(512, model_len), min(HIP_CONTEXT_LIMIT, model_len), model_len})
    num_seqs = min(2, serving.max_num_seqs)
    if line.tracing == "engine_step":
        step = functools.partial(PagedEngineStep, config_json=model.config_json, serving=serving)
        storage_classes = layer_view_storage_classes(model, serving)
    else:
        step, storage_classes = PagedAttentionShape, KV_CACHE_STORAGE_CLASSES
    return tuple(
        step(
            **base,
            num_seqs=num_seqs,
            tokens=query_len + num_seqs - 1,
            max_query_len=query_len,
            max_seq_len=seq_len,
            kv_cache_storage=storage,
        )
        for storage in storage_classes
        for query_len in query_lens
        for seq_len in contexts
        if seq_len >= query_len
    )


def describe_shapes(shapes: tuple[PagedAttentionShape, ...]) -> dict[str, object]:
    return kv_cache_parameters(
        shapes[0],
        shapes,
        steps="decode, prefill" if len({shape.max_query_len > 1 for shape in shapes}) == 2 else "decode",
        contexts=",".join(str(length) for length in sorted({shape.max_seq_len for shape in shapes})),
    )


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if not target.is_rocm:
        return "vLLM's ROCM_ATTN backend runs on ROCm only"
    if serving.block_size % 16:
        return f"vLLM's ROCM_ATTN takes block sizes that are multiples of 16, not {serving.block_size}"
    return None


def _layer_view(shape: PagedAttentionShape, element_type: Any, blocks: int) -> Any:
    """From 0.19 the backend declares no shape: its per-layer view of vLLM's default layout, K
    and V as two head groups ahead of the blocks, logical (blocks, 2, block_size, kv_heads *
    head_size) over physical (2, blocks, ...); the backend's `forward` transposes it back."""
    import torch

    physical = torch.empty(
        (2, blocks, shape.block_size, shape.kv_heads * shape.head_size), dtype=element_type, device="meta"
    )
    return physical.transpose(0, 1)


BACKEND = VllmBackend(
    module="vllm.v1.attention.backends.rocm_attn",
    backend_class="RocmAttentionBackend",
    metadata_class="RocmAttentionMetadata",
    prebuilt_ops=("paged_attention_rocm", "reshape_and_cache"),
    layer_view=_layer_view,
)


FAMILY = vllm_backend_family(
    "rocm_attn",
    "vLLM's ROCM_ATTN: its Triton prefix prefill, and its Triton paged decode where vLLM declines HIP",
    BACKEND,
    enumerate_rocm_attn,
    describe_shapes,
    limits,
)
