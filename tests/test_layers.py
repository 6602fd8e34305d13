"""The attention layers read from a config (no vLLM: `inputs/layers.py`), and the families planned
once per layer kind. tests/in_vllm/test_release_layers.py holds this reading equal to the layers
vLLM's own model classes build."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kprecompile.errors import InputError, ModelConfigError
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.shapes import FAMILIES
from kprecompile.vllm.releases import release_line

MODELS = Path(__file__).resolve().parent / "models"
GEMMA2, GEMMA3, GPT_OSS = (
    MODELS / name for name in ("gemma-2-2b-it.json", "gemma-3-1b-it.json", "gpt-oss-20b-bf16.json")
)
SERVING = ServingParams(max_model_len=2048, max_num_seqs=4)


def kinds(spec, serving: ServingParams = SERVING) -> set[tuple]:
    model = load_model(str(spec))
    return {(k.sliding_window, k.logits_soft_cap, k.sinks, k.dtype, k.count) for k in model.layer_kinds(serving)}


def test_per_layer_windows_soft_cap_sinks_and_dtype_are_read_from_the_config():
    # Gemma-2: even layers windowed (transformers' default layer_types), soft-cap 50, float32 served in bfloat16.
    assert kinds(GEMMA2) == {(4096, 50.0, "", "bfloat16", 13), (0, 50.0, "", "bfloat16", 13)}
    # Gemma-3: five windowed layers to one full.
    assert kinds(GEMMA3) == {(512, 0.0, "", "bfloat16", 22), (0, 0.0, "", "bfloat16", 4)}
    # gpt-oss: alternate windows, bfloat16 sinks on every layer.
    assert kinds(GPT_OSS) == {(128, 0.0, "bfloat16", "bfloat16", 12), (0, 0.0, "bfloat16", "bfloat16", 12)}
    # Uniform window, and none.
    assert kinds("mistral-7b-v0.1") == {(4096, 0.0, "", "bfloat16", 32)}
    assert kinds("llama-3.1-8b-instruct") == {(0, 0.0, "", "bfloat16", 32)}
    # --dtype wins where vLLM takes it; vLLM refuses float16 for Gemma-2, and so does kprecompile.
    assert kinds("mistral-7b-v0.1", replace(SERVING, dtype="float16")) == {(4096, 0.0, "", "float16", 32)}
    with pytest.raises(InputError, match="--dtype: got 'float16', expected bfloat16"):
        kinds(GEMMA2, replace(SERVING, dtype="float16"))


def test_explicit_layer_types_win_and_bad_ones_are_one_line(tmp_path):
    config = json.loads(GEMMA2.read_text())
    config["layer_types"] = ["full_attention"] * 25 + ["sliding_attention"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert kinds(path) == {(0, 50.0, "", "bfloat16", 25), (4096, 50.0, "", "bfloat16", 1)}
    config["layer_types"] = "sliding"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="layer_types"):
        load_model(str(path))


@pytest.mark.parametrize("family", ["triton_attn", "rocm_attn", "prefix_prefill", "paged_decode"])
def test_every_layer_kind_is_enumerated(family):
    """Each family's shapes cover both of Gemma-2's kinds with the soft-cap; negative control: the
    model read with one window for all layers (as before) has shapes of one window only."""
    model = load_model(str(GEMMA2))
    line = release_line("0.12.0")
    shapes = FAMILIES[family].enumerate_shapes(model, SERVING, line)
    assert {shape.sliding_window for shape in shapes} == {0, 4096}
    assert {shape.logits_soft_cap for shape in shapes} == {50.0}
    collapsed = FAMILIES[family].enumerate_shapes(replace(model, layer_windows=None), SERVING, line)
    assert {shape.sliding_window for shape in collapsed} == {4096}


def test_the_mirror_selects_with_the_layers_sinks():
    """vLLM 0.33's ROCm priority list skips ROCM_ATTN for layers with sinks (tests/in_vllm holds
    this equal to vLLM's own per-layer choice); a model without sinks keeps ROCM_ATTN."""
    from kprecompile.inputs.targets import resolve_target
    from kprecompile.selection.engines import select

    gfx942 = resolve_target("gfx942")

    def backend(spec, engine: str) -> str:
        return select(load_model(str(spec)), engine, None, environ={}, vllm_release="0.33.0", targets=[gfx942])

    assert backend(GPT_OSS, "vllm").attention_backend == "ROCM_AITER_UNIFIED_ATTN"
    assert backend(GPT_OSS, "vllm-aiter").attention_backend == "ROCM_AITER_FA"
    assert backend(GEMMA2, "vllm").attention_backend == "ROCM_ATTN"
