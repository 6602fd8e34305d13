import json
from importlib import resources

import pytest
from helpers import kprecompile_cli

from kprecompile.errors import InputError, ModelConfigError
from kprecompile.inputs.models import list_presets, load_model

PRESETS = resources.files("kprecompile.inputs.presets")

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

    config.write_bytes((resources.files("kprecompile.inputs.presets") / "deepseek-r1.json").read_bytes())

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


def _hugging_face_cache(hub, repo_id, config, revision="main", commit="0123456789abcdef0123456789abcdef01234567"):
    """A model's config.json laid out as huggingface_hub's downloads leave it."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(config))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return commit


@pytest.fixture
def plan_under():
    """`plan_under(env, *argv)`: `kprecompile plan ARGV --target gfx942 --json` with `env` set, in this
    process; huggingface_hub reads its cache variables when `constants` is imported, so that module
    is read again under `env`, as a fresh process would read it, and once more after the test."""
    import importlib

    from huggingface_hub import constants

    def plan(env, *argv):
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            importlib.reload(constants)
            return kprecompile_cli("plan", *argv, "--target", "gfx942", "--json")

    yield plan
    importlib.reload(constants)


@pytest.mark.parametrize("variable", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_hugging_face_id_is_read_offline_from_the_local_hugging_face_cache(tmp_path, variable, plan_under):
    config = json.loads(PRESETS.joinpath("deepseek-v2-lite.json").read_text())
    hub = tmp_path / "hub"
    _hugging_face_cache(hub, "deepseek-ai/DeepSeek-V2-Lite", config)
    commit = _hugging_face_cache(
        hub, "deepseek-ai/DeepSeek-V2-Lite", {**config, "num_attention_heads": 8}, revision="smaller", commit="f" * 40
    )
    env = {variable: str(hub if variable == "HF_HUB_CACHE" else tmp_path), "HF_HUB_OFFLINE": "1"}
    by_id = plan_under(env, "--model", "deepseek-ai/DeepSeek-V2-Lite", "--family", "fp8_bmm", "--max-num-seqs", "4")
    by_preset = plan_under(env, "--model", "DeepSeek-V2-Lite", "--family", "fp8_bmm", "--max-num-seqs", "4")
    assert by_id.returncode == 0, by_id.stderr
    assert json.loads(by_id.stdout)["families"] == json.loads(by_preset.stdout)["families"]
    assert json.loads(by_id.stdout)["model"] == "deepseek-ai/DeepSeek-V2-Lite"
    for revision in ("smaller", commit):
        other = plan_under(
            env,
            "--model",
            "deepseek-ai/DeepSeek-V2-Lite",
            "--revision",
            revision,
            "--family",
            "fp8_bmm",
            "--max-num-seqs",
            "4",
        )
        assert json.loads(other.stdout)["families"][0]["parameters"]["heads_per_rank"] == 8


def test_a_hugging_face_id_not_in_the_cache_names_the_command_that_fetches_it(tmp_path, plan_under):
    result = plan_under({"HF_HUB_CACHE": str(tmp_path)}, "--model", "Qwen/Qwen3-8B")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "kprecompile: --model: got 'Qwen/Qwen3-8B', expected a model whose config.json is in the local Hugging Face "
        f"cache ({tmp_path}); fetch it with `hf download Qwen/Qwen3-8B config.json`\n"
    )


def test_home_relative_paths_and_preset_names_in_any_case(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(PRESETS.joinpath("qwen3-8b.json").read_text())
    assert load_model("~/m").digest == load_model("Qwen3-8B").digest == load_model("qwen3-8b").digest


def test_a_multimodal_config_is_read_through_its_text_config(tmp_path):
    """transformers' get_text_config(): the language model's fields under text_config."""
    text = json.loads(PRESETS.joinpath("llama-3.1-8b-instruct.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "architectures": ["LlavaForConditionalGeneration"],
                "text_config": text,
                "vision_config": {"hidden_size": 1024},
            }
        )
    )
    model = load_model(str(path))
    assert (model.num_attention_heads, model.num_key_value_heads, model.head_dim) == (32, 8, 128)
    assert model.architectures == ("LlavaForConditionalGeneration",)


def test_a_gguf_file_is_refused_in_one_line(tmp_path):
    gguf = tmp_path / "model.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    with pytest.raises(InputError, match="GGUF files are not supported"):
        load_model(str(gguf))
