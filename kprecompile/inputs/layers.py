"""The attention layers of a model as the engine builds them, one record per distinct kind.

An engine builds each attention layer in its model class: per-layer sliding windows (Gemma-2/3
through `layer_types`, gpt-oss on alternate layers), a logits soft-cap (Gemma-2), attention
sinks (gpt-oss), the dtype it resolved. The kernels specialize on all of them, so the plan has
one set of shapes per distinct kind. Where vLLM is installed the kinds are read from vLLM's own
model (`vllm/model_layers.py`); elsewhere `config_layers` reads them from config.json the way
vLLM's model classes and transformers' config classes do (tested against vLLM for every public
config in the tests).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import ModelConfig
    from .serving import ServingParams


@dataclass(frozen=True)
class AttentionLayer:
    """One kind of attention layer, on one tensor-parallel rank."""

    mla: bool
    num_heads: int
    # KV heads of the rank (1 for MLA's latent cache).
    num_kv_heads: int
    # Per-head size of the KV cache (MLA: kv_lora_rank + qk_rope_head_dim).
    head_size: int
    # Tokens each query attends back to, 0 for full attention.
    sliding_window: int
    # tanh soft-cap of the attention logits, 0.0 for none.
    logits_soft_cap: float
    # dtype of the per-head sink logits, "" for a layer without sinks.
    sinks: str
    # Activations and (with kv_cache_dtype "auto") the KV cache.
    dtype: str
    kv_cache_dtype: str
    # The attention backend the engine chose for the layer; "" where kprecompile's mirror read the
    # config (the selection decides).
    backend: str = ""
    # MLA: the dtype of the layer's kv_b_proj weight as the engine built it, or as the config's
    # reading gives it (`kv_b_proj_dtype`): bfloat16 where the checkpoint leaves it unquantized,
    # float8_e4m3fn for FP8; "" where neither knows.
    kv_b_proj_dtype: str = ""
    # Layers of the model that are of this kind (not part of the kind).
    count: int = 1

    @property
    def kind(self) -> AttentionLayer:
        """The layer without its count: what the kernels see."""
        return replace(self, count=1)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def distinct(layers: list[AttentionLayer] | tuple[AttentionLayer, ...]) -> tuple[AttentionLayer, ...]:
    """The distinct kinds of `layers` in first-seen order, each with the number of its layers."""
    counts = Counter(layer.kind for layer in layers for _ in range(layer.count))
    return tuple(replace(kind, count=count) for kind, count in counts.items())


# Model types vLLM refuses float16 for (`_FLOAT16_NOT_SUPPORTED_MODELS`): "auto" never gives it.
FLOAT16_NOT_SUPPORTED = ("gemma2", "gemma3", "gemma3_text", "plamo2", "glm4")


def resolved_dtype(model: ModelConfig, serving: ServingParams) -> str:
    """The activation dtype vLLM resolves (`_resolve_auto_dtype`): --dtype when given; else the
    config's, with a float32 checkpoint downcast to the platform's first supported dtype, which is
    bfloat16 on every target kprecompile plans for (MI300 and later, sm80 and later)."""
    if serving.dtype == "float16" and model.model_type in FLOAT16_NOT_SUPPORTED:
        from ..errors import InputError

        raise InputError(
            "--dtype", "float16", f"bfloat16 for {model.name} (vLLM refuses float16 for {model.model_type})"
        )
    if serving.dtype != "auto":
        return serving.dtype
    if model.torch_dtype == "float16" and model.model_type not in FLOAT16_NOT_SUPPORTED:
        return "float16"
    return "bfloat16"


# Where checkpoints' quantization configs list the modules they leave in the model's dtype
# (FP8's `ignored_layers` and `modules_to_not_convert`, Quark's `exclude`, compressed-tensors' `ignore`).
_UNQUANTIZED_LISTS = ("ignored_layers", "modules_to_not_convert", "exclude", "ignore")


def kv_b_proj_dtype(model: ModelConfig, dtype: str) -> str:
    """The dtype of MLA's kv_b_proj weight as vLLM builds it, read from the config: the activation
    dtype where the checkpoint is unquantized or its quantization leaves kv_b_proj out, FP8's
    where it is an FP8 checkpoint, "" where another quantization packs it (vLLM's build knows)."""
    quantization = model.quantization
    if quantization is None:
        return "" if model.quantized else dtype
    for name in _UNQUANTIZED_LISTS:
        listed = quantization.get(name)
        if isinstance(listed, list) and any(isinstance(entry, str) and "kv_b_proj" in entry for entry in listed):
            return dtype
    return "float8_e4m3fn" if quantization.get("quant_method") == "fp8" else ""


def config_layers(model: ModelConfig, serving: ServingParams) -> tuple[AttentionLayer, ...]:
    """The distinct attention layers of `model` read from its config (see the module doc)."""
    dtype = resolved_dtype(model, serving)
    kv_cache_dtype = "fp8" if serving.kv_cache_is_fp8 else "auto"
    heads = serving.heads_per_rank(model)
    if model.mla is not None:
        layer = AttentionLayer(
            mla=True,
            num_heads=heads,
            num_kv_heads=1,
            head_size=model.mla.kv_lora_rank + model.mla.qk_rope_head_dim,
            sliding_window=0,
            logits_soft_cap=0.0,
            sinks="",
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            kv_b_proj_dtype=kv_b_proj_dtype(model, dtype),
            count=model.num_layers,
        )
        return (layer,)
    windows = model.layer_windows or (model.sliding_window,) * model.num_layers
    return distinct(
        [
            AttentionLayer(
                mla=False,
                num_heads=heads,
                num_kv_heads=serving.kv_heads_per_rank(model),
                head_size=model.head_dim,
                sliding_window=window or 0,
                logits_soft_cap=model.logits_soft_cap or 0.0,
                sinks=model.sinks,
                dtype=dtype,
                kv_cache_dtype=kv_cache_dtype,
            )
            for window in windows
        ]
    )
