"""FP8 batched GEMM shapes for MLA's absorbed weights.

vLLM's ROCm MLA path multiplies, per decode step and per rank, with AITER's
`batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant`:

- `q_nope_w_uk`: q_nope (heads, m, qk_nope_head_dim), a transposed view of q, times W_K
  (heads, kv_lora_rank, qk_nope_head_dim): K = qk_nope_head_dim, N = kv_lora_rank;
- `attn_out_w_uv`: the attention output (heads, m, kv_lora_rank), a transposed view, times
  W_V (heads, v_head_dim, kv_lora_rank) into a preallocated output: K = kv_lora_rank,
  N = v_head_dim.

m is the number of decode tokens (`ServingParams.decode_token_counts`: every count up to
max_num_seqs x (1 + speculative tokens), and graph-padded counts);  the kernel takes M through a constexpr
grid size, so most m values are distinct kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..models import ModelConfig
from ..serving import ServingParams

FAMILY = "fp8_bmm"
GROUP_SIZE = 128

Product = Literal["q_nope_w_uk", "attn_out_w_uv"]


@dataclass(frozen=True)
class Fp8BmmShape:
    product: Product
    heads: int
    m: int
    k: int
    n: int
    # Width per head of the tensor the activation is a view of: q's nope + rope dims for
    # q_nope_w_uk, kv_lora_rank for attn_out_w_uv. It decides the activation's strides.
    source_head_width: int
    activation_dtype: str
    group_size: int = GROUP_SIZE


def enumerate_fp8_bmm(model: ModelConfig, serving: ServingParams) -> tuple[Fp8BmmShape, ...]:
    """Both absorbed-weight products for every decode token count; none without MLA."""
    if model.mla is None:
        return ()
    mla = model.mla
    heads = serving.heads_per_rank(model)
    dtype = serving.activation_dtype(model)
    shapes = []
    for m in serving.decode_token_counts():
        shapes.append(
            Fp8BmmShape(
                "q_nope_w_uk",
                heads,
                m,
                k=mla.qk_nope_head_dim,
                n=mla.kv_lora_rank,
                source_head_width=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
                activation_dtype=dtype,
            )
        )
        shapes.append(
            Fp8BmmShape(
                "attn_out_w_uv",
                heads,
                m,
                k=mla.kv_lora_rank,
                n=mla.v_head_dim,
                source_head_width=mla.kv_lora_rank,
                activation_dtype=dtype,
            )
        )
    return tuple(shapes)


def describe_parameters(shapes: tuple[Fp8BmmShape, ...]) -> dict[str, object]:
    """What `plan` shows for this family: the dimensions that decide its kernels."""
    first = shapes[0]
    products = {shape.product: f"K={shape.k} N={shape.n}" for shape in shapes}
    return {
        "heads_per_rank": first.heads,
        **products,
        "m": f"1..{max(shape.m for shape in shapes)}",
        "group_size": first.group_size,
        "activation_dtype": first.activation_dtype,
    }
