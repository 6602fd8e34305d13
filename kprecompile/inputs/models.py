"""Model configs: shipped presets, `config.json` files, and the typed fields read from them.

Only the fields that decide kernel shapes are read, each checked on the way in, so that a
malformed config fails here with the field's name instead of deep inside a kernel wrapper.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cache.keys import hash_named_dict
from ..errors import InputError, ModelConfigError
from .layers import FLOAT16_NOT_SUPPORTED, AttentionLayer, config_layers

if TYPE_CHECKING:
    from .serving import ServingParams

CONFIG_FILENAME = "config.json"
_PRESETS_PACKAGE = "kprecompile.inputs.presets"


@dataclass(frozen=True)
class MlaDims:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3/R1 and alike)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelConfig:
    name: str
    source: str
    # sha256 of the fields below as read: a config edit that changes a kernel changes the
    # manifest key; formatting, unrelated fields, and the way the config reached kprecompile
    # (a file, a preset, an engine's parsed config) do not.
    digest: str
    architectures: tuple[str, ...]
    num_attention_heads: int
    # KV heads (GQA); equal to num_attention_heads for MHA; unused by MLA.
    num_key_value_heads: int
    # Per-head size of q/k/v for MHA/GQA: the config's head_dim or hidden_size / heads.
    head_dim: int
    # The longest context the model supports; None when the config does not say.
    max_position_embeddings: int | None
    # Tokens each query attends back to when the model uses sliding-window attention.
    sliding_window: int | None
    torch_dtype: str
    mla: MlaDims | None
    # (block_n, block_k) of a block-FP8 checkpoint (quantization_config: fp8 with weight_block_size).
    fp8_block_size: tuple[int, int] | None = None
    # The config as read, for engine code that builds its own configuration from it (vLLM's
    # VllmConfig, for the families traced through vLLM's backends); not part of the digest.
    config_json: str = field(default="{}", compare=False, repr=False)
    # The directory the config was read from, where a model's own code (`auto_map`) lives for
    # vLLM's --trust-remote-code; None for a preset.
    directory: str | None = field(default=None, compare=False, repr=False)
    # transformers' name for the architecture family (`gemma2`); decides vLLM's dtype rule.
    model_type: str = ""
    num_layers: int = 1
    # Each layer's sliding window (None: full attention) where layers differ, else None: every
    # layer takes `sliding_window`.
    layer_windows: tuple[int | None, ...] | None = None
    # tanh soft-cap of the attention logits (Gemma-2's attn_logit_softcapping).
    logits_soft_cap: float | None = None
    # dtype of the per-head attention sinks (gpt-oss), "" without.
    sinks: str = ""
    # The attention layers as the engine built them for the request's serving parameters and
    # targets (`vllm/model_layers.py`), and who built them; empty: read from the config.
    attention_layers: tuple[AttentionLayer, ...] = ()
    layers_source: str = "kprecompile's reading of config.json"

    @property
    def quantization(self) -> dict[str, Any] | None:
        """The checkpoint's `quantization_config`, where it is one."""
        config = json.loads(self.config_json or "{}").get("quantization_config")
        return config if isinstance(config, dict) else None

    @property
    def quantized(self) -> bool:
        """Whether the checkpoint is quantized (a `quantization_config`): its linear weights,
        MLA's kv_b_proj among them, are not held in the model's dtype."""
        return self.fp8_block_size is not None or "quantization_config" in json.loads(self.config_json)

    def layer_kinds(self, serving: ServingParams) -> tuple[AttentionLayer, ...]:
        """The distinct attention layers the kernels see: the engine's, else the config's."""
        return self.attention_layers or config_layers(self, serving)

    @property
    def attention(self) -> str:
        """`mla` (latent KV cache) or `gqa` (per-head K and V caches; MHA is GQA with ratio 1)."""
        return "mla" if self.mla is not None else "gqa"

    @property
    def queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads


SUPPORTED_ATTENTION = (
    "multi-head latent attention (kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) or "
    "multi-head / grouped-query attention (num_attention_heads, num_key_value_heads, head_dim or hidden_size)"
)


