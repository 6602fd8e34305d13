"""FP8 batched GEMM shapes for MLA's absorbed weights.

vLLM's ROCm MLA path multiplies, per decode step and per rank, with AITER's
`batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant`:

- `q_nope_w_uk`: q_nope (heads, m, qk_nope_head_dim), a transposed view of q, times W_K
  (heads, kv_lora_rank, qk_nope_head_dim): K = qk_nope_head_dim, N = kv_lora_rank;
- `attn_out_w_uv`: the attention output (heads, m, kv_lora_rank), a transposed view, times
  W_V (heads, v_head_dim, kv_lora_rank) into a preallocated output: K = kv_lora_rank,
  N = v_head_dim.

m is the number of decode tokens (`ServingParams.decode_token_counts`: every count up to
max_num_seqs x (1 + speculative tokens), and graph-padded counts); the kernel takes M through a
constexpr grid size, so most m values are distinct kernels.

The call is made as vLLM makes it: the activation is a transposed view (heads first) of a
token-major tensor, the weights contiguous FP8 per-head matrices with one scale, the output
token-major (`transpose_bm=True`); the second product writes into a preallocated output view.
Strides and storage sizes enter Triton's specialization, so the meta tensors mirror the real
layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import AITER_DISTRIBUTION, import_library_module
from ..vllm.releases import ReleaseLine
from .family import KernelFamily

GROUP_SIZE = 128
WRAPPER_MODULE = "aiter.ops.triton.batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant"
WRAPPER_NAME = "batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant"
# AITER ships tuned configs for these archs only (aiter.ops.triton.utils._triton.arch_info).
SUPPORTED_ARCHS = ("gfx942", "gfx950")

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


def enumerate_fp8_bmm(model: ModelConfig, serving: ServingParams, line: ReleaseLine | None) -> tuple[Fp8BmmShape, ...]:
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


def describe_shapes(shapes: tuple[Fp8BmmShape, ...]) -> dict[str, object]:
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


def describe_call(shape: Fp8BmmShape) -> str:
    return f"{WRAPPER_NAME}({shape.product}, heads={shape.heads}, m={shape.m}, k={shape.k}, n={shape.n})"


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if target.fp8_dtype_name is None:
        return f"{target.name} has no FP8 support"
    if not target.is_rocm:
        return "AITER's FP8 BMM configs carry AMD-only launch options (kpack); ROCm targets only"
    if target.name not in SUPPORTED_ARCHS:
        return f"AITER has tuned FP8 BMM configs only for {', '.join(SUPPORTED_ARCHS)}"
    return None


def launch(shape: Fp8BmmShape, target: Target) -> None:
    import torch

    bmm = getattr(import_library_module(WRAPPER_MODULE), WRAPPER_NAME)
    activation = getattr(torch, shape.activation_dtype)
    meta = torch.device("meta")
    heads, m = shape.heads, shape.m
    weight = torch.empty((heads, shape.n, shape.k), dtype=target.fp8_dtype, device=meta)
    weight_scale = torch.empty((), dtype=torch.float32, device=meta)
    if shape.product == "q_nope_w_uk":
        # q is (tokens, heads, nope + rope); q_nope is its first nope columns, heads first.
        q = torch.empty((m, heads, shape.source_head_width), dtype=activation, device=meta)
        q_nope = q[..., : shape.k].transpose(0, 1)
        bmm(q_nope, weight, weight_scale, group_size=shape.group_size, transpose_bm=True)
    else:
        attn_out = torch.empty((m, heads, shape.k), dtype=activation, device=meta).transpose(0, 1)
        out = torch.empty((m, heads * shape.n), dtype=activation, device=meta).view(-1, heads, shape.n)
        bmm(attn_out, weight, weight_scale, group_size=shape.group_size, transpose_bm=True, YQ=out)


FAMILY = KernelFamily(
    name="fp8_bmm",
    description="AITER's FP8 batched GEMM of MLA's absorbed weights (q_nope x W_UK, attention x W_UV)",
    library=AITER_DISTRIBUTION,
    traced_modules=("aiter.ops.triton",),
    enumerate_shapes=enumerate_fp8_bmm,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
)
