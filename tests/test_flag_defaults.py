"""An unset vLLM flag means the planned release's own default, in the selection and in the key.

The table is read from each release's own `vllm/envs.py` (scripts/flag_defaults.py); the tests
inside each release (tests/in_vllm/test_release_flag_defaults.py) check it against the release.
"""

from __future__ import annotations

import pytest

from kprecompile.inputs.environment import fingerprint, registered_values
from kprecompile.inputs.flag_defaults import defaults_table, read_envs_defaults, release_defaults
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.shapes import FAMILIES
from kprecompile.vllm.releases import RELEASE_LINES, release_line

DEEPSEEK_R1 = load_model("deepseek-r1")
V2_LITE = load_model("deepseek-v2-lite")
AITER = {"VLLM_ROCM_USE_AITER": "1"}
FP8 = "VLLM_ROCM_USE_AITER_FP8BMM"
FP4 = "VLLM_ROCM_USE_AITER_FP4BMM"


def test_the_table_holds_a_release_of_every_line_each_flag_on_or_off():
    releases = defaults_table()
    for line in RELEASE_LINES:
        assert line.first_release in releases, line.name
    for release, flags in releases.items():
        assert flags and set(flags.values()) <= {"0", "1"}, release


@pytest.mark.parametrize("release, default", [("0.32.0", "1"), ("0.33.0", "0"), ("0.34.0", "0")])
def test_an_unset_flag_takes_the_releases_default(release, default):
    assert registered_values(AITER, "vllm-aiter", release)[FP8] == default
    # An explicit value is the user's, whatever the release.
    assert registered_values({**AITER, FP8: "1"}, "vllm-aiter", release)[FP8] == "1"


def test_unset_and_the_releases_explicit_default_share_a_key_and_the_other_value_does_not():
    unset = fingerprint(AITER, release="0.33.0").hash
    assert fingerprint({**AITER, FP8: "0"}, release="0.33.0").hash == unset
    assert fingerprint({**AITER, FP8: "1"}, release="0.33.0").hash != unset
    # Negative control: under 0.32 unset is on.
    assert fingerprint(AITER, release="0.32.0").hash == fingerprint({**AITER, FP8: "1"}, release="0.32.0").hash


def test_a_release_the_table_lacks_takes_the_newest_before_it():
    newest = max(defaults_table(), key=lambda release: tuple(map(int, release.split("."))))
    assert release_defaults("9.0.0") == defaults_table()[newest]
    assert release_defaults("0.33.5") == defaults_table()["0.33.0"]


def test_a_release_that_does_not_read_a_flag_leaves_kprecompiles_default():
    assert FP4 not in release_defaults("0.12.0")
    assert registered_values(AITER, "vllm-aiter", "0.12.0")[FP4] == "1"


def test_the_reader_runs_an_envs_file_alone_and_calls_each_reader_unset(tmp_path, monkeypatch):
    """Written as vLLM writes it: readers of os.environ in `environment_variables`."""
    envs = tmp_path / "envs.py"
    envs.write_text(
        "import os\n"
        "environment_variables = {\n"
        f"    '{FP8}': lambda: os.getenv('{FP8}', 'False').lower() in ('true', '1'),\n"
        "    'VLLM_MLA_DISABLE': lambda: bool(int(os.getenv('VLLM_MLA_DISABLE', '0'))),\n"
        "    'VLLM_ROCM_USE_AITER_MHA': lambda: (\n"
        "        os.getenv('VLLM_ROCM_USE_AITER_MHA', 'True').lower() in ('true', '1')\n"
        "    ),\n"
        "}\n"
    )
    monkeypatch.setenv(FP8, "1")  # set in this process: the default is still read unset
    defaults = read_envs_defaults(envs)
    assert defaults == {FP8: "0", "VLLM_MLA_DISABLE": "0", "VLLM_ROCM_USE_AITER_MHA": "1"}
    assert registered_values({}, "vllm")[FP8] == "1"  # the process's own value is left as it was


def _bmm(model, release, environ=AITER, dtype=None):
    selection = select(model, "vllm-aiter", None, environ, vllm_release=release, dtype=dtype)
    return {choice.family: choice for choice in selection.choices if choice.family in ("fp8_bmm", "fp4_bmm")}


