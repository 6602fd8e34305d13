import pytest

from kprecompile.errors import InputError
from kprecompile.models import load_model
from kprecompile.serving import ServingParams
from kprecompile.shapes import enumerate_shapes
from kprecompile.shapes.fp8_bmm import enumerate_fp8_bmm


def test_deepseek_r1_tp8_sweeps_both_products_over_every_m():
    model = load_model("deepseek-r1")
    shapes = enumerate_fp8_bmm(model, ServingParams(tensor_parallel_size=8))
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


def test_models_without_mla_have_no_fp8_bmm_shapes():
    assert enumerate_shapes(load_model("llama-3.1-8b-instruct"), ServingParams()) == ()


@pytest.mark.parametrize("tp", [3, 32])
def test_heads_not_divisible_by_tp_is_an_input_error(tp):
    model = load_model("deepseek-v2-lite")  # 16 heads
    with pytest.raises(
        InputError, match=rf"--tp: got {tp}, expected a divisor of num_attention_heads = 16 of deepseek-v2-lite"
    ):
        enumerate_fp8_bmm(model, ServingParams(tensor_parallel_size=tp))


@pytest.mark.parametrize(
    "field, kwargs", [("--tp", {"tensor_parallel_size": 0}), ("--max-batch", {"max_batch_size": -1})]
)
def test_serving_params_must_be_positive(field, kwargs):
    with pytest.raises(InputError, match=f"{field}: got -?[0-9]+, expected a positive integer"):
        ServingParams(**kwargs)
