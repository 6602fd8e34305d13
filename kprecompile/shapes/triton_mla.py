"""vLLM's TRITON_MLA backend: its own Triton decode attention, and its merge of prefill results on
steps with cached context, traced from the installed vLLM.

The plan builds the backend's impl as vLLM does (from the engine's `VllmConfig`) and calls it on
meta tensors through the line's decode entry point (`triton_mla_decode`) and merge (`mla_merge`).
The kernels specialize on the model, the split count and the KV cache's type and storage class,
not on the batch size. What runs, release by release and on NVIDIA: docs/engine-kernels.md,
"TRITON_MLA".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import VLLM_DISTRIBUTION
from ..vllm.releases import MlaMerge, ReleaseLine, TritonMlaDecode
from ._paged_kv import KV_CACHE_STORAGE_CLASSES, StorageClass, block_count
from ._vllm_backend import VLLM_ATTENTION_OPS, required_line, vllm_record
from ._vllm_mla import COMMON_MODULE, build_impl, common_module, prefill_with_context
from .family import KernelFamily

BACKEND_MODULE = "vllm.v1.attention.backends.mla.triton_mla"


@dataclass(frozen=True)
class TritonMlaShape:
    heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    block_size: int
    max_blocks_per_seq: int
    batch: int
    max_seq_len: int
    dtype: str
    kv_cache_storage: StorageClass
    kv_cache_fp8: bool
    # 0 for a decode step; else a prefill step of `batch` tokens whose cached context (up to
    # `max_seq_len`) is attended in this many chunks of the prefill workspace.
    context_chunks: int
    # What vLLM builds its engine configuration from (the impl reads it).
    config_json: str
    serving: ServingParams
    # The planned line's decode entry point and prefill merge (its `triton_mla_decode`, `mla_merge`).
    decode_entry: TritonMlaDecode
    merge: MlaMerge


def enumerate_triton_mla(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[TritonMlaShape, ...]:
    """Decode steps of one, a few and the most sequences, on short and long contexts, for each
    KV storage class; prefill steps with their context in one chunk and in two."""
    line = required_line(line, "triton_mla")
    if model.mla is None:
        return ()
    model_len = serving.model_len(model)
    batches = sorted({1, min(3, serving.max_num_seqs), serving.max_num_seqs})
    decodes = tuple(
        TritonMlaShape(
            heads=serving.heads_per_rank(model),
            kv_lora_rank=model.mla.kv_lora_rank,
            qk_rope_head_dim=model.mla.qk_rope_head_dim,
            block_size=serving.block_size,
            max_blocks_per_seq=-(-model_len // serving.block_size),
            batch=batch,
            max_seq_len=seq_len,
            dtype=serving.activation_dtype(model),
            kv_cache_storage=storage,
            kv_cache_fp8=serving.kv_cache_is_fp8,
            context_chunks=0,
            config_json=model.config_json,
            serving=serving,
            decode_entry=line.triton_mla_decode,
            merge=line.mla_merge,
        )
        for storage in KV_CACHE_STORAGE_CLASSES
        for seq_len in _decode_contexts(model_len)
        for batch in batches
    )
    prefills = tuple(
        replace(
            decodes[0],
            batch=max(2, min(serving.max_num_batched_tokens, 512)),
            max_seq_len=model_len,
            context_chunks=chunks,
        )
        for chunks in (1, 2)
    )
    return decodes + prefills


def _decode_contexts(model_len: int) -> list[int]:
    """Longest contexts of decode steps: one per power of 2 up to the model length. Up to 0.19 the
    KV-split count is a fixed 4; from 0.20 it is the power of 2 of context / 512 (capped by the
    compute units) and a constexpr, so each power of 2 can be a kernel of its own."""
    contexts = {model_len}
    length = 512
    while length < model_len:
        contexts.add(length)
        length *= 2
    return sorted(contexts)


def describe_shapes(shapes: tuple[TritonMlaShape, ...]) -> dict[str, object]:
    first = shapes[0]
    batches = ",".join(str(batch) for batch in sorted({s.batch for s in shapes if not s.context_chunks}))
    chunks = ",".join(str(chunks) for chunks in sorted({s.context_chunks for s in shapes if s.context_chunks}))
    return {
        "heads_per_rank": first.heads,
        "latent": f"{first.kv_lora_rank}+{first.qk_rope_head_dim}",
        "block_size": first.block_size,
        "batches": batches,
        "prefill_context_chunks": chunks,
        "kv_cache": "fp8" if first.kv_cache_fp8 else first.dtype,
    }


def describe_call(shape: TritonMlaShape) -> str:
    if shape.context_chunks:
        return f"prefill with context(tokens={shape.batch}, context in {shape.context_chunks} chunks)"
    return f"_forward_decode(batch={shape.batch}, max_seq_len={shape.max_seq_len}, kv_cache {shape.kv_cache_storage})"


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if serving.kv_cache_is_fp8 and not required_line(line, "triton_mla").triton_mla_fp8_kv_cache:
        return "vLLM's TRITON_MLA refuses an FP8 KV cache up to 0.18"
    return None


def _decode_metadata(module: Any, block_table: Any, seq_lens: Any) -> Any:
    """The decode part of vLLM's MLA metadata, as its builder makes it for a decode step."""
    decode_cls = getattr(module, "MLACommonDecodeMetadata", None)
    if decode_cls is None or not dataclasses.is_dataclass(decode_cls):
        return SimpleNamespace(block_table=block_table, seq_lens=seq_lens)
    return vllm_record(decode_cls, {"block_table": block_table, "seq_lens": seq_lens, "dcp_tot_seq_lens": None})


