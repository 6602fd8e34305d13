"""Key sensitivity: every part that decides a configuration's kernels moves its manifest key, and
spelling the same configuration differently does not. No compiles."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources

import pytest

from kprecompile.cache.keys import hash_named_dict
from kprecompile.cache.layout import CacheLayout
from kprecompile.cache.manifest import manifest_key
from kprecompile.inputs.models import model_from_dict
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.inputs.toolchain import Toolchain
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.vllm.releases import serving_capture_sizes
from kprecompile.warmup.manifest_key import configuration_parts

TOOLCHAIN = Toolchain("3.6.0", "a" * 64, "/opt/triton", "cpython-311", "2.13.0", "0.1.7", None)


def preset(name: str) -> dict:
    return json.loads((resources.files("kprecompile.inputs.presets") / f"{name}.json").read_text())


def key(
    raw: dict,
    serving: ServingParams | None = None,
    target: str = "gfx942",
    toolchain=TOOLCHAIN,
    release: str | None = None,
) -> str:
    model = model_from_dict(raw, name="model", source="test")
    serving = serving or ServingParams()
    selection = select(model, environ={}, vllm_release=release)
    parts = configuration_parts(
        Request(model, serving, selection),
        TARGETS[target],
        CacheLayout.of("/unused"),
        remember=False,
        toolchain=toolchain,
    )
    return manifest_key(parts)


DEEPSEEK = preset("deepseek-v2-lite")
MISTRAL = preset("mistral-7b-v0.1")


# One other value for every serving parameter.
SERVING_CHANGES = {
    "tensor_parallel_size": 2,
    "max_num_seqs": 512,
    "max_num_batched_tokens": 4096,
    "max_model_len": 4096,
    "block_size": 32,
    "kv_cache_dtype": "fp8",
    "dtype": "float16",
    "cudagraph_capture_sizes": (1, 2, 4),
    "enforce_eager": True,
    "num_speculative_tokens": 1,
}


# Serving parameters that decide no kernel, with another value: the key stays.
SERVING_OUTSIDE_THE_KEY = {"trust_remote_code": True}


def test_the_table_covers_every_serving_parameter():
    fields = {field.name for field in dataclasses.fields(ServingParams)}
    assert set(SERVING_CHANGES) | set(SERVING_OUTSIDE_THE_KEY) == fields


@pytest.mark.parametrize("field, value", SERVING_OUTSIDE_THE_KEY.items())
def test_a_serving_parameter_that_decides_no_kernel_keeps_the_key(field, value):
    assert key(DEEPSEEK, ServingParams(**{field: value})) == key(DEEPSEEK)


@pytest.mark.parametrize("field, value", SERVING_CHANGES.items())
def test_every_serving_parameter_moves_the_key(field, value):
    assert key(DEEPSEEK, ServingParams(**{field: value})) != key(DEEPSEEK)


@pytest.mark.parametrize(
    "same",
    [
        ServingParams(kv_cache_dtype="fp8_e4m3"),
        ServingParams(max_model_len=DEEPSEEK["max_position_embeddings"]),
        ServingParams(dtype="bfloat16"),
        ServingParams(cudagraph_capture_sizes=serving_capture_sizes(ServingParams())),
    ],
)
def test_the_same_settings_spelled_otherwise_keep_the_key(same):
    base = ServingParams(kv_cache_dtype="fp8") if same.kv_cache_dtype != "auto" else ServingParams()
    assert key(DEEPSEEK, same) == key(DEEPSEEK, base)


@pytest.mark.parametrize(
    "raw, field, value",
    [
        (DEEPSEEK, "num_attention_heads", 32),
        (DEEPSEEK, "kv_lora_rank", 256),
        (DEEPSEEK, "qk_nope_head_dim", 64),
        (DEEPSEEK, "qk_rope_head_dim", 32),
        (DEEPSEEK, "v_head_dim", 64),
        (DEEPSEEK, "max_position_embeddings", 65536),
        (DEEPSEEK, "torch_dtype", "float16"),
        (DEEPSEEK, "architectures", ["OtherForCausalLM"]),
        (MISTRAL, "num_key_value_heads", 4),
        (MISTRAL, "hidden_size", 2048),
        (MISTRAL, "head_dim", 64),
        (MISTRAL, "sliding_window", 2048),
        (MISTRAL, "use_sliding_window", False),
    ],
)
def test_every_model_field_read_moves_the_key(raw, field, value):
    assert key({**raw, field: value}) != key(raw)


@pytest.mark.parametrize("raw", [DEEPSEEK, MISTRAL])
def test_fields_not_read_and_formatting_keep_the_key(raw):
    assert key({**raw, "vocab_size": 7, "rope_theta": 1.5}) == key(raw)
    assert key(json.loads(json.dumps(raw, indent=4))) == key(raw)
    # Newer configs say dtype where older ones say torch_dtype: see the vLLM integration.


@pytest.mark.parametrize("field", [field.name for field in dataclasses.fields(Toolchain)])
def test_every_toolchain_field_moves_the_key(field):
    changed = dataclasses.replace(TOOLCHAIN, **{field: "other"})
    assert key(DEEPSEEK, toolchain=changed) != key(DEEPSEEK)


def test_the_target_moves_the_key():
    assert key(DEEPSEEK, target="gfx950") != key(DEEPSEEK, target="gfx942")


def test_a_key_is_the_hash_of_its_named_parts_in_any_order():
    parts = {"b": 1, "a": [1, 2]}
    assert hash_named_dict(parts) == hash_named_dict(dict(reversed(parts.items())))
    assert hash_named_dict(parts) != hash_named_dict({**parts, "c": None})


def test_the_vllm_release_moves_the_key():
    """Even where it selects the same kernels: its capture sizes and rules may differ."""
    assert key(DEEPSEEK, release="0.11.2") != key(DEEPSEEK, release="0.12.0") != key(DEEPSEEK, release="0.33.0")
    assert key(DEEPSEEK, release="0.12.0") == key(DEEPSEEK)  # the default without vLLM installed
