"""vLLM's block-FP8 linear layers where vLLM runs its Triton block-scaled GEMM and per-token-group
quantization, traced from the installed vLLM: on ROCm, and on NVIDIA's sm89 where the line says so
(`selection/engines.py` says what runs elsewhere).

The plan runs vLLM's own `create_weights`, `process_weights_after_loading` and `apply` on meta
tensors for every quantized layer of the rank, at one M of each (tuned-table entry, integer class)
pair up to max-num-batched-tokens. What vLLM runs per release, its tuned tables, the layers covered
and those not: docs/engine-kernels.md, "Block-FP8 linear layers".
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..errors import ModelConfigError
from ..inputs.models import FieldReader, ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import (
    AITER_PACKAGE,
    VLLM_DISTRIBUTION,
    aiter_hip_absent,
    import_library_module,
)
from ..vllm.engine_config import CUTLASS_FROM_CAPABILITY, cutlass_answer
from ..vllm.releases import ReleaseLine
from ._vllm_backend import attributes_set
from .family import KernelFamily

FP8_MODULE = "vllm.model_executor.layers.quantization.fp8"
FP8_UTILS_MODULE = "vllm.model_executor.layers.quantization.utils.fp8_utils"
QUANT_MODULE = "vllm.model_executor.layers.quantization.input_quant_fp8"
# The registered operator vLLM's Triton GEMM path calls (defined in fp8_utils up to 0.18, in the
# Triton kernel module from 0.19): its implementation, run on meta tensors.
GEMM_OPERATOR = "w8a8_triton_block_scaled_mm_func"
GEMM_MODULES = (FP8_UTILS_MODULE, "vllm.model_executor.kernels.linear.scaled_mm.triton")
# Device names as vLLM's ROCm platform reports them (its device-ID map, else the market name),
# per arch: each with a tuned table gets its own kernels, the others share the default config.
DEVICE_NAMES = {
    "gfx942": (
        "AMD_Instinct_MI300X",
        "AMD_Instinct_MI325X",
        "AMD_Instinct_MI325_OAM",
        "AMD_Instinct_MI300X_HF",
        "AMD_Instinct_MI300A",
        "AMD_Instinct_MI308X",
    ),
    "gfx950": ("AMD_Instinct_MI350X", "AMD_Instinct_MI355X"),
    # NVIDIA's as torch names them (spaces as underscores): Ada parts with a table, and the L4 for
    # those without.
    "sm89": ("NVIDIA_L40S", "NVIDIA_L20", "NVIDIA_L20Y", "NVIDIA_L4"),
}
# vLLM's compiled query of CUTLASS's block-FP8 support, asked when its FP8 modules are imported
# and when a linear method is built. Its answer where vLLM's extension cannot be loaded (a
# builder): its C++ (`cutlass_scaled_mm_supports_block_fp8`, csrc/.../scaled_mm_entry.cu) says
# sm90 and newer for the CUDA 12.8+ builds vLLM releases.
CUTLASS_QUERY = "cutlass_scaled_mm_supports_block_fp8"
# The module vLLM 0.19+ imports from AITER to ask whether its Triton block-scale GEMM is tuned.
AITER_TUNED_LOOKUP = "aiter.ops.triton.utils.gemm_config_utils"
CUTLASS_BLOCK_FP8_FROM = CUTLASS_FROM_CAPABILITY[CUTLASS_QUERY]


@dataclass(frozen=True)
class BlockFp8LinearShape:
    layer: str
    # Per rank: the output widths of the layer's (merged) weights, and its input width.
    output_sizes: tuple[int, ...]
    k: int
    # The layer's full sizes and its tensor-parallel split (1 for replicated layers).
    input_size: int
    output_size: int
    tp_size: int
    m: int
    device_name: str
    arch: str
    block: tuple[int, int]
    dtype: str
    enforce_eager: bool
    # What vLLM builds its engine configuration (and so its quantization config) from.
    config_json: str
    serving: ServingParams

    @property
    def n(self) -> int:
        return sum(self.output_sizes)


@dataclass(frozen=True)
class _Layer:
    name: str
    output_sizes: tuple[int, ...]
    k: int
    input_size: int
    output_size: int
    tp_size: int


def _split(size: int, tp: int, field: str, model: ModelConfig) -> int:
    if size % tp:
        raise ModelConfigError(field, size, f"a multiple of --tp = {tp} for vLLM to split it", model.source)
    return size // tp


def linear_layers(model: ModelConfig, tp: int) -> tuple[_Layer, ...]:
    """Every quantized linear layer of one rank (vLLM's DeepSeek-V2/V3 and Llama-style modules)."""
    raw = json.loads(model.config_json)
    fields = FieldReader(raw, model.source)
    hidden = fields.positive_int("hidden_size")
    heads = model.num_attention_heads
    layers = []
    if model.mla is not None:
        mla = model.mla
        qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        kv_a = mla.kv_lora_rank + mla.qk_rope_head_dim
        q_lora_rank = fields.positive_int("q_lora_rank", default=None)
        q_columns = _split(heads * qk_head, tp, "num_attention_heads", model)
        if q_lora_rank is not None:
            layers.append(_Layer("fused_qkv_a_proj", (q_lora_rank, kv_a), hidden, hidden, q_lora_rank + kv_a, 1))
            layers.append(_Layer("q_b_proj", (q_columns,), q_lora_rank, q_lora_rank, heads * qk_head, tp))
        else:
            layers.append(_Layer("kv_a_proj_with_mqa", (kv_a,), hidden, hidden, kv_a, 1))
            layers.append(_Layer("q_proj", (q_columns,), hidden, hidden, heads * qk_head, tp))
        kv_b = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        layers.append(_Layer("kv_b_proj", (kv_b // tp,), mla.kv_lora_rank, mla.kv_lora_rank, kv_b, tp))
        attention_out = heads * mla.v_head_dim
    else:
        kv_heads = model.num_key_value_heads
        kv_per_rank = max(1, kv_heads // tp)
        q_width = _split(heads * model.head_dim, tp, "num_attention_heads", model)
        kv_width = kv_per_rank * model.head_dim
        layers.append(
            _Layer(
                "qkv_proj", (q_width, kv_width, kv_width), hidden, hidden, (heads + 2 * kv_heads) * model.head_dim, tp
            )
        )
        attention_out = heads * model.head_dim
    layers.append(_Layer("o_proj", (hidden,), attention_out // tp, attention_out, hidden, tp))
    experts = raw.get("n_routed_experts") or raw.get("num_experts") or raw.get("num_local_experts")
    dense_layers = fields.positive_int("num_hidden_layers", default=1) if not experts else 0
    if experts and model.mla is not None:
        dense_layers = raw.get("first_k_dense_replace") or 0
    if dense_layers:
        intermediate = _split(fields.positive_int("intermediate_size"), tp, "intermediate_size", model)
        layers += _mlp("mlp", intermediate, hidden, tp)
    shared = raw.get("n_shared_experts")
    if experts and model.mla is not None and shared:
        width = fields.positive_int("moe_intermediate_size") * fields.positive_int("n_shared_experts")
        layers += _mlp("shared_experts", _split(width, tp, "moe_intermediate_size", model), hidden, tp)
    return tuple(layers)


def kv_b_proj_in_fp8(model: ModelConfig) -> bool:
    """Whether some layer holds MLA's kv_b_proj in FP8, so that its block-FP8 GEMM runs: as
    vLLM's build of the layers says where it built them, else unless the checkpoint leaves it out
    of every layer as vLLM's FP8 config reads it (`ignored_layers`, else `modules_to_not_convert`;
    each layer's module by its exact name). A layer left out takes vLLM's unquantized GEMM; where
    in doubt the GEMM is planned (a kernel too many, not one compiled while serving)."""
    built = {layer.kv_b_proj_dtype for layer in model.attention_layers if layer.mla} - {""}
    if built:
        return any(dtype.startswith("float8") for dtype in built)
    quantization = model.quantization or {}
    listed = quantization.get("ignored_layers") or quantization.get("modules_to_not_convert") or []
    left_out = set(listed) if isinstance(listed, list) and all(isinstance(entry, str) for entry in listed) else set()
    return any(f"model.layers.{index}.self_attn.kv_b_proj" not in left_out for index in range(model.num_layers))


def _mlp(name: str, intermediate: int, hidden: int, tp: int) -> list[_Layer]:
    return [
        _Layer(f"{name}.gate_up_proj", (intermediate, intermediate), hidden, hidden, 2 * intermediate * tp, tp),
        _Layer(f"{name}.down_proj", (hidden,), intermediate, intermediate * tp, hidden, tp),
    ]


def aiter_has_tuned_lookup() -> bool:
    """Whether the installed AITER has the module vLLM 0.19+ asks which (N, K) AITER's Triton
    block-scale GEMM is tuned for (`_triton_gemm_config_is_tuned`): where it is missing, vLLM's
    import fails, it takes that as untuned, and runs AITER's CK GEMM (read as files: `import aiter`
    needs ROCm)."""
    spec = importlib.util.find_spec(AITER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return False
    directory = Path(next(iter(spec.submodule_search_locations)))
    return directory.joinpath(*AITER_TUNED_LOOKUP.split(".")[1:]).with_suffix(".py").is_file()


def installed_aiter() -> str:
    from ..inputs.toolchain import aiter_version

    return aiter_version() or "(not installed)"


def _tuned_batch_sizes(n: int, k: int, device_name: str, block: tuple[int, int]) -> tuple[int, ...] | None:
    """The batch sizes of vLLM's tuned table for (N, K) on this device, in the file's order, or
    None where the installed vLLM has none (read as files: vLLM is not imported)."""
    spec = importlib.util.find_spec(FP8_UTILS_MODULE.partition(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations)), *FP8_UTILS_MODULE.split(".")[1:-1], "configs")
    name = f"N={n},K={k},device_name={device_name},dtype=fp8_w8a8,block_shape=[{block[0]},{block[1]}].json"
    path = directory / name
    if not path.is_file():
        return None
    return tuple(int(key) for key in json.loads(path.read_text()))


def m_representatives(batch_sizes: tuple[int, ...] | None, largest: int) -> tuple[int, ...]:
    """One M per (tuned entry vLLM picks for it, Triton's integer class of M) up to `largest`: the
    entry is the one nearest to M, the first of equals in the table's order, as vLLM picks it."""
    chosen: dict[tuple[int | None, str], int] = {}
    for m in range(1, largest + 1):
        entry = min(batch_sizes, key=lambda size: abs(size - m)) if batch_sizes else None
        kind = "one" if m == 1 else "div16" if m % 16 == 0 else "other"
        chosen.setdefault((entry, kind), m)
    return tuple(sorted(chosen.values()))


def enumerate_block_fp8_linear(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[BlockFp8LinearShape, ...]:
    """Every layer's call at one M per kernel class, for every device of the ROCm FP8 archs;
    none for a model without block-FP8 weights."""
    if model.fp8_block_size is None:
        return ()
    dtype = serving.activation_dtype(model)
    shapes = []
    for layer in linear_layers(model, serving.tensor_parallel_size):
        if layer.name == "kv_b_proj" and not kv_b_proj_in_fp8(model):
            continue
        n = sum(layer.output_sizes)
        for arch, names in DEVICE_NAMES.items():
            untuned_seen = False
            for device_name in names:
                sizes = _tuned_batch_sizes(n, layer.k, device_name, model.fp8_block_size)
                if sizes is None:
                    # Every device without a table takes the same default config.
                    if untuned_seen:
                        continue
                    untuned_seen = True
                for m in m_representatives(sizes, serving.max_num_batched_tokens):
                    shapes.append(
                        BlockFp8LinearShape(
                            layer.name,
                            layer.output_sizes,
                            layer.k,
                            layer.input_size,
                            layer.output_size,
                            layer.tp_size,
                            m,
                            device_name,
                            arch,
                            model.fp8_block_size,
                            dtype,
                            serving.enforce_eager,
                            model.config_json,
                            serving,
                        )
                    )
    return tuple(shapes)


def describe_shapes(shapes: tuple[BlockFp8LinearShape, ...]) -> dict[str, object]:
    layers = {shape.layer: f"N={shape.n} K={shape.k}" for shape in shapes}
    quantization = "Triton (eager)" if shapes[0].enforce_eager else "compiled with the model's graph"
    return {
        **layers,
        "m": f"{len({shape.m for shape in shapes})} values up to {max(shape.m for shape in shapes)}",
        "block": "x".join(map(str, shapes[0].block)),
        "quantization": quantization,
    }


def describe_call(shape: BlockFp8LinearShape) -> str:
    return f"{shape.layer}.apply(m={shape.m}, n={shape.n}, k={shape.k}, {shape.device_name})"


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if target.name not in DEVICE_NAMES:
        return (
            f"vLLM's block-FP8 Triton path is planned for {', '.join(DEVICE_NAMES)} (where vLLM takes it; "
            "CUTLASS, DeepGEMM or Marlin elsewhere on NVIDIA GPUs)"
        )
    return None


class _Unlaunched:
    """A Triton kernel that is not launched: `kernel[grid](...)` does nothing."""

    def __getitem__(self, grid: object) -> Any:
        return lambda *args, **kwargs: None


def _target_platform_bound(platform: Any) -> list[tuple[object, str, object]]:
    """vLLM's modules bind `current_platform` at import, and the modules this call runs register
    torch operators and custom ops at import, so they cannot be imported afresh per target as
    other families' modules are: instead every loaded vLLM module's `current_platform` is the
    target's platform for the call (its FP8 type, e4m3fnuz normalization, device name, AITER
    rule), and the quantization's FP8 type, read from it at import, too (its FP8 range there is
    the native path's, not the kernel's)."""
    import sys

    return [
        (module, "current_platform", platform)
        for name, module in sys.modules.copy().items()
        if name.startswith("vllm.")
        and module is not None
        and type(getattr(module, "current_platform", None)).__name__ == type(platform).__name__
        and module.current_platform is not platform
    ]


def _compiled_queries(target: Target) -> list[tuple[object, str, object]]:
    """On NVIDIA targets where vLLM's extension is not loaded: its CUTLASS queries answering as
    the extension would on the target's GPU (0.19's FP8 method asks `cutlass_scaled_mm_supports_fp8`
    as well when it is built)."""
    import torch

    if target.is_rocm or hasattr(torch.ops._C, CUTLASS_QUERY):
        return []
    return [
        (torch.ops._C, name, functools.partial(cutlass_answer, first))
        for name, first in CUTLASS_FROM_CAPABILITY.items()
    ]


def _cutlass_answers_bound(target: Target) -> list[tuple[object, str, object]]:
    """vLLM's modules keep the query's answer from their import (`CUTLASS_BLOCK_FP8_SUPPORTED`),
    whichever target that was: the target's answer for the call, as `_target_platform_bound`
    does for the platform."""
    import sys

    answer, name = int(target.arch) >= CUTLASS_BLOCK_FP8_FROM, "CUTLASS_BLOCK_FP8_SUPPORTED"
    return [
        (module, name, answer)
        for module_name, module in sys.modules.copy().items()
        if module_name.startswith("vllm.") and isinstance(getattr(module, name, None), bool)
    ]


def _gemm_implementation() -> Any:
    for module_name in GEMM_MODULES:
        with contextlib.suppress(ModuleNotFoundError):
            implementation = getattr(import_library_module(module_name), f"_{GEMM_OPERATOR}", None)
            if implementation is not None:
                return implementation
    raise LookupError(f"the installed vLLM defines no _{GEMM_OPERATOR} where kprecompile looks ({GEMM_MODULES})")


def chose_triton(method: Any) -> bool:
    """Whether vLLM's linear method chose its Triton GEMM (0.11-0.18: the op's `_run_triton`; from
    0.19: `TritonFp8BlockScaledMMKernel`)."""
    return chosen_path(method) in ("_run_triton", "TritonFp8BlockScaledMMKernel")


@contextlib.contextmanager
def built_layer(shape: BlockFp8LinearShape, target: Target, loaded: bool = True) -> Iterator[tuple[Any, Any]]:
    """vLLM's linear method and one rank's layer, built and loaded as vLLM does (`create_weights`,
    `process_weights_after_loading`) on meta tensors; the block is where vLLM would call it. Not
    `loaded`: before loading, where the method has chosen its path (loading for paths with
    compiled weight repacking, Marlin's, needs vLLM's extension)."""
    import torch

    from ..platforms.vllm_platform import refresh_switches, target_imports
    from ..vllm.engine_config import engine_config

    queries = _compiled_queries(target)
    # vLLM inspects the model's class when it builds its config: its modules import as on the GPU host.
    with target_imports(target), attributes_set(*queries):
        config = engine_config(shape.config_json, shape.serving, target)
    refresh_switches()
    with aiter_hip_absent(), attributes_set(*queries):
        fp8 = import_library_module(FP8_MODULE)
        fp8_utils = import_library_module(FP8_UTILS_MODULE)
        set_current_vllm_config = import_library_module("vllm.config").set_current_vllm_config
        parallel_state = import_library_module("vllm.distributed.parallel_state")
        platform = import_library_module("vllm.platforms")._current_platform
        quantization = import_library_module(QUANT_MODULE)
        gemm = _gemm_implementation()
    changes = [
        *queries,
        *(_cutlass_answers_bound(target) if queries else []),
        *_target_platform_bound(platform),
        (quantization, "_FP8_DTYPE", platform.fp8_dtype()),
        # The rank's tensor-parallel group as vLLM's layers read it (no process group here).
        (parallel_state, "_TP", SimpleNamespace(world_size=shape.tp_size, rank_in_group=0)),
        # The GPU's name as vLLM's platform reads it (through amdsmi on the GPU host).
        (platform, "get_device_name", lambda device_id=0: shape.device_name),
        # vLLM's registered GEMM operator runs its implementation (its fake one only allocates).
        (torch.ops.vllm, GEMM_OPERATOR, gemm),
        # Releasing the allocator's cache after padding the weight: no device here.
        (torch.accelerator, "empty_cache", lambda: None),
        (torch.cuda, "empty_cache", lambda: None),
        # vLLM's compiled quantization (0.19 and newer on ROCm) is prebuilt.
        (torch.ops._C, "per_token_group_fp8_quant", lambda *args, **kwargs: None),
    ]
    if not shape.enforce_eager:
        # Under torch.compile the quantization is part of the model's graph: Inductor compiles it.
        changes.append((fp8_utils, "_per_token_group_quant_fp8", _Unlaunched()))
    # Memos of the device's table (keyed by N, K and block only) and, from 0.19, of its name: the
    # next device must read its own.
    memos = [fp8_utils.get_w8a8_block_fp8_configs]
    with contextlib.suppress(ModuleNotFoundError):
        named = getattr(import_library_module("vllm.utils.platform_utils"), "get_device_name_as_file_name", None)
        memos += [named] if hasattr(named, "cache_clear") else []
    for memo in memos:
        memo.cache_clear()
    try:
        # AITER's HIP side is absent on a builder without ROCm (vLLM's kernel modules try it at import).
        with set_current_vllm_config(config), attributes_set(*changes), torch.device("meta"), aiter_hip_absent():
            # vLLM's loader builds the model under the model's dtype as torch's default (0.19 and
            # newer take the GEMM's output dtype from it).
            default_dtype = torch.get_default_dtype()
            torch.set_default_dtype(getattr(torch, shape.dtype))
            try:
                method = fp8.Fp8LinearMethod(config.quant_config)
            finally:
                torch.set_default_dtype(default_dtype)
            layer = torch.nn.Module()
            layer.tp_size = shape.tp_size
            method.create_weights(
                layer,
                shape.k,
                list(shape.output_sizes),
                shape.input_size,
                shape.output_size,
                getattr(torch, shape.dtype),
                weight_loader=lambda *args, **kwargs: None,
            )
            if loaded:
                method.process_weights_after_loading(layer)
            yield method, layer
    finally:
        for memo in memos:
            memo.cache_clear()


def launch(shape: BlockFp8LinearShape, target: Target) -> None:
    """One linear layer's forward on one rank, as vLLM builds, loads and calls it, on meta tensors."""
    import torch

    if shape.arch != target.name:
        return
    with built_layer(shape, target) as (method, layer):
        if not chose_triton(method):
            raise RuntimeError(f"vLLM chose {chosen_path(method)} for this layer, not its Triton block-FP8 GEMM")
        method.apply(layer, torch.empty((shape.m, shape.k), dtype=getattr(torch, shape.dtype)))


def chosen_path(method: Any) -> str:
    """The GEMM path vLLM's linear method chose (its op's method, or its kernel class); up to 0.18
    Marlin (weight-only FP8, GPUs below sm89) goes before the op."""
    op = getattr(method, "w8a8_block_fp8_linear", None)
    if op is None:
        return type(getattr(method, "fp8_linear", None)).__name__
    return "apply_fp8_marlin_linear" if getattr(method, "use_marlin", False) else op.w8a8_blockscale_op.__name__


FAMILY = KernelFamily(
    name="block_fp8_linear",
    description="vLLM's Triton block-scaled FP8 GEMM (and per-token-group quantization) of every linear layer",
    library=VLLM_DISTRIBUTION,
    # None imported afresh per target: see `_target_platform_bound`.
    traced_modules=(),
    enumerate_shapes=enumerate_block_fp8_linear,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
)
