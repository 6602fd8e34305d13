"""What the families of vLLM's own MLA kernels share: the backend's impl, built as vLLM builds it,
and one prefill step with cached context as the release runs it.

Up to 0.15 the impl prefills by itself (`_forward_prefill`): the impl is built under a `VllmConfig`
that vLLM's `EngineArgs` make from the model's config.json and the serving parameters
(`vllm/engine_config.py`) and called with the metadata records vLLM's builder would fill. From
0.17 the prefill runs through vLLM's `MLAAttention` layer (the impl's `forward_mha`, a prefill
backend the builder puts in the metadata): the model is built with vLLM's own classes on meta
(`vllm/model_layers.py`), and the step's metadata comes from the backend's own builder. What the
step calls besides vLLM's Triton kernels is prebuilt and does nothing while tracing: the prefill
attention itself (AITER's CK flash attention or ROCm's flash-attn build: `tracing/prebuilt.py`),
the cache gather (a vLLM operator), and the model's `kv_b_proj` linear layer (its GEMM is the
linear families' to plan).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import import_library_module
from ..tracing.prebuilt import aiter_attention_prebuilt, compiled_ops_skipped, prebuilt_varlen_attention
from ._vllm_backend import (
    attributes_set,
    common_attention_metadata,
    empty_context_masks_for_every_class,
    host_copies,
    layer_kv_cache,
    merges_for_every_token_count,
    prebuilt_ops_skipped,
    runner_spec,
    unpinned_host_memory,
    vllm_record,
)

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
    """Whether the impl prefills by itself (`_forward_prefill`, up to 0.15); from 0.17 the
    prefill runs through vLLM's MLAAttention layer."""
    try:
        return hasattr(common_module().MLACommonImpl, "_forward_prefill")
    except Exception:  # noqa: BLE001 - a module of the layer's era that does not import here
        return False


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
    config = engine_config(config_json, serving, target)
    # AITER's attention, which vLLM's ROCm MLA impls import when built; nothing of it on NVIDIA.
    prebuilt = aiter_attention_prebuilt() if target.is_rocm else contextlib.nullcontext()
    with set_current_vllm_config(config), prebuilt:
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
            kv_b_proj=_kv_b_proj(config, raw, serving.tensor_parallel_size),
        )
    return impl


def _kv_b_proj(config: Any, raw: dict[str, Any], tensor_parallel_size: int) -> Any:
    """The attention's `kv_b_proj` as vLLM's DeepSeek models build it for one rank (vLLM's own
    `ColumnParallelLinear` with the configuration's quantization, on meta), built when the impl
    first reads it: vLLM 0.15's impl reads its weight's dtype when built, with AITER on
    (`MLACommonBaseImpl.__init__`: a bfloat16 weight takes AITER's FP4 BMM); other releases'
    impls read nothing of it there, and the prefill calls a stand-in of its output's shape."""

    class BuiltOnRead:
        def __getattr__(self, attribute: str) -> Any:
            built = vars(self).get("layer")
            if built is None:
                built = self.layer = _column_parallel_linear(config, raw, tensor_parallel_size)
            return getattr(built, attribute)

    return BuiltOnRead()


def _column_parallel_linear(config: Any, raw: dict[str, Any], tensor_parallel_size: int) -> Any:
    import torch

    linear = import_library_module("vllm.model_executor.layers.linear")
    parallel_state = import_library_module("vllm.distributed.parallel_state")
    set_current_vllm_config = import_library_module("vllm.config").set_current_vllm_config
    # The rank's tensor-parallel group as vLLM's layers read it (no process group here).
    group = SimpleNamespace(world_size=tensor_parallel_size, rank_in_group=0)
    default_dtype = torch.get_default_dtype()
    # vLLM's loader builds the model under the model's dtype as torch's default.
    torch.set_default_dtype(config.model_config.dtype)
    try:
        with set_current_vllm_config(config), attributes_set((parallel_state, "_TP", group)), torch.device("meta"):
            return linear.ColumnParallelLinear(
                raw["kv_lora_rank"],
                raw["num_attention_heads"] * (raw["qk_nope_head_dim"] + raw["v_head_dim"]),
                bias=False,
                quant_config=config.quant_config,
                prefix="model.layers.0.self_attn.kv_b_proj",
            )
    finally:
        torch.set_default_dtype(default_dtype)


