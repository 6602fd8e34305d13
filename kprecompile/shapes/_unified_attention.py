"""AITER's Triton `unified_attention` as vLLM's ROCM_AITER_UNIFIED_ATTN backend calls it, once per
step over the whole batch: the shape record and the call shared by `prefix_prefill` (steps with
a prefill) and `paged_decode` (pure decode steps, the kernel's ALL_DECODE variant).

The wrapper picks a 2D kernel, or a 3D kernel with a reduction whose segment count depends on
the GPU's compute units and the number of query blocks, so the families walk the batch sizes
and token counts that move those choices.

In the call, q and out are the first `tokens` rows of token-major (tokens, heads, head_size)
buffers; K and V caches are the two halves of one per-layer (2, blocks, block_size, kv_heads,
head_size) tensor, in the model dtype or viewed as the target's FP8 with 0-d float32 scales;
the block table is the first rows of a (max_num_seqs, max_blocks_per_seq) int32 table; a
sliding window arrives as (window - 1, 0). The KV tensor's size is chosen under or over 2 GiB
to match the shape's storage class.
"""

from __future__ import annotations

from collections.abc import Callable

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import AITER_DISTRIBUTION, import_library_module
from ..vllm.releases import ReleaseLine
from ._paged_kv import PagedAttentionShape, block_count, cache_element, kv_cache_parameters
from .family import FamilyName, KernelFamily

WRAPPER_MODULE = "aiter.ops.triton.unified_attention"
# Up to this many keys the wrapper always takes the 2D kernel; beyond, it may take the 3D one.
SHORT_CONTEXT = 512


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if not target.is_rocm:
        return "AITER's unified attention configs carry AMD-only launch options (waves_per_eu); ROCm targets only"
    return None


def describe_shapes(shapes: tuple[PagedAttentionShape, ...]) -> dict[str, object]:
    counts = sorted({shape.num_seqs for shape in shapes})
    # Every count for decode; one per Triton integer class for steps with a prefill.
    contiguous = counts == list(range(1, counts[-1] + 1))
    return kv_cache_parameters(
        shapes[0],
        shapes,
        num_seqs=f"1..{counts[-1]}" if contiguous and len(counts) > 2 else ",".join(map(str, counts)),
        max_query_len=",".join(str(q) for q in sorted({shape.max_query_len for shape in shapes})),
    )


def describe_call(shape: PagedAttentionShape) -> str:
    return (
        f"unified_attention(num_seqs={shape.num_seqs}, tokens={shape.tokens}, max_seqlen_q={shape.max_query_len}, "
        f"max_seqlen_k={shape.max_seq_len}, kv_cache {shape.kv_cache_storage})"
    )


def launch(shape: PagedAttentionShape, target: Target) -> None:
    import torch

    wrapper = import_library_module(WRAPPER_MODULE)
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    element_type, element = cache_element(shape.dtype, shape.kv_cache_fp8, target)
    per_block = 2 * shape.block_size * shape.kv_heads * shape.head_size * element
    needed = -(-shape.max_seq_len // shape.block_size) * shape.num_seqs
    blocks = block_count(needed, per_block, shape.kv_cache_storage)
    kv_cache = torch.empty(
        (2, blocks, shape.block_size, shape.kv_heads, shape.head_size), dtype=element_type, device=meta
    )
    key_cache, value_cache = kv_cache.unbind(0)
    query = torch.empty((shape.tokens, shape.q_heads, shape.head_size), dtype=dtype, device=meta)
    output = torch.empty_like(query)
    block_table = torch.empty((shape.num_seqs, shape.max_blocks_per_seq), dtype=torch.int32, device=meta)
    query_start_loc = torch.empty(shape.num_seqs + 1, dtype=torch.int32, device=meta)
    seq_lens = torch.empty(shape.num_seqs, dtype=torch.int32, device=meta)
    scale = torch.empty((), dtype=torch.float32, device=meta)
    window = (shape.sliding_window - 1, 0) if shape.sliding_window else (-1, -1)
    # vLLM's ROCM_AITER_UNIFIED_ATTN passes the layer's sinks (gpt-oss) where it has them.
    sinks = {"sinks": torch.empty(shape.q_heads, dtype=getattr(torch, shape.sinks), device=meta)} if shape.sinks else {}
    wrapper.unified_attention(
        q=query,
        k=key_cache,
        v=value_cache,
        out=output,
        cu_seqlens_q=query_start_loc,
        max_seqlen_q=shape.max_query_len,
        seqused_k=seq_lens,
        max_seqlen_k=shape.max_seq_len,
        softmax_scale=shape.head_size**-0.5,
        causal=True,
        window_size=window,
        block_table=block_table,
        softcap=shape.logits_soft_cap,
        q_descale=None,
        k_descale=scale,
        v_descale=scale,
        **sinks,
    )


def unified_attention_family(
    name: FamilyName,
    description: str,
    enumerate_shapes: Callable[[ModelConfig, ServingParams, ReleaseLine | None], tuple[PagedAttentionShape, ...]],
) -> KernelFamily[PagedAttentionShape]:
    """A family of steps this call serves: everything but which steps is the call's."""
    return KernelFamily(
        name=name,
        description=description,
        library=AITER_DISTRIBUTION,
        traced_modules=("aiter.ops.triton",),
        enumerate_shapes=enumerate_shapes,
        describe_shapes=describe_shapes,
        describe_call=describe_call,
        launch=launch,
        limits=limits,
    )