def test_bf16_mla_weights_on_gfx950_take_aiters_fp4_bmm_where_the_release_runs_it():
    choices = _bmm(V2_LITE, "0.25.1")
    assert choices["fp4_bmm"].skip_reason is None
    assert choices["fp8_bmm"].skip_reason is None and choices["fp8_bmm"].skip_reason_on("gfx950")
    assert choices["fp8_bmm"].skip_reason_on("gfx942") is None


def test_0_15_and_0_16_run_the_fp4_bmm_on_every_gpu_and_gfx942_gets_nothing_to_compile():
    """Their `is_fp4bmm_enabled` asks no arch; AITER's wrapper then asserts MXFP4 on gfx942."""
    fp4, small = FAMILIES["fp4_bmm"], ServingParams(max_num_seqs=2)
    for release in ("0.15.1", "0.16.0"):
        choices = _bmm(V2_LITE, release)
        assert choices["fp4_bmm"].skip_reason is None and "every GPU" in choices["fp8_bmm"].skip_reason
        reason = fp4.skip_reason(V2_LITE, small, TARGETS["gfx942"], release_line(release))
        assert reason and "AITER has no MXFP4" in reason
    # The control: from 0.17, gfx942 runs the FP8 BMM.
    assert _bmm(V2_LITE, "0.17.1")["fp8_bmm"].skip_reason_on("gfx942") is None
    assert "gfx950" in fp4.skip_reason(V2_LITE, small, TARGETS["gfx942"], release_line("0.17.1"))


@pytest.mark.parametrize(
    "model, release, environ, dtype, why",
    [
        (DEEPSEEK_R1, "0.25.1", AITER, None, "a quantized checkpoint"),
        (V2_LITE, "0.25.1", AITER, "float16", "float16"),
        (V2_LITE, "0.12.0", AITER, None, "vLLM 0.12.0 has no FP4 BMM"),
        (V2_LITE, "0.33.0", AITER, None, "vLLM 0.33.0 defaults it to 0"),
        (V2_LITE, "0.25.1", {**AITER, FP4: "0"}, None, "defaults it to 1"),
        (V2_LITE, "0.25.1", {"VLLM_ROCM_USE_AITER": "0"}, None, "VLLM_ROCM_USE_AITER=1"),
    ],
)
def test_elsewhere_the_fp8_bmm_or_torch_runs_on_gfx950(model, release, environ, dtype, why):
    choices = _bmm(model, release, environ, dtype)
    assert why in choices["fp4_bmm"].skip_reason
    assert choices["fp8_bmm"].skip_reason_on("gfx950") is None


def test_without_vllm_a_checkpoint_that_leaves_kv_b_proj_unquantized_takes_the_fp4_bmm(tmp_path):
    """The config's reading of kv_b_proj (what vLLM's build says where it is installed,
    tests/in_vllm/test_release_cli.py): left out of an FP8 or Quark quantization, it is bf16; the
    controls, an FP8 checkpoint that quantizes it and an MXFP4 one that packs it, keep the FP8 BMM."""
    import json

    from kprecompile.inputs.layers import config_layers

    base = json.loads(V2_LITE.config_json)
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    quark = {"quant_method": "quark", "global_quant_config": {}}
    cases = {
        "fp8-kv-b-proj-left": ({**fp8, "ignored_layers": ["model.layers.0.self_attn.kv_b_proj"]}, "bfloat16"),
        "quark-kv-b-proj-excluded": ({**quark, "exclude": ["re:model.layers.*kv_b_proj", "lm_head"]}, "bfloat16"),
        "fp8-all": ({**fp8, "ignored_layers": ["lm_head"]}, "float8_e4m3fn"),
        "quark-all": ({**quark, "exclude": ["lm_head"]}, ""),
    }
    for name, (quantization, held) in cases.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({**base, "quantization_config": quantization}))
        model = load_model(str(tmp_path / f"{name}.json"))
        [layer] = config_layers(model, ServingParams())
        assert layer.kv_b_proj_dtype == held, name
        choices = _bmm(model, "0.25.1", {**AITER, FP8: "1"})
        if held == "bfloat16":
            assert choices["fp4_bmm"].skip_reason is None and choices["fp8_bmm"].skip_reason_on("gfx950"), name
        else:
            assert "a quantized checkpoint" in choices["fp4_bmm"].skip_reason, name
            assert choices["fp8_bmm"].skip_reason_on("gfx950") is None, name
