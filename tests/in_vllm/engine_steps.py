"""Inside a real vLLM release: random engine steps of the tests' own, run through the release's own
attention layer, metadata builder and impl, to check a plan against what serving would compile.

The plan enumerates steps through kprecompile's families; this drives vLLM's code independently:
vLLM's `Attention` built with a layer kind's features (window, soft-cap, sinks, dtype; vLLM picks
its backend and impl), registered in the engine configuration so the builder reads it, the
backend's own metadata builder given the common metadata the runner makes for the step (padded
as the runner pads), the KV cache in the backend's shape, then the impl's KV update and
`forward`, all on meta tensors under kprecompile's capture.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import random
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from release_support import environment
from vllm_releases import since

from kprecompile.inputs.layers import AttentionLayer
from kprecompile.inputs.models import ModelConfig
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import Target
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.shapes import FAMILIES as KERNEL_FAMILIES
from kprecompile.shapes._paged_kv import TWO_GIB
from kprecompile.shapes._vllm_backend import (
    VLLM_ATTENTION_OPS,
    host_copies,
    prebuilt_ops_skipped,
    unpinned_host_memory,
    vllm_record,
)
from kprecompile.tracing.libraries import import_library_module
from kprecompile.tracing.prebuilt import aiter_attention_prebuilt, compiled_ops_skipped, prebuilt_varlen_attention
from kprecompile.tracing.trace import capturing
from kprecompile.vllm.engine_config import engine_config
from kprecompile.vllm.model_layers import vllm_layers
from kprecompile.vllm.releases import installed_release, release_line
from kprecompile.warmup.planning import plan

# vLLM's attention layer class: moved in 0.19.
ATTENTION_MODULES = ("vllm.model_executor.layers.attention.attention", "vllm.attention.layer")
BACKEND_MODULES = {
    "TRITON_ATTN": "vllm.v1.attention.backends.triton_attn",
    "ROCM_ATTN": "vllm.v1.attention.backends.rocm_attn",
    "ROCM_AITER_FA": "vllm.v1.attention.backends.rocm_aiter_fa",
}
# The family of a backend not named after it.
FAMILIES = {"ROCM_AITER_FA": "aiter_fa_context"}
# Libraries a backend's kernels come from besides vLLM's, imported afresh for the target.
BACKEND_LIBRARIES = {"ROCM_AITER_FA": ("aiter.ops.triton",)}
# vLLM's compiled operators the impls call besides Triton's kernels (nothing to compile).
PREBUILT_OPS = ("paged_attention_rocm", "reshape_and_cache", "reshape_and_cache_flash", "merge_attn_states")
# The first release whose runner pads a full graph's requests (`num_reqs_padded` in gpu_model_runner.py).
PADS_REQUESTS_SINCE = "0.12"
# MLA's: the latent cache write, the context's gather from it, the merge's compiled operator.
MLA_PREBUILT_OPS = (
    "concat_and_cache_mla",
    "gather_and_maybe_dequant_cache",
    "gather_cache",
    "cp_gather_cache",
    "merge_attn_states",
)
MLA_COMPILED_OPS = (
    "_C_cache_ops.concat_and_cache_mla",
    "_C_cache_ops.gather_and_maybe_dequant_cache",
    "_C_cache_ops.cp_gather_cache",
)
_names = itertools.count()


@dataclass(frozen=True)
class EngineStep:
    """One scheduler step: each request's new tokens and the tokens it had cached before."""

    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    # Blocks in the layer's KV cache (vLLM sizes it from free memory): 0 as few as the step needs,
    # -1 just past 2 GiB (ROCm's buffer-ops class of a pointer).
    kv_cache_blocks: int