def launch(shape: TritonMlaShape, target: Target) -> None:
    if shape.context_chunks:
        _prefill_step(shape, target)
        return
    kv_cache_dtype = shape.serving.kv_cache_dtype if shape.kv_cache_fp8 else "auto"
    impl = build_impl(
        BACKEND_MODULE, "TritonMLABackend", shape.heads, shape.config_json, shape.serving, target, kv_cache_dtype
    )
    if shape.decode_entry == "forward_mqa":
        _decode_through_forward_mqa(impl, shape, target)
    else:
        _decode_step(impl, shape)


def _prefill_step(shape: TritonMlaShape, target: Target) -> None:
    """A prefill with cached context: what it compiles is vLLM's merge of partial results (on
    ROCm; NVIDIA merges with vLLM's compiled CUDA operator, which the step skips), and in 0.26
    and 0.27 on every platform the mask of context chunks empty for some prefill
    (`mask_empty_context`)."""
    if shape.merge != "triton":
        # vLLM's compiled merge on CDNA3 and newer: nothing to compile (gfx90a's Triton merge
        # is not planned).
        return
    prefill_with_context(
        BACKEND_MODULE,
        "TritonMLABackend",
        heads=shape.heads,
        config_json=shape.config_json,
        serving=shape.serving,
        target=target,
        tokens=shape.batch,
        prefills=min(shape.batch, 2),
        context_chunks=shape.context_chunks,
        longest_context=shape.max_seq_len - 1,
        max_blocks_per_seq=shape.max_blocks_per_seq,
        dtype=shape.dtype,
    )


def _decode_step(impl: Any, shape: TritonMlaShape) -> None:
    import torch

    common = common_module()
    head_size = shape.kv_lora_rank + shape.qk_rope_head_dim
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    element = torch.empty((), dtype=dtype, device=meta).element_size()
    per_block = shape.block_size * head_size * element
    needed = -(-shape.max_seq_len // shape.block_size) * shape.batch
    blocks = block_count(needed, per_block, shape.kv_cache_storage)
    # The latent cache: (blocks, block_size, kv_lora_rank + rope), as vLLM's MLA backends shape it.
    kv_cache = torch.empty((blocks, shape.block_size, head_size), dtype=dtype, device=meta)
    # The decode query as the MLA layer hands it over: absorbed nope part and rope part.
    query = (
        torch.empty((shape.batch, shape.heads, shape.kv_lora_rank), dtype=dtype, device=meta),
        torch.empty((shape.batch, shape.heads, shape.qk_rope_head_dim), dtype=dtype, device=meta),
    )
    block_table = torch.empty((shape.batch, shape.max_blocks_per_seq), dtype=torch.int32, device=meta)
    seq_lens = torch.empty(shape.batch, dtype=torch.int32, device=meta)
    metadata = SimpleNamespace(decode=_decode_metadata(common, block_table, seq_lens))
    layer = SimpleNamespace(_k_scale=torch.empty((), dtype=torch.float32, device=meta), _k_scale_float=1.0)
    impl._forward_decode(query, kv_cache, metadata, layer)


def _decode_through_forward_mqa(impl: Any, shape: TritonMlaShape, target: Target) -> None:
    """A decode step through the impl's `forward_mqa` (0.16 and newer): its KV-split count from
    the step's longest context and the GPU's compute units, its FP8 KV cache dequantized in the
    kernel."""
    import torch

    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    head_size = shape.kv_lora_rank + shape.qk_rope_head_dim
    element_type = target.fp8_dtype if shape.kv_cache_fp8 else dtype
    element = torch.empty((), dtype=element_type, device=meta).element_size()
    needed = -(-shape.max_seq_len // shape.block_size) * shape.batch
    blocks = block_count(needed, shape.block_size * head_size * element, shape.kv_cache_storage)
    kv_cache = torch.empty((blocks, shape.block_size, head_size), dtype=element_type, device=meta)
    query = (
        torch.empty((shape.batch, shape.heads, shape.kv_lora_rank), dtype=dtype, device=meta),
        torch.empty((shape.batch, shape.heads, shape.qk_rope_head_dim), dtype=dtype, device=meta),
    )
    decode = SimpleNamespace(
        block_table=torch.empty((shape.batch, shape.max_blocks_per_seq), dtype=torch.int32, device=meta),
        seq_lens=torch.empty(shape.batch, dtype=torch.int32, device=meta),
    )
    metadata = SimpleNamespace(decode=decode, max_seq_len=shape.max_seq_len, causal=True)
    # The layer's scales as releases read them (0.18 passes `_v_scale` as the value scale, 0.19 on `_k_scale`).
    scale = torch.empty((), dtype=torch.float32, device=meta)
    layer = SimpleNamespace(_k_scale=scale, _v_scale=scale, _k_scale_float=1.0, _v_scale_float=1.0)
    impl.forward_mqa(query, kv_cache, metadata, layer)


FAMILY = KernelFamily(
    name="triton_mla",
    description="vLLM's TRITON_MLA: its Triton decode attention (grouped stage 1, stage-2 reduce) and prefill merge",
    library=VLLM_DISTRIBUTION,
    # MLA's common module too: it binds vLLM's merge dispatcher, which reads the platform.
    traced_modules=(BACKEND_MODULE, COMMON_MODULE, *VLLM_ATTENTION_OPS),
    enumerate_shapes=enumerate_triton_mla,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
)
