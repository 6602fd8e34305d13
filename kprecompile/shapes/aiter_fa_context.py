"""vLLM's own Triton kernels around ROCM_AITER_FA's prefill with cached context (the gather of the
context from the paged KV cache, the merge of partial results), and AITER's Triton unified
attention where the backend decodes with it, traced from the installed vLLM.

AITER's other attention is prebuilt. The plan runs vLLM's own `Attention` layer, the backend's real
metadata builder on each step's request mix (so that the chunking and the token counts are vLLM's
own) and the impl's real `forward` on meta tensors (in a line whose `tracing` is "engine_step",
through the engine's own step). What runs, release by release: docs/engine-kernels.md,
"ROCM_AITER_FA".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import VLLM_DISTRIBUTION, import_library_module
from ..tracing.prebuilt import aiter_attention_prebuilt, compiled_ops_skipped
from ..tracing.trace import active_capture
from ..vllm.releases import ReleaseLine
from ._paged_kv import (
    KV_CACHE_STORAGE_CLASSES,
    StorageClass,
    block_count,
    kv_cache_parameters,
    paged_kv_fields,
    per_layer_kind,
)
from ._points import int_class_representatives
from ._vllm_backend import (
    LAYER_NAME,
    VLLM_ATTENTION_OPS,
    attention_class,
    common_attention_metadata,
    host_copies,
    layer_arguments,
    layer_kv_cache,
    merges_for_every_token_count,
    prebuilt_ops_skipped,
    required_line,
    runner_spec,
    unpinned_host_memory,
)
from .family import KernelFamily

BACKEND_MODULE = "vllm.v1.attention.backends.rocm_aiter_fa"
# Context tokens one chunk holds for all extends of a step (vLLM's `_CP_TOKENS_PER_ITER_ROCM`).
CONTEXT_TOKENS_PER_CHUNK = 32 * 1024


@dataclass(frozen=True)
class ExtendStep:
    """A step of prefills with cached context ("extends"), or of decodes: each request's new and
    cached tokens."""

    q_heads: int
    kv_heads: int
    head_size: int
    block_size: int
    max_blocks_per_seq: int
    sliding_window: int
    dtype: str
    kv_cache_fp8: bool
    kv_cache_storage: StorageClass
    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    config_json: str
    serving: ServingParams
    logits_soft_cap: float = 0.0
    sinks: str = ""
    # The sliding window of each kind of the model's attention layers (0: full): up to 0.18 the
    # builder reads every layer of the model, not only its KV-cache group's.
    model_windows: tuple[int, ...] = ()


def _context_mixes(model_len: int, max_extends: int, last_totals: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Cached-context lengths of a step's extends. The gather is launched once per chunk with
    slices of the builder's per-chunk tables, so its key depends on each chunk's token total
    (1, a multiple of 16, other; the program count `min(total, compute units)` likewise) and on
    where the chunk's slices start (the alignment of `chunk * (extends + 1)`, `chunk * extends`
    and `chunk * largest total` elements: what the extend count is modulo 4, not its size). The
    mixes: for each extend count, one long context whose last chunk (the 1st to 4th after the
    first) holds each of `last_totals`, beside short contexts of both parities."""
    longest = model_len - 2  # an extend has at least 2 new tokens
    # Up to 8 extends, and for each count modulo 4 the two smallest counts whose chunks are
    # small enough for five of them within the model length.
    enough = next(
        (
            count
            for count in range(1, max_extends + 1)
            if 4 * (CONTEXT_TOKENS_PER_CHUNK // count) + 16 * 37 + 1 <= longest
        ),
        max_extends,
    )
    counts = sorted({*range(1, 9), *range(enough, enough + 8)} & set(range(1, max_extends + 1)))
    mixes: set[tuple[int, ...]] = set()
    for count in counts:
        chunk = CONTEXT_TOKENS_PER_CHUNK // count
        for chunks_before in range(5):
            for last in last_totals:
                long = chunks_before * chunk + last
                for short in (1, 2):
                    if long <= longest:
                        mixes.add((long, *(short,) * (count - 1)))
    return sorted(mixes)


@dataclass(frozen=True)
class EngineStep(ExtendStep):
    """An engine step (`tracing` "engine_step": vLLM 0.19 and newer): its requests in the runner's
    order (decodes, then extends), each with its new and cached tokens."""

    # Blocks in the layer's region (vLLM sizes it from the GPU's free memory); 0: as few as the
    # step needs that put the layer in `kv_cache_storage`'s class.
    kv_cache_blocks: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(query + context for query, context in zip(self.query_lens, self.context_lens, strict=True))


# AITER's unified attention takes its 2D kernel up to this many keys (speculative decoding's verify
# steps walk spans up to it, just past it, and the longest).
_SHORT_CONTEXT = 512
# A chunk total of each of Triton's integer classes (1, a multiple of 16, other), as the last
# chunk of a long context leaves it (up to 0.18 the gather takes the total).
_TOTAL_CLASSES = (1, 16, 17, 16 * 37 + 1)


def enumerate_extends(model: ModelConfig, serving: ServingParams, line: ReleaseLine | None) -> tuple[ExtendStep, ...]:
    """Each layer kind's steps, each carrying the windows of all the model's layers."""
    if model.mla is not None:
        return ()
    windows = tuple(sorted({kind.sliding_window for kind in model.layer_kinds(serving)}))
    return tuple(replace(step, model_windows=windows) for step in _enumerate_kind(model, serving, line))


@per_layer_kind
def _enumerate_kind(model: ModelConfig, serving: ServingParams, line: ReleaseLine | None) -> tuple[ExtendStep, ...]:
    line = required_line(line, "aiter_fa_context")
    model_len = serving.model_len(model)
    if model_len < 3:
        return ()
    if line.tracing == "engine_step":
        return _enumerate_engine_steps(model, serving, line)
    base = paged_kv_fields(model, serving)
    max_extends = min(serving.max_num_seqs, serving.max_num_batched_tokens // 2)
    steps = [((2,) * len(contexts), contexts) for contexts in _context_mixes(model_len, max_extends, _TOTAL_CLASSES)]
    # Decodes: 0.12 runs a windowed layer's through AITER's Triton unified attention (always its 2D
    # kernel, which takes the batch size as an integer), others' through prebuilt paged attention.
    for batch in int_class_representatives(min(serving.max_num_seqs, serving.max_num_batched_tokens)):
        for span in sorted({min(_SHORT_CONTEXT, model_len), model_len}):
            steps.append(((1,) * batch, (span - 1,) * batch))
    return tuple(
        ExtendStep(
            **base,
            kv_cache_storage=storage,
            query_lens=queries,
            context_lens=contexts,
            config_json=model.config_json,
            serving=serving,
        )
        for storage in KV_CACHE_STORAGE_CLASSES
        for queries, contexts in steps
    )


def _enumerate_engine_steps(model: ModelConfig, serving: ServingParams, line: ReleaseLine) -> tuple[EngineStep, ...]:
    """The extend mixes of `_context_mixes` (decodes before them do not move the extends' rows of
    the block table off 16 bytes: vLLM aligns its width to 128 tokens, a multiple of 4 blocks of the
    16 or 32 tokens this backend takes); with speculative decoding, sinks or a window (`aiter_fa_windowed_decode`),
    decode steps (which then run AITER's Triton unified attention) at every batch size, each longest query from 2 (1
    with sinks) to 1 + k tokens, over keys up to 512 (its 2D kernel), just past, and the longest.
    Other decodes of one token run AITER's prebuilt paged attention. Each in both storage classes:
    unlike TRITON_ATTN's, this backend's key and value views are not bounded by the layer's region,
    so Triton reads the whole KV allocation's size, which is under 2 GiB only where the step's own
    blocks fit ("under_2gib": as few blocks as the step needs, in every layer)."""
    base = paged_kv_fields(model, serving)
    model_len = serving.model_len(model)
    budget = serving.max_num_batched_tokens
    # An extend has more new tokens than a decode (1 + k with speculative decoding).
    extend = serving.decode_query_len + 1
    max_extends = min(serving.max_num_seqs, budget // extend)
    steps: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
        # The gather no longer takes the chunk's token total: one last chunk total is enough.
        ((extend,) * len(contexts), contexts)
        for contexts in _context_mixes(model_len - extend + 2, max_extends, (1,))
    ]
    # Keys up to the 2D bound, just past it, and the longest.
    spans = {min(_SHORT_CONTEXT, model_len), min(_SHORT_CONTEXT + 1, model_len), model_len}
    # A layer with sinks decodes one token through unified attention too (the paged kernels take
    # none), and so does a windowed layer where the line's paged kernel does not take its window.
    window = line.aiter_fa_windowed_decode
    paged_window = window == "paged" or (window == "trimmed_paged" and base["head_size"] >= 64)
    shortest = 1 if base["sinks"] or (base["sliding_window"] and not paged_window) else 2
    for longest in range(shortest, serving.decode_query_len + 1):
        for context in sorted({max(1, span - longest) for span in spans}):
            steps += [
                ((longest,) * batch, (context,) * batch)
                for batch in serving.decode_batch_sizes()
                if batch * longest <= budget
            ]
    return tuple(
        EngineStep(
            **base,
            kv_cache_storage=storage,
            query_lens=queries,
            context_lens=contexts,
            config_json=model.config_json,
            serving=serving,
        )
        for storage in KV_CACHE_STORAGE_CLASSES
        for queries, contexts in steps
    )


def _request_mix(shape: ExtendStep) -> ExtendStep:
    """The step but for its KV-cache storage class: what vLLM's metadata builder sees of it."""
    return replace(shape, kv_cache_storage=KV_CACHE_STORAGE_CLASSES[0])


def describe_shapes(shapes: tuple[ExtendStep, ...]) -> dict[str, object]:
    decodes = {shape for shape in shapes if max(shape.query_lens) == 1}
    steps = "prefills with cached context" + (", decodes" if decodes else "")
    contexts = len({shape.context_lens for shape in shapes if shape not in decodes})
    return kv_cache_parameters(shapes[0], shapes, steps=steps, contexts=contexts)


def describe_call(shape: ExtendStep) -> str:
    contexts = (
        shape.context_lens if len(shape.context_lens) < 4 else f"{len(shape.context_lens)} × {shape.context_lens[0]}"
    )
    requests = "decodes" if max(shape.query_lens) == 1 else "extends"
    return f"forward({requests} with context {contexts}, kv_cache {shape.kv_cache_storage})"


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if not target.is_rocm:
        return "vLLM's ROCM_AITER_FA runs on ROCm only"
    return None


def launch(shape: ExtendStep, target: Target) -> None:
    # The backend's module imports `aiter` and calls its attention.
    with aiter_attention_prebuilt():
        if isinstance(shape, EngineStep):
            _engine_step(shape, target)
        else:
            _extend_step(shape, target)


def _attention_layers(config: Any, shape: ExtendStep, backend: type) -> list[Any]:
    """vLLM's `Attention` layer for the step, built as the model builds it (on meta, under the
    model's dtype), first; beside it one layer of each other window of the model (up to 0.18 the
    builder reads every layer's)."""
    import torch

    attention = attention_class()
    context = config.compilation_config.static_forward_context
    saved = dict(context)
    others = [window for window in shape.model_windows if window != shape.sliding_window]
    default_dtype = torch.get_default_dtype()
    try:
        # Each layer registers itself in the configuration as it is built (`_registered` does
        # for the step): built beside no other, so that no name is taken.
        context.clear()
        torch.set_default_dtype(getattr(torch, shape.dtype))
        with torch.device("meta"):
            return [
                attention(
                    shape.q_heads,
                    shape.head_size,
                    shape.head_size**-0.5,
                    shape.kv_heads,
                    cache_config=config.cache_config,
                    prefix=LAYER_NAME.replace(".0.", f".{index}."),
                    per_layer_sliding_window=window or None,
                    attn_backend=backend,
                    **layer_arguments(shape),
                )
                for index, window in enumerate([shape.sliding_window, *others])
            ]
    finally:
        torch.set_default_dtype(default_dtype)
        context.clear()
        context.update(saved)


@contextlib.contextmanager
def _registered(config: Any, layers: list[Any]) -> Iterator[Any]:
    """`layers` registered in the engine configuration, whose builder reads the step's sliding
    window there: the configuration is shared by the plan's steps, so while the block runs its
    forward context holds these layers alone, as it holds the model's when vLLM serves. Yields
    the step's layer."""
    context = config.compilation_config.static_forward_context
    saved = dict(context)
    context.clear()
    context.update({layer.layer_name: layer for layer in layers})
    try:
        yield layers[0]
    finally:
        context.clear()
        context.update(saved)


def _shared(key: tuple, build: Callable[[], Any]) -> Any:
    """What `build` returns, built once per trace for `key` (`Capture.shared`): the builder never
    sees the KV cache, so a request mix's layers and metadata serve each of its storage classes
    (the family's steps of one mix are one group, `_request_mix`). From 0.19, with the shuffled
    layout and an FP8 KV cache, the builder sizes its scales from the layer's bound KV cache,
    which a step leaves unbound (empty) in every class; one that binds it must key by class."""
    capture = active_capture()
    shared = capture.shared if capture is not None else {}
    key = (FAMILY.name, *key)
    if key not in shared:
        shared[key] = build()
    return shared[key]


def _engine_step(shape: EngineStep, target: Target) -> None:
    """One engine step (see the module doc), on meta tensors."""
    import torch

    from ..platforms.vllm_platform import refresh_switches
    from ..vllm.engine_config import engine_config

    module = import_library_module(BACKEND_MODULE)
    meta = torch.device("meta")
    backend = module.AiterFlashAttentionBackend
    # One configuration per backend, as each server has (`_vllm_backend.engine_step`).
    config = engine_config(shape.config_json, shape.serving, target, backend.get_name())
    refresh_switches()
    mix = _request_mix(shape)
    with (
        import_library_module("vllm.config").set_current_vllm_config(config),
        # Built under the configuration (its custom ops read it), once per mix.
        _registered(config, _shared(("layers", mix), lambda: _attention_layers(config, shape, backend))) as layer,
    ):
        spec = runner_spec(backend, layer.get_kv_cache_spec(config), target)
        kv_cache, width = layer_kv_cache(config, backend, spec, shape, target)

        def build() -> Any:
            builder = backend.get_builder_cls()(spec, [LAYER_NAME], config, meta)
            common, host_values = common_attention_metadata(
                list(shape.query_lens), list(shape.context_lens), width, shape.max_seq_len
            )
            with unpinned_host_memory(), host_copies(host_values):
                return builder.build(0, common)

        # The block table's width is the configuration's, whatever the storage class.
        metadata = _shared(("metadata", mix, width), build)
        tokens = sum(shape.query_lens)
        query = torch.empty((tokens, shape.q_heads, shape.head_size), dtype=getattr(torch, shape.dtype), device=meta)
        key = torch.empty((tokens, shape.kv_heads, shape.head_size), dtype=query.dtype, device=meta)
        output = torch.empty_like(query)
        # vLLM's compiled KV-cache write and merge (on CDNA3 and newer) are prebuilt; its Triton
        # merge compiles per count of tokens with context in some releases.
        with (
            compiled_ops_skipped("_C_cache_ops.reshape_and_cache_flash"),
            prebuilt_ops_skipped(("merge_attn_states",)),
            merges_for_every_token_count(shape.serving.max_num_batched_tokens),
        ):
            # From 0.19 the layer writes the KV cache before `forward` (up to 0.18 `forward` writes it).
            if hasattr(layer.impl, "do_kv_cache_update"):
                layer.impl.do_kv_cache_update(layer, key, torch.empty_like(key), kv_cache, metadata.slot_mapping)
            layer.impl.forward(layer, query, key, torch.empty_like(key), kv_cache, metadata, output=output)


def _extend_step(shape: ExtendStep, target: Target) -> None:
    """One step as the backend's builder and impl see it up to 0.18: vLLM's own layer (whose
    window the builder reads, 0.12), the builder's metadata, the impl's `forward`."""
    import torch

    from ..platforms.vllm_platform import refresh_switches
    from ..vllm.engine_config import engine_config

    module = import_library_module(BACKEND_MODULE)
    set_current_vllm_config = import_library_module("vllm.config").set_current_vllm_config
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    refresh_switches()
    backend = module.AiterFlashAttentionBackend

    def build() -> tuple[Any, Any]:
        vllm_config = engine_config(shape.config_json, shape.serving, target)
        layers = _attention_layers(vllm_config, shape, backend)
        with set_current_vllm_config(vllm_config), _registered(vllm_config, layers) as layer:
            spec = layer.get_kv_cache_spec(vllm_config)
            builder = backend.get_builder_cls()(spec, [LAYER_NAME], vllm_config, meta)
            common, host_values = common_attention_metadata(
                list(shape.query_lens), list(shape.context_lens), shape.max_blocks_per_seq
            )
            with unpinned_host_memory(), host_copies(host_values):
                return layer, builder.build(common_prefix_len=0, common_attn_metadata=common)

    layer, metadata = _shared(("metadata", _request_mix(shape)), build)
    element_type = torch.uint8 if shape.kv_cache_fp8 else dtype
    element = torch.empty((), dtype=element_type, device=meta).element_size()
    per_block = 2 * shape.block_size * shape.kv_heads * shape.head_size * element
    needed = shape.max_blocks_per_seq * len(shape.query_lens)
    blocks = block_count(needed, per_block, shape.kv_cache_storage)
    kv_cache = torch.empty(
        backend.get_kv_cache_shape(blocks, shape.block_size, shape.kv_heads, shape.head_size),
        dtype=element_type,
        device=meta,
    )
    tokens = sum(shape.query_lens)
    query = torch.empty((tokens, shape.q_heads, shape.head_size), dtype=dtype, device=meta)
    key = torch.empty((tokens, shape.kv_heads, shape.head_size), dtype=dtype, device=meta)
    # vLLM's compiled KV-cache write is prebuilt.
    with compiled_ops_skipped("_C_cache_ops.reshape_and_cache_flash"):
        layer.impl.forward(layer, query, key, torch.empty_like(key), kv_cache, metadata, output=torch.empty_like(query))


FAMILY = KernelFamily(
    name="aiter_fa_context",
    description=(
        "vLLM's cp_mha_gather_cache and merge_attn_states around ROCM_AITER_FA's prefill with cached context, "
        "AITER's Triton unified attention for its windowed, sink and speculative decodes"
    ),
    library=VLLM_DISTRIBUTION,
    # AITER's Triton unified attention (windowed, sink and speculative decodes) reads the target at import.
    traced_modules=(BACKEND_MODULE, *VLLM_ATTENTION_OPS, "aiter.ops.triton"),
    enumerate_shapes=enumerate_extends,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
    step_group=_request_mix,
)