def list_presets() -> list[str]:
    files = resources.files(_PRESETS_PACKAGE).iterdir()
    return sorted(f.name.removesuffix(".json") for f in files if f.name.endswith(".json"))


def _expected_model() -> str:
    return (
        "a preset name (" + ", ".join(list_presets()) + "), a path to a config.json or a directory holding "
        "one, or a Hugging Face model id in the local Hugging Face cache"
    )


# A Hugging Face repo id: `org/name` (letters, digits, `-`, `_`, `.`).
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")
_GGUF_MAGIC = b"GGUF"


def _locate(spec: str, revision: str | None = None) -> tuple[str, bytes, str, str | None]:
    """Return (display name, file bytes, source, directory) for a path, a preset name (any case) or
    a Hugging Face model id resolved offline from the local Hugging Face cache."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / CONFIG_FILENAME
        if not path.is_file():
            raise InputError("--model", spec, f"a directory holding {CONFIG_FILENAME}; it has none")
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as error:
            raise InputError("--model", spec, f"a readable file ({error.strerror})") from None
        if path.suffix.lower() == ".gguf" or data[:4] == _GGUF_MAGIC:
            raise InputError(
                "--model",
                spec,
                "a config.json: GGUF files are not supported (give the original "
                "model's config.json or its Hugging Face id)",
            )
        return spec, data, str(path), str(path.resolve().parent)
    presets = {name.lower(): name for name in list_presets()}
    if spec.lower() in presets:
        preset = presets[spec.lower()]
        data = (resources.files(_PRESETS_PACKAGE) / f"{preset}.json").read_bytes()
        return preset, data, f"preset {preset}", None
    if _REPO_ID.fullmatch(spec):
        return _from_hugging_face_cache(spec, revision)
    raise InputError("--model", spec, _expected_model())


def _from_hugging_face_cache(repo_id: str, revision: str | None) -> tuple[str, bytes, str, str | None]:
    """The model's config.json from the local Hugging Face cache ($HF_HUB_CACHE, $HF_HOME), offline."""
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        raise InputError(
            "--model",
            repo_id,
            "a preset or a path (pip install huggingface_hub to name models by their Hugging Face id)",
        ) from None
    found = try_to_load_from_cache(repo_id, CONFIG_FILENAME, revision=revision)
    if not isinstance(found, str):
        at = f" at revision {revision}" if revision else ""
        fetch = f"hf download {repo_id} {CONFIG_FILENAME}" + (f" --revision {revision}" if revision else "")
        raise InputError(
            "--model",
            repo_id,
            f"a model whose {CONFIG_FILENAME}{at} is in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); fetch it with `{fetch}`",
        )
    name = repo_id if not revision else f"{repo_id}@{revision}"
    return name, Path(found).read_bytes(), f"huggingface {name} ({found})", str(Path(found).parent)


def load_model(spec: str, revision: str | None = None) -> ModelConfig:
    """Read a model config from a preset name, a config.json path or a directory holding one, or
    a Hugging Face model id (`revision`: a branch, tag or commit) in the local Hugging Face cache."""
    name, data, source, directory = _locate(spec, revision)
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        # ValueError: also Python's limit on integer digits; RecursionError: nesting too deep.
        if isinstance(error, RecursionError):
            reason = "nested too deeply"
        elif isinstance(error, (json.JSONDecodeError, UnicodeDecodeError)):
            reason = str(error)
        else:
            reason = "a number too long to read"
        raise ModelConfigError(CONFIG_FILENAME, f"<{len(data)} bytes>", f"valid JSON ({reason})", source) from None
    if not isinstance(raw, dict):
        raise ModelConfigError(CONFIG_FILENAME, type(raw).__name__, "a JSON object", source)
    return model_from_dict(raw, name=name, source=source, directory=directory)