def _context_chunk_limit(workspace: int, serving: ServingParams, prefills: int | None = None) -> int:
    """The context tokens one chunk holds: vLLM's builder splits the prefill workspace evenly over
    the step's prefills with context, rounded down to blocks; by default the fewest, with as many
    prefills as a step can hold (at most one per sequence)."""
    if prefills is None:
        prefills = min(serving.max_num_seqs, serving.max_num_batched_tokens)
    per_prefill = workspace // prefills
    return max(per_prefill // serving.block_size * serving.block_size, serving.block_size)


def _prefills_sharing_workspace(serving: ServingParams, tokens: int) -> int:
    """The most prefills with context one step of `tokens` new tokens holds, each of two tokens
    at least (one new token is a decode to vLLM's builders): the more prefills, the smaller each
    one's share of the workspace, so the more chunks a context takes."""
    return max(1, min(serving.max_num_seqs, tokens // 2))


def _impl_prefill(
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
    """Up to 0.15: one prefill step whose sequences have cached context, through the impl's real
    `_forward_prefill`: new tokens' attention, the context in `context_chunks` chunks (merged
    chunk by chunk), and the final merge, with the metadata vLLM's builder makes for it. Nothing
    where the engine never makes several chunks (its workspace holds every context it can have)."""
    chunk_tokens = min(_context_chunk_limit(impl.chunked_prefill_workspace_size, serving), longest_context)
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


# vLLM's compiled operators around MLA's prefill: the context's gather from the latent cache and
# the merge's compiled form (the Triton merge, where the release runs it, is what is traced).
PREFILL_PREBUILT_OPS = ("gather_and_maybe_dequant_cache", "gather_cache", "cp_gather_cache", "merge_attn_states")
PREFILL_COMPILED_OPS = ("_C_cache_ops.gather_and_maybe_dequant_cache", "_C_cache_ops.cp_gather_cache")


def prefill_with_context(
    module_name: str,
    backend_class: str,
    *,
    heads: int,
    config_json: str,
    serving: ServingParams,
    target: Target,
    tokens: int,
    prefills: int,
    context_chunks: int,
    longest_context: int,
    max_blocks_per_seq: int,
    dtype: str,
) -> None:
    """One prefill step whose `prefills` sequences have cached context (up to `longest_context`
    tokens), attended in `context_chunks` chunks of the engine's prefill workspace, as the
    installed release runs it (module doc). Nothing where the engine never makes that many chunks
    (its workspace holds every context it can have)."""
    if impl_prefill_traceable():
        impl = build_impl(module_name, backend_class, heads, config_json, serving, target)
        _impl_prefill(
            impl,
            serving,
            tokens=tokens,
            prefills=prefills,
            context_chunks=context_chunks,
            longest_context=longest_context,
            max_blocks_per_seq=max_blocks_per_seq,
            dtype=dtype,
        )
        return
    backend = getattr(import_library_module(module_name), backend_class).get_name()
    _layer_prefill(
        _model_layer(backend, config_json, serving, target),
        serving,
        target,
        tokens=tokens,
        prefills=prefills,
        context_chunks=context_chunks,
        longest_context=longest_context,
    )


@functools.lru_cache(maxsize=4)
def _model_layer(backend: str, config_json: str, serving: ServingParams, target: Target) -> tuple[Any, str, Any]:
    """(VllmConfig, name, layer): the first MLA layer of the model vLLM builds with `backend`
    (`model_layers.build_model`, in this worker's process: its shapes share it)."""
    from ..vllm.model_layers import Question, build_model
    from ..vllm.releases import installed_release

    question = Question(
        config_json=config_json,
        serving=serving.as_dict(),
        target=target.name,
        requested=backend,
        flags={},
        release=installed_release() or "",
    )
    config, _ = build_model(question)
    layers = config.compilation_config.static_forward_context
    name, layer = next((name, layer) for name, layer in layers.items() if hasattr(layer, "kv_lora_rank"))
    built = layer.attn_backend.get_name()
    if built != backend:
        raise RuntimeError(f"vLLM built the model's MLA layers with {built}, not {backend}")
    # Set from the decode-context-parallel group, which has one rank here.
    layer.impl.dcp_world_size = 1
    return config, name, layer


def _layer_prefill(
    built: tuple[Any, str, Any],
    serving: ServingParams,
    target: Target,
    *,
    tokens: int,
    prefills: int,
    context_chunks: int,
    longest_context: int,
) -> None:
    """From 0.17: the step's metadata from the backend's own builder (which splits the context into
    chunks of its workspace), then the impl's `forward_mha` with the layer's KV cache as the
    runner binds it."""
    import torch

    config, name, layer = built
    meta = torch.device("meta")
    impl, backend = layer.impl, layer.attn_backend
    # AITER's attention, which the ROCm prefill backends import when they prepare a step.
    prebuilt = aiter_attention_prebuilt() if target.is_rocm else contextlib.nullcontext()
    with import_library_module("vllm.config").set_current_vllm_config(config), prebuilt:
        spec = runner_spec(backend, layer.get_kv_cache_spec(config), target)
        builder = backend.get_builder_cls()(spec, [name], config, meta)
        # Each prefill takes two new tokens at least (one is a decode to the builder).
        prefills = min(prefills, max(1, tokens // 2))
        if context_chunks > 1:
            prefills = max(prefills, _prefills_sharing_workspace(serving, tokens))
        chunk_limit = _context_chunk_limit(builder.chunked_prefill_workspace_size, serving, prefills)
        if context_chunks > 1 and longest_context <= chunk_limit:
            return
        context = min(longest_context, context_chunks * chunk_limit)
        query_lens = [tokens // prefills + (index < tokens % prefills) for index in range(prefills)]
        # The first context a block long: the rest then straddle the chunks' bounds, so that a
        # packing builder (0.27 and newer) splits a sequence's context over two chunks and merges
        # its continuation, at a token past the step's first.
        context_lens = [
            min(context, serving.block_size) if index == 0 and context_chunks > 1 else context
            for index in range(prefills)
        ]
        steps = [context_lens]
        if context_chunks == 1 and prefills > 1:
            # And a new prompt beside them (the scheduler puts it after the running ones): its
            # context chunk is empty, which vLLM 0.26 and 0.27 mask with a Triton kernel of its
            # own before merging (`mask_empty_context`), on the first chunk's row of offsets.
            steps.append(context_lens[:-1] + [0])
        step = SimpleNamespace(
            num_seqs=prefills,
            max_seq_len=context + max(query_lens),
            kv_cache_storage="under_2gib",
            kv_cache_blocks=0,
        )
        kv_cache, width = layer_kv_cache(config, backend, spec, step, target)
        for step_context_lens in steps:
            common, host_values = common_attention_metadata(query_lens, step_context_lens, width)
            with (
                host_copies(host_values),
                unpinned_host_memory(),
                prebuilt_ops_skipped(PREFILL_PREBUILT_OPS),
                compiled_ops_skipped(*PREFILL_COMPILED_OPS),
            ):
                metadata = builder.build(0, common)
                dtype = config.model_config.dtype
                heads, nope, rope = layer.num_heads, layer.qk_nope_head_dim, layer.qk_rope_head_dim
                with (
                    _prebuilt_prefill_attention(impl, metadata),
                    _projection_stand_in(impl, heads * (nope + layer.v_head_dim)),
                    merges_for_every_token_count(serving.max_num_batched_tokens),
                    empty_context_masks_for_every_class(serving),
                ):
                    impl.forward_mha(
                        torch.empty((tokens, heads, nope + rope), dtype=dtype, device=meta),
                        torch.empty((tokens, layer.kv_lora_rank), dtype=dtype, device=meta),
                        torch.empty((tokens, 1, rope), dtype=dtype, device=meta),
                        kv_cache,
                        metadata,
                        layer._k_scale,
                        torch.empty((tokens, heads * layer.v_head_dim), dtype=dtype, device=meta),
                    )


def _prebuilt_prefill_attention(impl: Any, metadata: Any) -> Any:
    """The prefill's flash attention (prebuilt), where the release calls it: the impl's
    `flash_attn_varlen_func` (0.17 and 0.18), or the prefill backend the builder put in the
    metadata (0.19 and newer)."""

    def new_tokens(q: Any, k: Any, v: Any, return_softmax_lse: bool = False, out: Any = None, **_: Any) -> Any:
        return prebuilt_varlen_attention(q, k, v, out=out, return_lse=return_softmax_lse)

    def context_chunk(*, q: Any, k: Any, v: Any, out: Any = None, **which_chunk: Any) -> Any:
        # vLLM names the chunk by keyword: its metadata `chunk` (0.33), its index `chunk_idx` (before).
        return prebuilt_varlen_attention(q, k, v, out=out, return_lse=True)

    prefill_backend = getattr(getattr(metadata, "prefill", None), "prefill_backend", None)
    stand_ins = (
        (impl, "flash_attn_varlen_func", prebuilt_varlen_attention),
        (prefill_backend, "run_prefill_new_tokens", new_tokens),
        (prefill_backend, "run_prefill_context_chunk", context_chunk),
    )
    return attributes_set(*(change for change in stand_ins if hasattr(change[0], change[1])))


@contextlib.contextmanager
def _projection_stand_in(impl: Any, projected: int) -> Iterator[None]:
    """The layer's `kv_b_proj` returns its output's shape on meta (its GEMM is a linear family's
    to plan); everything else (its weight's dtype, which the prefill reads) is the real layer's."""
    import torch

    real = impl.kv_b_proj

    class StandIn:
        def __call__(self, x: Any) -> tuple[Any]:
            return (torch.empty((x.shape[0], projected), dtype=x.dtype, device=x.device),)

        def __getattr__(self, attribute: str) -> Any:
            return getattr(real, attribute)

    with attributes_set((impl, "kv_b_proj", StandIn())):
        yield
