import pytest

from kprecompile.errors import InputError
from kprecompile.inputs.models import load_model, model_from_dict
from kprecompile.inputs.serving import ServingParams
from kprecompile.shapes import FAMILIES, FAMILY_NAMES
from kprecompile.shapes.fp8_bmm import enumerate_fp8_bmm
from kprecompile.vllm.releases import DEFAULT_RELEASE, release_line, serving_capture_sizes

# The release line the families are planned for (the default release's).
LINE = release_line(DEFAULT_RELEASE)


def test_deepseek_r1_tp8_sweeps_both_products_over_every_m():
    model = load_model("deepseek-r1")
    shapes = enumerate_fp8_bmm(model, ServingParams(tensor_parallel_size=8), None)
    assert len(shapes) == 2 * 1024
    mla = model.mla
    by_product = {}
    for shape in shapes:
        by_product.setdefault(shape.product, []).append(shape)
    assert sorted(shape.m for shape in by_product["q_nope_w_uk"]) == list(range(1, 1025))
    assert {(s.heads, s.k, s.n) for s in by_product["q_nope_w_uk"]} == {
        (128 // 8, mla.qk_nope_head_dim, mla.kv_lora_rank)
    }
    assert {(s.heads, s.k, s.n) for s in by_product["attn_out_w_uv"]} == {(128 // 8, mla.kv_lora_rank, mla.v_head_dim)}
    assert {s.group_size for s in shapes} == {128}


def test_families_follow_the_attention_structure_not_the_model_name():
    def families(model):
        serving = ServingParams(max_num_seqs=4)
        return [name for name, family in FAMILIES.items() if family.enumerate_shapes(model, serving, LINE)]

    llama = ["aiter_fa_context", "prefix_prefill", "paged_decode", "pa_prefill", "rocm_attn", "triton_attn"]
    assert families(load_model("llama-3.1-8b-instruct")) == llama
    # DeepSeek-R1's weights are block FP8: its linear layers are a family of their own.
    mla = ["block_fp8_linear", "fp4_bmm", "fp8_bmm", "mla_decode", "mla_merge", "mla_prefill", "triton_mla"]
    assert families(load_model("deepseek-r1")) == mla
    assert "block_fp8_linear" not in families(load_model("deepseek-v2-lite"))
    # An unseen model with MLA fields is planned as MLA, whatever its name and architecture.
    unseen = model_from_dict(
        {
            "architectures": ["SomethingNewForCausalLM"],
            "num_attention_heads": 16,
            "kv_lora_rank": 256,
            "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32,
            "v_head_dim": 64,
            "max_position_embeddings": 4096,
        },
        name="unseen",
        source="test",
    )
    assert families(unseen) == ["fp4_bmm", "fp8_bmm", "mla_decode", "mla_merge", "mla_prefill", "triton_mla"]


def test_sliding_window_reaches_the_shapes_only_where_the_config_applies_it():
    def windows(model):
        shapes = FAMILIES["paged_decode"].enumerate_shapes(model, ServingParams(max_num_seqs=2), LINE)
        return {shape.sliding_window for shape in shapes}

    assert windows(load_model("mistral-7b-v0.1")) == {4096}
    assert windows(load_model("qwen3-8b")) == {0}
    assert windows(load_model("llama-3.1-8b-instruct")) == {0}


def test_capture_sizes_and_decode_sizes_follow_vllm():
    default = ServingParams()
    assert serving_capture_sizes(default)[:4] == (1, 2, 4, 8) and serving_capture_sizes(default)[-1] == 512
    assert default.decode_batch_sizes() == tuple(range(1, 1025))
    assert serving_capture_sizes(ServingParams(enforce_eager=True, max_num_seqs=7)) == ()
    assert serving_capture_sizes(ServingParams(max_num_seqs=4)) == (1, 2, 4, 8)
    assert ServingParams(max_num_seqs=4).decode_token_counts() == (1, 2, 3, 4)
    mtp = ServingParams(max_num_seqs=4, num_speculative_tokens=1)
    assert mtp.decode_token_counts() == tuple(range(1, 9)) and mtp.decode_batch_sizes() == (1, 2, 3, 4)
    assert ServingParams(cudagraph_capture_sizes=(4, 1, 4)).cudagraph_capture_sizes == (1, 4)


@pytest.mark.parametrize("tp", [3, 32])
def test_heads_not_divisible_by_tp_is_an_input_error(tp):
    model = load_model("deepseek-v2-lite")  # 16 heads
    with pytest.raises(
        InputError, match=rf"--tp: got {tp}, expected a divisor of num_attention_heads = 16 of deepseek-v2-lite"
    ):
        enumerate_fp8_bmm(model, ServingParams(tensor_parallel_size=tp), None)


@pytest.mark.parametrize(
    "field, kwargs", [("--tp", {"tensor_parallel_size": 0}), ("--max-num-seqs", {"max_num_seqs": -1})]
)
def test_serving_params_must_be_positive(field, kwargs):
    with pytest.raises(InputError, match=f"{field}: got -?[0-9]+, expected a positive integer"):
        ServingParams(**kwargs)


def test_the_registry_has_one_module_per_family_name():
    """Every name of the FamilyName literal has a family object whose module is named after it."""
    assert tuple(FAMILIES) == FAMILY_NAMES
    for name, family in FAMILIES.items():
        assert family.name == name
        assert family.enumerate_shapes.__module__ == f"kprecompile.shapes.{name}"


def test_block_fp8_linear_plans_kv_b_proj_only_where_some_layer_holds_it_in_fp8(tmp_path):
    """DeepSeek-R1's FP8 checkpoint left unchanged plans kv_b_proj's GEMM; one whose quantization
    leaves kv_b_proj out of every layer as vLLM's FP8 config reads it (`ignored_layers`, else
    `modules_to_not_convert`, by exact module name) plans none for it, and the other layers stay.
    Controls: left out of layer 0 alone, or named in a way vLLM's FP8 config does not match (a bare
    name, a pattern), it stays; where vLLM's build of the layers says bf16 it goes, FP8 it stays."""
    import dataclasses
    import json

    from kprecompile.inputs.layers import config_layers
    from kprecompile.shapes.block_fp8_linear import enumerate_block_fp8_linear

    base = json.loads(load_model("deepseek-r1").config_json)
    quantization = base["quantization_config"]
    every = [f"model.layers.{index}.self_attn.kv_b_proj" for index in range(base["num_hidden_layers"])]
    serving = ServingParams(tensor_parallel_size=8, max_num_seqs=64, max_num_batched_tokens=256)

    def layers(left_out: dict | None = None, built: str | None = None) -> set[str]:
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**base, "quantization_config": {**quantization, **(left_out or {})}}))
        model = load_model(str(path))
        if built is not None:
            [layer] = config_layers(model, serving)
            model = dataclasses.replace(model, attention_layers=(dataclasses.replace(layer, kv_b_proj_dtype=built),))
        return {shape.layer for shape in enumerate_block_fp8_linear(model, serving, LINE)}

    planned = layers()
    assert "kv_b_proj" in planned and len(planned) > 1
    for left_out in ({"ignored_layers": every}, {"modules_to_not_convert": [*every, "lm_head"]}):
        assert layers(left_out) == planned - {"kv_b_proj"}, left_out
    for kept in (
        {"ignored_layers": every[:1]},
        {"ignored_layers": ["lm_head"], "modules_to_not_convert": every},
        {"ignored_layers": ["kv_b_proj"]},
        {"ignored_layers": ["re:model\\.layers\\.\\d+\\.self_attn\\.kv_b_proj"]},
    ):
        assert layers(kept) == planned, kept
    assert layers(built="bfloat16") == planned - {"kv_b_proj"}
    assert layers(built="float8_e4m3fn") == planned