def model_from_dict(raw: dict[str, Any], *, name: str, source: str, directory: str | None = None) -> ModelConfig:
    """A model from a config.json's fields (or an engine's parsed config as a dict); `directory`
    holds its own code, if any."""
    if "num_attention_heads" not in raw and isinstance(raw.get("text_config"), dict):
        # A multimodal model: its language model's config, as transformers' get_text_config()
        # reads it (what the engine's attention kernels see).
        outer = {name: raw[name] for name in ("architectures", "quantization_config") if name in raw}
        raw = {**raw["text_config"], **outer}
    fields = FieldReader(raw, source)
    if "num_attention_heads" not in raw:
        architectures = ", ".join(fields.string_list("architectures")) or "this model"
        raise ModelConfigError(
            "num_attention_heads",
            None,
            f"an attention layout kprecompile derives for {architectures}: {SUPPORTED_ATTENTION}",
            source,
        )
    heads = fields.positive_int("num_attention_heads")
    mla = None
    if raw.get("kv_lora_rank") is not None:
        mla = MlaDims(
            kv_lora_rank=fields.positive_int("kv_lora_rank"),
            qk_nope_head_dim=fields.positive_int("qk_nope_head_dim"),
            qk_rope_head_dim=fields.positive_int("qk_rope_head_dim"),
            v_head_dim=fields.positive_int("v_head_dim"),
        )
    kv_heads = fields.positive_int("num_key_value_heads", default=heads)
    if mla is None:
        if kv_heads > heads or heads % kv_heads:
            raise ModelConfigError(
                "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads = {heads}", source
            )
        head_dim = fields.positive_int("head_dim", default=None)
        if head_dim is None:
            hidden = fields.positive_int("hidden_size")
            if hidden % heads:
                raise ModelConfigError("hidden_size", hidden, f"a multiple of num_attention_heads = {heads}", source)
            head_dim = hidden // heads
    else:
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    num_layers = fields.positive_int("num_hidden_layers", default=1)
    read = dict(
        architectures=fields.string_list("architectures"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=fields.positive_int("max_position_embeddings", default=None),
        sliding_window=_sliding_window(fields, raw),
        torch_dtype=_model_dtype(fields, raw),
        mla=mla,
    )
    parts = {**read, "mla": mla and asdict(mla)}
    model_type = raw.get("model_type") if isinstance(raw.get("model_type"), str) else ""
    layer_features: dict[str, Any] = {}
    if mla is None:
        layer_features = _layer_features(fields, raw, model_type, num_layers, read["sliding_window"])
    fp8_block_size = _fp8_block_size(raw, source)
    # Only where present, so that the digests of other models stay as they were.
    if fp8_block_size is not None:
        parts["fp8_block_size"] = list(fp8_block_size)
    parts.update({name: value for name, value in layer_features.items() if value})
    if model_type in FLOAT16_NOT_SUPPORTED and read["torch_dtype"] == "float16":
        parts["model_type"] = model_type
    config_json = json.dumps(raw, sort_keys=True)
    return ModelConfig(
        name=name,
        source=source,
        digest=hash_named_dict(parts),
        config_json=config_json,
        fp8_block_size=fp8_block_size,
        directory=directory,
        model_type=model_type,
        num_layers=num_layers,
        **layer_features,
        **read,
    )


def _layer_features(
    fields: FieldReader, raw: dict[str, Any], model_type: str, num_layers: int, window: int | None
) -> dict[str, Any]:
    """Per-layer windows, soft-cap and sinks as vLLM's model classes build them from the config
    (and transformers fills the config's `layer_types` where it is absent)."""
    types = raw.get("layer_types")
    if types is not None:
        if not (isinstance(types, list) and types and all(isinstance(kind, str) for kind in types)):
            raise ModelConfigError("layer_types", types, "a list of layer type names", fields.source)
        if len(types) > 1 << 16:
            raise ModelConfigError("layer_types", f"{len(types)} entries", "at most 65,536", fields.source)
    elif model_type == "gemma2":
        types = ["sliding_attention" if (index + 1) % 2 else "full_attention" for index in range(num_layers)]
    elif model_type in ("gemma3", "gemma3_text"):
        pattern = fields.positive_int("sliding_window_pattern", default=6)
        types = ["sliding_attention" if (index + 1) % pattern else "full_attention" for index in range(num_layers)]
    if model_type == "gpt_oss":
        # vLLM's gpt-oss windows the even layers, whatever the config's layer_types say.
        types = ["sliding_attention" if index % 2 == 0 else "full_attention" for index in range(num_layers)]
    windows = None
    if types is not None and window is not None and model_type not in _MODEL_LEVEL_WINDOW:
        windows = tuple(window if kind == "sliding_attention" else None for kind in types)
        if len(set(windows)) == 1:
            windows = None
    soft_cap = raw.get("attn_logit_softcapping")
    if soft_cap is not None and (isinstance(soft_cap, bool) or not isinstance(soft_cap, (int, float)) or soft_cap <= 0):
        raise ModelConfigError("attn_logit_softcapping", soft_cap, "a positive number or null", fields.source)
    return {
        "layer_windows": windows,
        "logits_soft_cap": float(soft_cap) if soft_cap else None,
        # vLLM's gpt-oss holds its sinks in bfloat16 whatever the model's dtype.
        "sinks": "bfloat16" if model_type == "gpt_oss" else "",
    }


# Architectures whose vLLM model class applies the config's one window to every layer (Qwen2's
# requires max_window_layers to cover all layers when layer types differ).
_MODEL_LEVEL_WINDOW = ("qwen2", "qwen2_moe")


def _fp8_block_size(raw: dict[str, Any], source: str) -> tuple[int, int] | None:
    """(block_n, block_k) of a block-FP8 checkpoint, as vLLM's Fp8Config reads quantization_config."""
    quantization = raw.get("quantization_config")
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "fp8":
        return None
    block = quantization.get("weight_block_size")
    if block is None:
        return None
    if not (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(size, int) and not isinstance(size, bool) and 0 < size <= 4096 for size in block)
    ):
        raise ModelConfigError("quantization_config.weight_block_size", block, "two positive integers", source)
    return block[0], block[1]


