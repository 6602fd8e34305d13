"""What the families of vLLM's own MLA kernels share: the backend's impl, built as vLLM builds it,
and one prefill step with cached context through the impl's real `_forward_prefill`.

vLLM's MLA impls read the engine's `VllmConfig` when they are built (the prefill workspace from
the model length and the sequence limit): the impl is built under a `VllmConfig` that vLLM's
`EngineArgs` make from the model's config.json and the serving parameters
(`vllm/engine_config.py`). What the step calls besides vLLM's Triton kernels is
prebuilt and does nothing while tracing: the prefill attention itself (AITER's CK flash
attention or ROCm's flash-attn build: `tracing/prebuilt.py`), the cache
gather (a vLLM operator), and the model's `kv_b_proj` linear layer.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from types import SimpleNamespace
from typing import Any

from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import import_library_module
from ..tracing.prebuilt import aiter_attention_prebuilt, prebuilt_varlen_attention
from ._vllm_backend import merges_for_every_token_count, prebuilt_ops_skipped, vllm_record

COMMON_MODULE = "vllm.v1.attention.backends.mla.common"
# Where MLA's common metadata and builder live from 0.18 (beside vLLM's `MLAAttention` layer).
LAYER_MODULE = "vllm.model_executor.layers.attention.mla_attention"


def common_module() -> Any:
    """The module of MLA's common metadata records and builder, wherever the release keeps them."""
    try:
        return import_library_module(COMMON_MODULE)
    except ImportError:
        return import_library_module(LAYER_MODULE)


def impl_prefill_traceable() -> bool:
    """Whether MLA's prefill with cached context can be traced through the impl's
    `_forward_prefill` (up to 0.15); from 0.17 the prefill lives in vLLM's MLAAttention layer."""
    try:
        return hasattr(common_module().MLACommonImpl, "_forward_prefill")
    except Exception:  # noqa: BLE001 - a module of the layer's era that does not import here
        return False


def require_impl_prefill() -> None:
    """From 0.17 vLLM merges the layer's prefill results with Triton on ROCm up to 0.31, a path
    not traced yet: a plan that needs it fails saying so."""
    if not impl_prefill_traceable():
        raise NotImplementedError(
            "this vLLM release prefills MLA inside its MLAAttention layer (0.17 and newer) and merges "
            "the results with Triton on ROCm up to 0.31: kprecompile does not trace that path yet "
            "(0.32 and newer merge with a compiled operator)"
        )


def build_impl(
    module_name: str,
    backend_class: str,
    heads: int,
    config_json: str,
    serving: ServingParams,
    target: Target,
    kv_cache_dtype: str = "auto",
) -> Any:
    """The backend's MLA impl for one layer, built as vLLM's attention layer builds it."""
    from ..platforms.vllm_platform import refresh_switches
    from ..vllm.engine_config import engine_config

    module = import_library_module(module_name)
    set_current_vllm_config = import_library_module("vllm.config").set_current_vllm_config
    raw = json.loads(config_json)
    nope, rope, latent = raw["qk_nope_head_dim"], raw["qk_rope_head_dim"], raw["kv_lora_rank"]
    refresh_switches()
    # AITER's attention, which vLLM's ROCm MLA impls import when built; nothing of it on NVIDIA.
    prebuilt = aiter_attention_prebuilt() if target.is_rocm else contextlib.nullcontext()
    with set_current_vllm_config(engine_config(config_json, serving, target)), prebuilt:
        impl = getattr(module, backend_class).get_impl_cls()(
            heads,
            latent + rope,
            (nope + rope) ** -0.5,
            1,
            None,
            None,
            kv_cache_dtype,
            None,
            "decoder",
            None,
            q_lora_rank=raw.get("q_lora_rank"),
            kv_lora_rank=latent,
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            qk_head_dim=nope + rope,
            v_head_dim=raw["v_head_dim"],
            kv_b_proj=None,
        )
    return impl


