"""vLLM's TRITON_ATTN backend: its own Triton kernels, traced from the installed vLLM.

The plan calls the backend's real `forward` on meta tensors (in a line whose `tracing` is
"engine_step", the engine's own step: vLLM's config, metadata builder and per-layer KV-cache view)
at every decode batch size and at steps with a prefill of each integer class, so that every integer
and storage class the kernels specialize on is reached, on ROCm and NVIDIA targets. What vLLM runs,
release by release, and why AITER's fused rope-and-cache is not planned: docs/engine-kernels.md,
"TRITON_ATTN".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import import_library_module
from ..vllm.releases import ReleaseLine
from ._paged_kv import (
    KV_CACHE_STORAGE_CLASSES,
    TWO_GIB,
    PagedAttentionShape,
    StorageClass,
    kv_cache_parameters,
    paged_kv_fields,
    per_layer_kind,
)
from ._points import int_class_representatives
from ._vllm_backend import (
    LAYER_NAME,
    VllmBackend,
    attention_class,
    attention_type,
    backend_step,
    common_metadata_class,
    kv_scales_layer,
    layer_arguments,
    layer_kv_cache,
    query_type,
    required_line,
    vllm_backend_family,
    vllm_record,
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


@dataclass(frozen=True)
class TritonAttentionStep(PagedAttentionShape):
    """An engine step (`tracing` "engine_step": vLLM 0.19 and newer), whose metadata builder and
    KV-cache layout read the engine's configuration: the model's config.json and the serving
    parameters it is built from."""

    config_json: str = ""
    serving: ServingParams | None = None
    # Blocks in each layer's region (vLLM sizes it from the GPU's free memory); 0: as few as the
    # step needs that put the layer in `kv_cache_storage`'s class.
    kv_cache_blocks: int = 0


def _enumerate_engine_steps(model: ModelConfig, serving: ServingParams) -> tuple[TritonAttentionStep, ...]:
    """Decode steps at every batch size (the builder's 3D threshold, taken from the capture sizes,
    splits them between the 3D and the 2D kernel); with speculative decoding, at every query
    length up to 1 + k (requests verify 0 to k drafts: ngram proposes none where nothing matches,
    and whether a step fits the 3D kernel depends on its query blocks); steps with the longest
    prefill the budget leaves beside decodes (beyond the 3D kernel's query lengths: 2D) at one
    batch size per integer class; short and long contexts; the KV storage classes of a layer's
    view (see `_layer_view_storage_classes`)."""
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
        TritonAttentionStep(
            **base,
            num_seqs=batch,
            tokens=tokens,
            max_query_len=query_len,
            max_seq_len=seq_len,
            kv_cache_storage=storage,
            config_json=model.config_json,
            serving=serving,
        )
        for storage in _layer_view_storage_classes(model, serving)
        for seq_len in contexts
        for batch, query_len, tokens in steps
        if seq_len >= query_len
    )


def _layer_view_storage_classes(model: ModelConfig, serving: ServingParams) -> tuple[StorageClass, ...]:
    """In an engine step (from 0.19) vLLM bounds the KV cache's key and value views on ROCm by the
    end of the layer's region (`set_triton_ptr_range`), which is what Triton's buffer-ops
    specialization then reads: the value view starts one head later, so a layer of whole blocks
    that ends within one head's bytes past 2 GiB gives keys over and values within
    ("straddles_2gib"). vLLM's default layout gives every layer a region of its own
    (layer-compact)."""
    element = 1 if serving.kv_cache_is_fp8 else 2
    head_bytes = model.head_dim * element
    page = 2 * serving.block_size * serving.kv_heads_per_rank(model) * head_bytes
    first_over = -(-TWO_GIB // page) * page
    straddles: tuple[StorageClass, ...] = ("straddles_2gib",) if first_over <= TWO_GIB - 1 + head_bytes else ()
    return (*KV_CACHE_STORAGE_CLASSES, *straddles)


def _engine_step(shape: TritonAttentionStep, target: Target) -> None:
    """One engine step (vLLM 0.19 and newer): the metadata built by the backend's real builder
    (its 3D threshold from the capture sizes, its segment count and scratch), the KV cache written
    by the impl's `do_kv_cache_update` (the layer calls it before `forward`), then `forward`."""
    import torch

    from ..platforms.vllm_platform import refresh_switches
    from ..vllm.engine_config import engine_config

    assert shape.serving is not None
    config = engine_config(shape.config_json, shape.serving, target)
    module = import_library_module(BACKEND_MODULE)
    backend = module.TritonAttentionBackend
    torch_utils = import_library_module("vllm.utils.torch_utils")
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    kv_cache_dtype = shape.serving.kv_cache_dtype if shape.kv_cache_fp8 else "auto"
    sliding_window = shape.sliding_window or None
    refresh_switches()
    with import_library_module("vllm.config").set_current_vllm_config(config):
        # The layer's own KV-cache spec (its method, on the fields it reads).
        layer_fields = SimpleNamespace(
            attn_type=attention_type().DECODER,
            kv_cache_dtype=kv_cache_dtype,
            sliding_window=sliding_window,
            attn_backend=backend,
            num_kv_heads=shape.kv_heads,
            head_size=shape.head_size,
            head_size_v=shape.head_size,
            kv_cache_torch_dtype=torch_utils.kv_cache_dtype_str_to_dtype(kv_cache_dtype, config.model_config),
        )
        spec = attention_class().get_kv_cache_spec(layer_fields, config)
        kv_cache, width = layer_kv_cache(config, backend, spec, shape, target)
        builder = backend.get_builder_cls()(spec, [LAYER_NAME], config, meta)

        def ints(*dims: int, dtype: Any = torch.int32) -> Any:
            return torch.empty(dims, dtype=dtype, device=meta)

        common = vllm_record(
            common_metadata_class(),
            {
                "query_start_loc": ints(shape.num_seqs + 1),
                "query_start_loc_cpu": torch.empty(shape.num_seqs + 1, dtype=torch.int32),
                "seq_lens": ints(shape.num_seqs),
                "num_reqs": shape.num_seqs,
                "num_actual_tokens": shape.tokens,
                "max_query_len": shape.max_query_len,
                "max_seq_len": shape.max_seq_len,
                "block_table_tensor": ints(shape.num_seqs, width),
                "slot_mapping": ints(shape.tokens, dtype=torch.int64),
                "causal": True,
            },
        )
        metadata = builder.build(0, common)
        impl = backend.get_impl_cls()(
            shape.q_heads,
            shape.head_size,
            shape.head_size**-0.5,
            shape.kv_heads,
            None,
            sliding_window,
            kv_cache_dtype,
            **layer_arguments(shape),
        )
    query = torch.empty(
        (shape.tokens, shape.q_heads, shape.head_size), dtype=query_type(impl, shape, target), device=meta
    )
    key = torch.empty((shape.tokens, shape.kv_heads, shape.head_size), dtype=dtype, device=meta)
    layer = kv_scales_layer()
    output = torch.empty((shape.tokens, shape.q_heads, shape.head_size), dtype=dtype, device=meta)
    # From 0.19 the layer writes the KV cache before `forward` (up to 0.18 `forward` writes it).
    if hasattr(impl, "do_kv_cache_update"):
        impl.do_kv_cache_update(layer, key, torch.empty_like(key), kv_cache, metadata.slot_mapping)
    impl.forward(layer, query, key, torch.empty_like(key), kv_cache, metadata, output=output)


def launch(shape: PagedAttentionShape, target: Target) -> None:
    if isinstance(shape, TritonAttentionStep):
        _engine_step(shape, target)
    else:
        backend_step(BACKEND, shape, target)


BACKEND = VllmBackend(
    module=BACKEND_MODULE,
    backend_class="TritonAttentionBackend",
    metadata_class="TritonAttentionMetadata",
)


FAMILY = replace(
    vllm_backend_family(
        "triton_attn",
        "vLLM's TRITON_ATTN: reshape-and-cache, unified attention 2D/3D and its segment reduce",
        BACKEND,
        enumerate_triton_attn,
        describe_shapes,
        limits,
    ),
    launch=launch,
)
