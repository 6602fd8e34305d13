import json

import pytest

from kprecompile.errors import InputError, ModelConfigError
from kprecompile.models import list_presets, load_model

SHARED_PRESETS = {
    "deepseek-r1",
    "deepseek-v2-lite",
    "llama-3.1-8b-instruct",
    "llama-3.1-70b-instruct",
    "mistral-7b-v0.1",
    "qwen3-8b",
}


def test_every_shared_model_config_ships_as_a_preset():
    assert SHARED_PRESETS <= set(list_presets())


def test_preset_path_and_directory_load_the_same_config(tmp_path):
    preset = load_model("deepseek-r1")
    directory = tmp_path / "DeepSeek-R1"
    directory.mkdir()
    config = directory / "config.json"
    from importlib import resources

    config.write_bytes((resources.files("kprecompile.presets") / "deepseek-r1.json").read_bytes())

    for spec in (str(config), str(directory)):
        loaded = load_model(spec)
        assert loaded.digest == preset.digest
        assert loaded.mla == preset.mla
        assert loaded.source == str(config)


def test_mla_fields_are_read_and_absent_for_gqa_models():
    deepseek = load_model("deepseek-r1")
    assert (deepseek.num_attention_heads, deepseek.mla.kv_lora_rank, deepseek.mla.qk_nope_head_dim) == (128, 512, 128)
    assert (deepseek.mla.qk_rope_head_dim, deepseek.mla.v_head_dim) == (64, 128)
    assert load_model("llama-3.1-8b-instruct").mla is None


def _write(tmp_path, content) -> str:
    path = tmp_path / "config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


MLA = {
    "num_attention_heads": 16,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", r"config.json in .*: got '<9 bytes>', expected valid JSON"),
        ("[1, 2]", r"config.json in .*: got 'list', expected a JSON object"),
        ({**MLA, "num_attention_heads": 0}, r"num_attention_heads in .*: got 0, expected a positive integer"),
        ({**MLA, "num_attention_heads": "16"}, r"num_attention_heads in .*: got '16', expected a positive integer"),
        ({**MLA, "qk_nope_head_dim": 12.5}, r"qk_nope_head_dim in .*: got 12.5, expected a positive integer"),
        ({**MLA, "v_head_dim": True}, r"v_head_dim in .*: got True, expected a positive integer"),
        (
            {k: v for k, v in MLA.items() if k != "qk_rope_head_dim"},
            r"qk_rope_head_dim in .*: got None, expected the field to be present",
        ),
        (
            {**MLA, "torch_dtype": "float64"},
            r"torch_dtype in .*: got 'float64', expected one of bfloat16, float16, float32",
        ),
    ],
)
def test_malformed_configs_name_the_field_the_value_and_the_expectation(tmp_path, content, message):
    with pytest.raises(ModelConfigError, match=message):
        load_model(_write(tmp_path, content))


def test_unknown_model_lists_the_presets():
    with pytest.raises(InputError, match=r"--model: got 'no-such-model', expected a preset name \(deepseek-r1, "):
        load_model("no-such-model")


def test_directory_without_config(tmp_path):
    with pytest.raises(InputError, match=r"expected a directory holding config.json; it has none"):
        load_model(str(tmp_path))