def _context_chunk_limit(impl: Any, serving: ServingParams) -> int:
    """The fewest context tokens one chunk holds: vLLM's builder splits the prefill workspace
    evenly over the prefills with context (at most one per sequence), rounded down to blocks."""
    prefills = min(serving.max_num_seqs, serving.max_num_batched_tokens)
    per_prefill = impl.chunked_prefill_workspace_size // prefills
    return max(per_prefill // serving.block_size * serving.block_size, serving.block_size)


def prefill_with_context(
    impl: Any,
    serving: ServingParams,
    *,
    tokens: int,
    prefills: int,
    context_chunks: int,
    longest_context: int,
    max_blocks_per_seq: int,
    dtype: str,
) -> None:
    """One prefill step whose sequences have cached context, through the impl's real
    `_forward_prefill`: new tokens' attention, the context in `context_chunks` chunks (merged
    chunk by chunk), and the final merge, with the metadata vLLM's builder makes for it. Nothing
    where the engine never makes several chunks (its workspace holds every context it can have)."""
    chunk_tokens = min(_context_chunk_limit(impl, serving), longest_context)
    if context_chunks > 1 and longest_context <= chunk_tokens:
        return
    import torch

    common = common_module()
    meta = torch.device("meta")
    torch_dtype = getattr(torch, dtype)
    heads, latent, rope = impl.num_heads, impl.kv_lora_rank, impl.qk_rope_head_dim
    head_size = latent + rope
    projected = heads * (impl.qk_nope_head_dim + impl.v_head_dim)
    impl.kv_b_proj = lambda x: (torch.empty((x.shape[0], projected), dtype=x.dtype, device=meta),)
    impl.flash_attn_varlen_func = prebuilt_varlen_attention
    # Set by `forward` from the decode-context-parallel group: none here.
    impl.dcp_world_size = 1

    def ints(*shape: int) -> Any:
        return torch.empty(shape, dtype=torch.int32, device=meta)

    chunked = vllm_record(
        common.MLACommonPrefillMetadata.ChunkedContextMetadata,
        {
            "cu_seq_lens": ints(context_chunks, prefills + 1),
            "starts": ints(context_chunks, prefills),
            "seq_tot": [chunk_tokens] * context_chunks,
            "max_seq_lens": [chunk_tokens] * context_chunks,
            "seq_lens": ints(context_chunks, prefills),
            "workspace": torch.empty((impl.chunked_prefill_workspace_size, head_size), dtype=torch_dtype, device=meta),
            "token_to_seq": ints(context_chunks, chunk_tokens),
            "chunk_total_token": [chunk_tokens] * context_chunks,
        },
    )
    prefill = vllm_record(
        common.MLACommonPrefillMetadata,
        {
            "block_table": ints(prefills, max_blocks_per_seq),
            "query_start_loc": ints(prefills + 1),
            "max_query_len": -(-tokens // prefills),
            "chunked_context": chunked,
        },
    )
    metadata = SimpleNamespace(prefill=prefill, num_prefills=prefills)
    blocks = max_blocks_per_seq * prefills
    arguments = {
        "q": torch.empty((tokens, heads, impl.qk_nope_head_dim + rope), dtype=torch_dtype, device=meta),
        "kv_c_normed": torch.empty((tokens, latent), dtype=torch_dtype, device=meta),
        "k_pe": torch.empty((tokens, 1, rope), dtype=torch_dtype, device=meta),
        "kv_c_and_k_pe_cache": torch.empty((blocks, serving.block_size, head_size), dtype=torch_dtype, device=meta),
        "attn_metadata": metadata,
        "k_scale": torch.empty((), dtype=torch.float32, device=meta),
    }
    if "output" in inspect.signature(impl._forward_prefill).parameters:
        arguments["output"] = torch.empty((tokens, heads * impl.v_head_dim), dtype=torch_dtype, device=meta)
    with (
        prebuilt_ops_skipped(("gather_and_maybe_dequant_cache", "gather_cache", "merge_attn_states")),
        merges_for_every_token_count(serving.max_num_batched_tokens),
    ):
        impl._forward_prefill(**arguments)
