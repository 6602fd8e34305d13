"""AITER's FP8 batched GEMM, called exactly as vLLM's ROCm MLA path calls it.

The activation is a transposed view (heads first) of a token-major tensor, the weights are
contiguous FP8 per-head matrices with one scale, and the output is token-major
(`transpose_bm=True`); the second product writes into a preallocated output view. Strides
and storage sizes enter Triton's specialization, so the meta tensors mirror the real layout.
"""

from __future__ import annotations

from ..shapes.fp8_bmm import Fp8BmmShape
from ..targets import Target
from ._imports import import_library_module

WRAPPER_MODULE = "aiter.ops.triton.batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant"
WRAPPER_NAME = "batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant"
# AITER ships tuned configs for these archs only (aiter.ops.triton.utils._triton.arch_info).
SUPPORTED_ARCHS = ("gfx942", "gfx950")


def unsupported_reason(target: Target) -> str | None:
    if target.fp8_dtype_name is None:
        return f"{target.name} has no FP8 support"
    if not target.is_rocm:
        return "AITER's FP8 BMM configs carry AMD-only launch options (kpack); ROCm targets only"
    if target.name not in SUPPORTED_ARCHS:
        return f"AITER has tuned FP8 BMM configs only for {', '.join(SUPPORTED_ARCHS)}"
    return None


def describe(shape: Fp8BmmShape) -> str:
    return f"{WRAPPER_NAME}({shape.product}, heads={shape.heads}, m={shape.m}, k={shape.k}, n={shape.n})"


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
