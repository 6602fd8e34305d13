"""vLLM's TRITON_ATTN backend: its own Triton kernels, traced from the installed vLLM.

Each step, the backend's `forward` writes the step's keys and values into the paged cache with
vLLM's Triton `reshape_and_cache_kernel_flash`, then calls vLLM's `unified_attention`, which
runs `kernel_unified_attention_2d` for steps with a prefill and for decode batches whose query
blocks times KV heads exceed a fixed threshold, else `kernel_unified_attention_3d` with
`reduce_segments` (the choice and the segment count are the wrapper's, up to 0.18). The plan
calls the backend's real `forward` on meta tensors.

The kernels take the number of sequences as an integer Triton specializes (1, a multiple of
16, other), on either side of the 2D/3D choice: the plan walks every decode batch size, steps
with a prefill at one batch size per integer class, short and long contexts, both KV storage
classes. From vLLM 0.19 the backend's KV cache is a view into one allocation for all layers,
laid out by vLLM's KV-cache layout, and its metadata builder picks the 3D threshold from the
capture sizes: not traced yet (`engines.py` says so).

vLLM runs the same backend on NVIDIA GPUs where it is named (`--attention-backend TRITON_ATTN`):
there the kernels are traced under vLLM's CUDA platform (its FP8 range is e4m3fn's ±448, and the
wrappers pick NVIDIA's launch options). Triton's AMD backend also specializes pointers on whether
their tensor spans more than 2 GiB and NVIDIA's does not, so an NVIDIA target has about half the
kernels of a ROCm one.
"""

from __future__ import annotations

from ..models import ModelConfig
from ..serving import ServingParams
from ..targets import Target
from ._paged_kv import KV_CACHE_STORAGE_CLASSES, PagedAttentionShape, kv_cache_parameters, paged_kv_fields
from ._points import int_class_representatives
from ._vllm_backend import VllmBackend, vllm_backend_family

# Contexts a step attends over: a short one and the longest (the kernels do not specialize on
# it; both are walked so that a rule that did would be seen by the coverage sweep).
_SHORT_CONTEXT = 512


def enumerate_triton_attn(model: ModelConfig, serving: ServingParams) -> tuple[PagedAttentionShape, ...]:
    """Decode steps at every batch size; steps with a prefill at one batch size per integer
    class; short and long contexts; both KV storage classes."""
    if model.mla is not None:
        return ()
    base = paged_kv_fields(model, serving)
    model_len = serving.model_len(model)
    budget = serving.max_num_batched_tokens
    decode = serving.decode_query_len
    prefill = min(budget, model_len, decode + 1)
    steps = [(batch, decode) for batch in serving.decode_batch_sizes() if batch * decode <= budget]
    if prefill > decode:
        steps += [(batch, prefill) for batch in int_class_representatives(min(serving.max_num_seqs, budget))
                  if prefill + (batch - 1) * decode <= budget]  # fmt: skip
    contexts = sorted({min(_SHORT_CONTEXT, model_len), model_len})
    shapes = []
    for storage in KV_CACHE_STORAGE_CLASSES:
        for seq_len in contexts:
            for batch, query_len in steps:
                if seq_len < query_len:
                    continue
                # A step with a prefill: one sequence prefills, the others decode.
                tokens = batch * query_len if query_len == decode else query_len + (batch - 1) * decode
                shapes.append(PagedAttentionShape(**base, num_seqs=batch, tokens=tokens, max_query_len=query_len,
                                                 max_seq_len=seq_len, kv_cache_storage=storage))  # fmt: skip
    return tuple(shapes)


def describe_shapes(shapes: tuple[PagedAttentionShape, ...]) -> dict[str, object]:
    decode = min(shape.max_query_len for shape in shapes)
    batches = sorted({shape.num_seqs for shape in shapes if shape.max_query_len == decode})
    prefill = sorted({shape.num_seqs for shape in shapes if shape.max_query_len > decode})
    return kv_cache_parameters(
        shapes[0],
        decode_num_seqs=f"1..{batches[-1]}" if batches else "-",
        prefill_num_seqs=",".join(map(str, prefill)) or "-",
    )


def limits(model: ModelConfig, serving: ServingParams, target: Target) -> str | None:
    if serving.block_size % 16:
        return f"vLLM's TRITON_ATTN takes block sizes that are multiples of 16, not {serving.block_size}"
    return None


BACKEND = VllmBackend(
    module="vllm.v1.attention.backends.triton_attn",
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