def random_steps(rng: random.Random, serving: ServingParams, model_len: int, count: int) -> list[EngineStep]:
    """Decode batches, prefills of new prompts, prefills over cached context (prefix hits and
    chunked prefills) and mixes of them, within max_num_seqs, the token budget and the model length."""
    budget = serving.max_num_batched_tokens
    steps = []
    while len(steps) < count:
        kind = rng.choice(["decode", "decode", "prefill", "cached", "mixed"])
        num_seqs = rng.randint(1, serving.max_num_seqs)
        queries, contexts = [], []
        for index in range(num_seqs):
            decode = kind == "decode" or (kind == "mixed" and index > 0 and rng.random() < 0.7)
            query = 1 if decode else rng.choice([2, rng.randint(2, 64), rng.randint(2, budget)])
            query = min(query, budget - sum(queries) - (num_seqs - index - 1), model_len)
            if query < 1:
                break
            if decode:
                context = rng.choice([rng.randint(1, 64), rng.randint(1, model_len - 1), model_len - 1])
            elif kind == "prefill":
                context = 0
            else:
                context = rng.choice([0, rng.randint(1, 32), rng.randint(1, model_len), model_len])
            queries.append(query)
            contexts.append(max(0, min(context, model_len - query)))
        if not queries:
            continue
        blocks = rng.choice([0, 0, -1, rng.randint(1, 200_000)])
        steps.append(EngineStep(tuple(queries), tuple(contexts), blocks))
    return steps


def built_layers(model: ModelConfig, serving: ServingParams, target: Target, backend: str) -> Any:
    """vLLM's own build of the model's attention layers (`vllm_layers`), None where vLLM cannot."""
    return vllm_layers(model, serving, target, installed_release(), backend, {}, None)


def planned(model: ModelConfig, serving: ServingParams, backend: str, target: Target, layers) -> tuple[set[str], Any]:
    """The plan's keys for `model` with `layers`, and the backend family's row of the plan."""
    model = replace(model, attention_layers=tuple(layers))
    name = FAMILIES.get(backend, backend.lower())
    selection = select(
        model, "vllm", backend, environ={}, families=[name], vllm_release=installed_release(), targets=[target]
    )
    result = plan(Request(model, serving, selection, (target,)))
    [family] = [family for family in result.families if family.family == name]
    return {job.key for job in result.jobs if job.family == family.family}, family


def _attention_class() -> Any:
    for name in ATTENTION_MODULES:
        with contextlib.suppress(ImportError):
            return import_library_module(name).Attention
    raise ImportError(f"none of {ATTENTION_MODULES}")


def _capture_sizes(config: Any) -> list[int]:
    if config.model_config.enforce_eager:
        return []
    return sorted(config.compilation_config.cudagraph_capture_sizes or [])


def _padded(step: EngineStep, config: Any, builder: Any) -> tuple[int, int]:
    """Tokens and requests as the runner hands them to attention: tokens padded to the next
    capture size (piecewise graphs, every release); a uniform decode batch replayed from a full
    graph also has its requests padded (0.12 and later: `num_reqs_padded`)."""
    tokens, requests = sum(step.query_lens), len(step.query_lens)
    sizes = [size for size in _capture_sizes(config) if size >= tokens]
    if not sizes:
        return tokens, requests
    padded = sizes[0]
    support = getattr(type(builder), "_cudagraph_support", None) or getattr(builder, "cudagraph_support", None)
    full = support is not None and support.name in ("ALWAYS", "UNIFORM_BATCH", "UNIFORM_SINGLE_TOKEN_DECODE")
    pads_requests = since(installed_release(), PADS_REQUESTS_SINCE)
    if full and pads_requests and max(step.query_lens) == 1 and padded <= config.scheduler_config.max_num_seqs:
        return padded, padded
    return padded, requests


@contextlib.contextmanager
def _default_dtype(dtype: Any) -> Any:
    """The model's dtype as torch's default while its layers are built, as vLLM's model loader
    sets it (0.33's selector checks a backend against it)."""
    import torch

    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _prebuilt_aiter(backend: str) -> Any:
    """AITER's prebuilt attention for a backend that calls it (its module imports `aiter`)."""
    return aiter_attention_prebuilt() if backend in BACKEND_LIBRARIES else contextlib.nullcontext()


def _selector_forgets() -> None:
    """vLLM's selector remembers its answer per layer's features, not per backend named (up to
    0.18 the backend is a variable it reads inside): each layer asks afresh."""
    for name in ("vllm.v1.attention.selector", "vllm.attention.selector"):
        with contextlib.suppress(ImportError):
            cached = getattr(import_library_module(name), "_cached_get_attn_backend", None)
            if cached is not None:
                cached.cache_clear()