def _model_dtype(fields: FieldReader, raw: dict[str, Any]) -> str:
    """The weights' dtype as transformers reads it: `dtype` (transformers >= 4.56 writes it), else
    the older `torch_dtype`; an engine's parsed config may say `torch.bfloat16`."""
    field = "dtype" if raw.get("dtype") is not None else "torch_dtype"
    if isinstance(raw.get(field), str):
        raw = {**raw, field: raw[field].removeprefix("torch.")}
    return FieldReader(raw, fields.source).choice(field, ("bfloat16", "float16", "float32"), default="bfloat16")


def _sliding_window(fields: FieldReader, raw: dict[str, Any]) -> int | None:
    """Mistral sets sliding_window; Qwen2/3 also carry one but apply it only with use_sliding_window."""
    if raw.get("use_sliding_window") is False:
        return None
    return fields.positive_int("sliding_window", default=None)


# Config integers beyond any real model (a plan's size grows with heads and dimensions); others
# must fit the int32 Triton and torch index with.
_INT_LIMIT = (1 << 31) - 1
_FIELD_LIMITS = {
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 4096,
    "kv_lora_rank": 65536,
    "qk_nope_head_dim": 4096,
    "qk_rope_head_dim": 4096,
    "v_head_dim": 4096,
    "hidden_size": 1 << 20,
}


class FieldReader:
    """Typed reads of config fields, each failing with the field, the value and what was expected."""

    _MISSING = object()

    def __init__(self, raw: dict[str, Any], source: str):
        self.raw = raw
        self.source = source

    def _get(self, field: str, default: object = _MISSING) -> object:
        if field not in self.raw or self.raw[field] is None:
            if default is self._MISSING:
                raise ModelConfigError(field, None, "the field to be present", self.source)
            return default
        return self.raw[field]

    def positive_int(self, field: str, default: object = _MISSING) -> Any:
        value = self._get(field, default)
        if value is default and default is not self._MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelConfigError(field, value, "a positive integer", self.source)
        limit = _FIELD_LIMITS.get(field, _INT_LIMIT)
        if value > limit:
            raise ModelConfigError(field, value, f"at most {limit:,}", self.source)
        return value

    def choice(self, field: str, choices: tuple[str, ...], default: str) -> str:
        value = self._get(field, default)
        if value not in choices:
            raise ModelConfigError(field, value, "one of " + ", ".join(choices), self.source)
        return value

    def string_list(self, field: str) -> tuple[str, ...]:
        value = self._get(field, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ModelConfigError(field, value, "a list of strings", self.source)
        return tuple(value)