class LayerDriver:
    """One attention layer of a kind, built by vLLM in the engine configuration, with its
    backend's metadata builder: runs engine steps through them."""

    def __init__(self, model: ModelConfig, serving: ServingParams, kind: AttentionLayer, target: Target, backend: str):
        import torch

        self.target, self.kind, self.serving, self.requested = target, kind, serving, backend
        named = release_line(installed_release()).backend_variable
        self.name = f"model.layers.{next(_names)}.self_attn.attn"
        extra: dict[str, Any] = {}
        if kind.sinks:
            extra["sinks"] = torch.empty(kind.num_heads, dtype=getattr(torch, kind.sinks), device="meta")
        # Named by the variable, it is read where the configuration is made (0.13, 0.14: the
        # attention config's default) and where the selector runs (0.11, 0.12).
        with environment(**({"VLLM_ATTENTION_BACKEND": backend} if named else {})):
            self.config = config = engine_config(model.config_json, serving, target, None if named else backend)
            self._build(kind, config, extra)

    def _build(self, kind: AttentionLayer, config: Any, extra: dict[str, Any]) -> None:
        import torch

        with (
            import_library_module("vllm.config").set_current_vllm_config(config),
            torch.device("meta"),
            _default_dtype(getattr(torch, kind.dtype)),
        ):
            _selector_forgets()
            self.layer = _attention_class()(
                kind.num_heads,
                kind.head_size,
                kind.head_size**-0.5,
                num_kv_heads=kind.num_kv_heads,
                cache_config=config.cache_config,
                logits_soft_cap=kind.logits_soft_cap or None,
                per_layer_sliding_window=kind.sliding_window or None,
                prefix=self.name,
                **extra,
            )
            self.spec = self.layer.get_kv_cache_spec(config)
            self.backend = self.layer.attn_backend
            # As the runner hands the spec on from 0.31: customized by the backend (ROCM_ATTN packs
            # K and V as two head groups).
            if hasattr(self.backend, "customize_spec"):
                self.spec = self.backend.customize_spec(self.spec)
            self.builder = self.backend.get_builder_cls()(self.spec, [self.name], config, torch.device("meta"))

    @property
    def backend_name(self) -> str:
        return self.backend.get_name()

    def _kv_cache(self, step: EngineStep, requests: int) -> tuple[Any, int]:
        """The layer's KV cache as the runner binds it, and its block table's width."""

        seq_len = max(q + c for q, c in zip(step.query_lens, step.context_lens, strict=True))
        block_size = self.spec.block_size
        needed = -(-seq_len // block_size) * requests
        if hasattr(self.backend, "get_kv_cache_shape"):
            with contextlib.suppress(NotImplementedError):
                return self._declared_kv_cache(step, needed)
        from kprecompile.shapes._vllm_backend import layer_kv_cache

        storage = "over_2gib" if step.kv_cache_blocks == -1 else "under_2gib"
        shape = SimpleNamespace(
            num_seqs=requests,
            max_seq_len=seq_len,
            kv_cache_storage=storage,
            kv_cache_blocks=max(0, step.kv_cache_blocks),
        )
        return layer_kv_cache(self.config, self.backend, self.spec, shape, self.target)

    def _declared_kv_cache(self, step: EngineStep, needed: int) -> tuple[Any, int]:
        """Up to 0.18: the backend's declared shape and stride order over an allocation of the
        spec's element type, as the runner views its raw buffer."""
        import torch

        page = self.spec.page_size_bytes
        if step.kv_cache_blocks == -1:
            blocks = max(needed, TWO_GIB // page + 1)
        else:
            blocks = max(needed, step.kv_cache_blocks, 1)
        dims = self.backend.get_kv_cache_shape(
            blocks,
            self.spec.block_size,
            self.spec.num_kv_heads,
            self.spec.head_size,
            cache_dtype_str=self.layer.kv_cache_dtype,
        )
        try:
            order = self.backend.get_kv_cache_stride_order()
        except (AttributeError, NotImplementedError):
            order = tuple(range(len(dims)))
        tensor = torch.empty([dims[index] for index in order], dtype=self.spec.dtype, device="meta")
        inverse = [order.index(index) for index in range(len(order))]
        width = -(-self.config.model_config.max_model_len // self.spec.block_size)
        return tensor.permute(*inverse), width

    def run(self, step: EngineStep) -> None:
        import torch

        from kprecompile.platforms.vllm_platform import refresh_switches

        meta = torch.device("meta")
        tokens, requests = _padded(step, self.config, self.builder)
        query_lens = list(step.query_lens) + [0] * (requests - len(step.query_lens))
        context_lens = list(step.context_lens) + [0] * (requests - len(step.context_lens))
        seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
        starts = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32)
        padded_attention = requests != len(step.query_lens)
        # A full graph's padded tokens are the step's actual tokens to attention (0.12's runner:
        # `num_actual_tokens=num_tokens_padded`); MLA's builders count the padding as decodes.
        slots = tokens if padded_attention else sum(step.query_lens)
        kv_cache, width = self._kv_cache(step, requests)
        device = {
            "query_start_loc": torch.empty(requests + 1, dtype=torch.int32, device=meta),
            "seq_lens": torch.empty(requests, dtype=torch.int32, device=meta),
        }
        host = {
            "query_start_loc_cpu": starts,
            "seq_lens_cpu": torch.tensor(seq_lens, dtype=torch.int32),
            "num_computed_tokens_cpu": torch.tensor(context_lens, dtype=torch.int32),
        }
        api = None
        for name in ("vllm.v1.attention.backend", "vllm.v1.attention.backends.utils"):  # moved in 0.19
            with contextlib.suppress(ImportError):
                api = import_library_module(name)
                break
        common = vllm_record(
            api.CommonAttentionMetadata,
            {
                **device,
                **host,
                "seq_lens_cpu_upper_bound": host["seq_lens_cpu"],
                # 0.19's runner fills the host copies behind its deprecated properties.
                "_seq_lens_cpu": host["seq_lens_cpu"],
                "_num_computed_tokens_cpu": host["num_computed_tokens_cpu"],
                "num_reqs": requests,
                "num_actual_tokens": slots,
                "max_query_len": max(step.query_lens),
                "max_seq_len": max(seq_lens),
                "block_table_tensor": torch.empty((requests, width), dtype=torch.int32, device=meta),
                "slot_mapping": torch.empty(slots, dtype=torch.int64, device=meta),
                "causal": True,
            },
        )
        values = {id(device["query_start_loc"]): starts, id(device["seq_lens"]): host["seq_lens_cpu"]}
        compute_context_lens = getattr(common, "compute_num_computed_tokens", None)
        if compute_context_lens is not None:  # builders take them as computed on the device (0.19)
            values[id(compute_context_lens())] = host["num_computed_tokens_cpu"]
        refresh_switches()
        config_module = import_library_module("vllm.config")
        with (
            config_module.set_current_vllm_config(self.config),
            host_copies(values),
            unpinned_host_memory(),
            prebuilt_ops_skipped(self.prebuilt_ops),
            compiled_ops_skipped("_C_cache_ops.reshape_and_cache_flash", "_C_cache_ops.reshape_and_cache"),
            _prebuilt_aiter(self.requested),
        ):
            metadata = self.builder.build(0, common)
            self._attend(tokens, kv_cache, metadata)

    prebuilt_ops = PREBUILT_OPS

    def _attend(self, tokens: int, kv_cache: Any, metadata: Any) -> None:
        """The impl's KV update and `forward` for the step's (padded) tokens."""
        import torch

        meta = torch.device("meta")
        dtype = getattr(torch, self.kind.dtype)
        query_dtype = self.target.fp8_dtype if getattr(self.layer, "query_quant", None) is not None else dtype
        query = torch.empty((tokens, self.kind.num_heads, self.kind.head_size), dtype=query_dtype, device=meta)
        key = torch.empty((tokens, self.kind.num_kv_heads, self.kind.head_size), dtype=dtype, device=meta)
        output = torch.empty((tokens, self.kind.num_heads, self.kind.head_size), dtype=dtype, device=meta)
        impl = self.layer.impl
        if hasattr(impl, "do_kv_cache_update") and not getattr(self.backend, "forward_includes_kv_cache_update", True):
            impl.do_kv_cache_update(self.layer, key, torch.empty_like(key), kv_cache, metadata.slot_mapping)
        impl.forward(self.layer, query, key, torch.empty_like(key), kv_cache, metadata, output=output)


class MlaLayerDriver(LayerDriver):
    """One MLA layer of the model vLLM builds (`model_layers.build_model`: its first registered
    layer, with its own `kv_b_proj`), its weights processed as after loading, and its backend's
    metadata builder: runs engine steps through the release's MLA entry point."""

    prebuilt_ops = MLA_PREBUILT_OPS

    def __init__(self, model: ModelConfig, serving: ServingParams, target: Target, backend: str):
        import torch

        from kprecompile.vllm.engine_config import cutlass_answered
        from kprecompile.vllm.model_layers import Question, build_model

        self.target, self.serving, self.requested = target, serving, backend
        release = installed_release()
        named = release_line(release).backend_variable
        with environment(**({"VLLM_ATTENTION_BACKEND": backend} if named else {})):
            _selector_forgets()
            self.config, _ = build_model(Question.of(model, serving, target, release, backend, {}))
        layers = self.config.compilation_config.static_forward_context
        self.name, self.layer = next((name, layer) for name, layer in layers.items() if hasattr(layer, "kv_lora_rank"))
        self.dtype = self.config.model_config.dtype
        with (
            import_library_module("vllm.config").set_current_vllm_config(self.config),
            torch.device("meta"),
            # 0.32's weight processing imports a module that asks the CUDA build's CUTLASS support
            # when it defines a class (`quantization/online/fp8.py`): answered as on the target.
            cutlass_answered(target),
        ):
            # W_UK_T and W_UV from the layer's kv_b_proj, as the model loader makes them (0.34's
            # layer reads the dtype it keeps; before, the loader hands it over).
            process = self.layer.process_weights_after_loading
            if inspect.signature(process).parameters:
                process(self.dtype)
            else:
                process()
            self.spec = self.layer.get_kv_cache_spec(self.config)
            self.backend = self.layer.attn_backend
            if hasattr(self.backend, "customize_spec"):  # as the runner hands it on from 0.31
                self.spec = self.backend.customize_spec(self.spec)
            self.builder = self.backend.get_builder_cls()(self.spec, [self.name], self.config, torch.device("meta"))
        impl = self.layer.impl
        if hasattr(impl, "flash_attn_varlen_func"):  # up to 0.18: the prefill's flash attention, prebuilt
            impl.flash_attn_varlen_func = prebuilt_varlen_attention
        # Set from the decode-context-parallel group, which has one rank here.
        impl.dcp_world_size = 1

    def run(self, step: EngineStep) -> None:
        """The step with its decodes first, as vLLM's runner reorders a batch for MLA's builders."""
        threshold = getattr(self.builder, "reorder_batch_threshold", None) or 1
        order = sorted(range(len(step.query_lens)), key=lambda index: step.query_lens[index] > threshold)
        super().run(
            replace(
                step,
                query_lens=tuple(step.query_lens[index] for index in order),
                context_lens=tuple(step.context_lens[index] for index in order),
            )
        )

    def _attend(self, tokens: int, kv_cache: Any, metadata: Any) -> None:
        import torch

        meta = torch.device("meta")
        layer = self.layer
        heads, nope, rope = layer.num_heads, layer.qk_nope_head_dim, layer.qk_rope_head_dim
        query = torch.empty((tokens, heads, nope + rope), dtype=self.dtype, device=meta)
        latent = torch.empty((tokens, layer.kv_lora_rank), dtype=self.dtype, device=meta)
        k_pe = torch.empty((tokens, 1, rope), dtype=self.dtype, device=meta)
        output = torch.empty((tokens, heads * layer.v_head_dim), dtype=self.dtype, device=meta)
        if hasattr(layer, "bind_kv_cache"):  # 0.19 and newer: the runner's view, as the layer keeps it
            layer.bind_kv_cache(kv_cache)
            kv_cache = layer.kv_cache
        with _prebuilt_mla_prefill(metadata), compiled_ops_skipped(*MLA_COMPILED_OPS):
            if hasattr(layer, "forward_impl"):  # 0.19 and newer: the layer's own MLA forward
                if hasattr(layer, "update_kv_cache"):
                    layer.update_kv_cache(
                        latent, k_pe, kv_cache, metadata.slot_mapping, metadata, layer.kv_cache_dtype, layer._k_scale
                    )
                layer.forward_impl(query, latent, k_pe, kv_cache, metadata, output=output)
            else:
                layer.impl.forward(layer, query, latent, k_pe, kv_cache, metadata, output=output)


@contextlib.contextmanager
def _prebuilt_mla_prefill(metadata: Any) -> Any:
    """From 0.19 MLA's prefill attention is a prefill backend the builder puts in the metadata: its
    flash attention (prebuilt) as a stand-in of the same outputs."""
    backend = getattr(getattr(metadata, "prefill", None), "prefill_backend", None)
    if backend is None:
        yield
        return
    saved = {name: getattr(backend, name) for name in ("run_prefill_new_tokens", "run_prefill_context_chunk")}

    def new_tokens(q: Any, k: Any, v: Any, return_softmax_lse: bool, out: Any = None, output_scale: Any = None) -> Any:
        return prebuilt_varlen_attention(q, k, v, out=out, return_lse=return_softmax_lse)

    def context_chunk(*, q: Any, k: Any, v: Any, out: Any = None, **which_chunk: Any) -> Any:
        # vLLM names the chunk by keyword: its metadata `chunk` (0.33), its index `chunk_idx` (before).
        return prebuilt_varlen_attention(q, k, v, out=out, return_lse=True)

    backend.run_prefill_new_tokens, backend.run_prefill_context_chunk = new_tokens, context_chunk
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(backend, name, method)


def mla_sweep(model: ModelConfig, serving: ServingParams, backend: str, target: Target, seed: int, count: int) -> Swept:
    """`count` random engine steps through one MLA layer of the model vLLM builds, captured under
    `target`."""
    rng = random.Random(seed)
    steps = random_steps(rng, serving, serving.model_len(model), count)
    with capturing(target, KERNEL_FAMILIES[backend.lower()].traced_modules) as capture:
        driver = MlaLayerDriver(model, serving, target, backend)
        for step in steps:
            driver.run(step)
    kinds = {"decode": 0, "prefill": 0, "prefill with context": 0}
    for step in steps:
        for query, context in zip(step.query_lens, step.context_lens, strict=True):
            kind = "decode" if query == 1 else "prefill with context" if context else "prefill"
            kinds[kind] += 1
    return replace(_swept(count, capture, (driver.backend_name,)), step_kinds=kinds)


@dataclass(frozen=True)
class Swept:
    steps: int
    keys: frozenset[str]
    backends: tuple[str, ...]
    # The kernel each key compiles.
    kernels: dict[str, str]
    # Requests of each kind over the steps (MLA's sweep).
    step_kinds: dict[str, int] | None = None


def sweep(
    model: ModelConfig, serving: ServingParams, layers, backend: str, target: Target, seed: int, count: int
) -> Swept:
    """`count` random engine steps through each layer kind of `layers`, captured under `target`.
    Each kind's layer stays registered while the next kinds' are built, as the model's all are
    (up to 0.18 ROCM_AITER_FA's builder reads every layer's window), and none after."""
    rng = random.Random(seed)
    model_len = serving.model_len(model)
    fresh = (BACKEND_MODULES[backend], *VLLM_ATTENTION_OPS, *BACKEND_LIBRARIES.get(backend, ()))
    backends = []
    drivers: list[LayerDriver] = []
    try:
        with capturing(target, fresh) as capture:
            for kind in layers:
                with _prebuilt_aiter(backend):
                    driver = LayerDriver(model, serving, kind, target, backend)
                drivers.append(driver)
                backends.append(driver.backend_name)
                for step in random_steps(rng, serving, model_len, count):
                    driver.run(step)
    finally:
        for driver in drivers:
            driver.config.compilation_config.static_forward_context.pop(driver.name, None)
    return _swept(count * len(layers), capture, tuple(backends))


def _swept(steps: int, capture: Any, backends: tuple[str, ...]) -> Swept:
    names = {key: jit_function.fn.__name__ for jit_function, key in capture.captured.values()}
    return Swept(steps, frozenset(names), backends, names)
