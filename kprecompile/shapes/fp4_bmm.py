"""FP4 batched GEMM of MLA's absorbed weights, as vLLM runs it on gfx950 for bf16 weights.

Where kv_b_proj's weight is bf16 (an unquantized checkpoint, or one whose quantization leaves it
out), vLLM 0.15 to 0.32 on gfx950 (0.15 and 0.16 on every GPU, where gfx942's AITER then asserts)
with AITER (VLLM_ROCM_USE_AITER_FP4BMM, on by default until 0.33) quantizes W_UK and W_UV to
MXFP4 when it processes the weights (AITER's `dynamic_mxfp4_quant`, through vLLM's
`quark_quantize_weight_to_mxfp4`) and multiplies with AITER's `batched_gemm_a16wfp4` instead of
the FP8 BMM, with no load-time sweep over batch sizes: each decode token count compiles on the
request path unless warmed.

- `w_uk_quant`, `w_uv_quant`: the weights quantized, once each at load ((L x heads, P) and
  (heads x V, L) bf16 rows; MXFP4 packs two values a byte, one e8m0 scale per 32);
- `q_nope_w_uk`: q_nope (heads, m, P), a transposed view of q, times W_K, the packed (L, heads,
  P/2) transposed to (heads, L, P/2); with an FP8 KV cache the product is scaled by q's scale;
- `attn_out_w_uv`: the attention output (heads, m, L), a transposed view, times the contiguous
  W_V (heads, V, L/2) into the preallocated token-major output (`y`, as vLLM's `rocm_aiter_ops`
  passes it).

AITER's package on the index (0.1.7.post2.dev18) has no `batched_gemm_a16wfp4`: planning this
family needs the AITER the release's ROCm image builds (`kprecompile engine install ...
--aiter-source`), and says so where it is missing (`warmup/planning.py`).
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
from .fp8_bmm import enumerate_fp8_bmm

WRAPPER_MODULE = "aiter.ops.triton.batched_gemm_a16wfp4"
WRAPPER_NAME = "batched_gemm_a16wfp4"
QUANT_MODULE = "aiter.ops.triton.quant"
QUANT_NAME = "dynamic_mxfp4_quant"
# vLLM's is_fp4bmm_enabled: gfx950 (CDNA 4) only.
SUPPORTED_ARCHS = ("gfx950",)
# MXFP4: two values per byte, one scale per 32 values.
PACK = 2
SCALE_GROUP = 32

Product = Literal["w_uk_quant", "w_uv_quant", "q_nope_w_uk", "attn_out_w_uv"]


@dataclass(frozen=True)
class Fp4BmmShape:
    product: Product
    heads: int
    # Decode tokens (0 for the weights' quantization).
    m: int
    k: int
    n: int
    # Width per head of the tensor the activation is a view of (q's nope + rope dims, or
    # kv_lora_rank): it decides the activation's strides.
    source_head_width: int
    activation_dtype: str
    # q's product is scaled by q's scale where the KV cache is FP8.
    y_scale: bool = False


def enumerate_fp4_bmm(model: ModelConfig, serving: ServingParams, line: ReleaseLine | None) -> tuple[Fp4BmmShape, ...]:
    """The weights' two quantizations, then the FP8 BMM's two products for every decode token
    count (vLLM makes both calls alike), q's scaled where the KV cache is FP8."""
    if model.mla is None:
        return ()
    mla = model.mla
    heads = serving.heads_per_rank(model)
    dtype = serving.activation_dtype(model)
    shapes = [
        Fp4BmmShape("w_uk_quant", heads, 0, k=mla.qk_nope_head_dim, n=mla.kv_lora_rank, source_head_width=0,
                    activation_dtype=dtype),
        Fp4BmmShape("w_uv_quant", heads, 0, k=mla.kv_lora_rank, n=mla.v_head_dim, source_head_width=0,
                    activation_dtype=dtype),
    ]  # fmt: skip
    for product in enumerate_fp8_bmm(model, serving, line):
        scaled = product.product == "q_nope_w_uk" and serving.kv_cache_is_fp8
        shapes.append(
            Fp4BmmShape(
                product.product,
                product.heads,
                product.m,
                k=product.k,
                n=product.n,
                source_head_width=product.source_head_width,
                activation_dtype=product.activation_dtype,
                y_scale=scaled,
            )
        )
    return tuple(shapes)


def describe_shapes(shapes: tuple[Fp4BmmShape, ...]) -> dict[str, object]:
    products = {shape.product: f"K={shape.k} N={shape.n}" for shape in shapes if shape.m}
    return {
        "heads_per_rank": shapes[0].heads,
        **products,
        "m": f"1..{max(shape.m for shape in shapes)}",
        "weights": "MXFP4 (quantized at load)",
        "activation_dtype": shapes[0].activation_dtype,
    }


def describe_call(shape: Fp4BmmShape) -> str:
    if not shape.m:
        return f"{QUANT_NAME}({shape.product}, heads={shape.heads}, k={shape.k}, n={shape.n})"
    return f"{WRAPPER_NAME}({shape.product}, heads={shape.heads}, m={shape.m}, k={shape.k}, n={shape.n})"


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    if target.name in SUPPORTED_ARCHS:
        return None
    if line is not None and line.fp4_bmm_targets == "every" and target.is_rocm:
        return (
            f"vLLM {line.name} runs AITER's FP4 BMM on {target.name} too, where AITER has no MXFP4 (its "
            "wrapper asserts): nothing to compile; VLLM_ROCM_USE_AITER_FP4BMM=0 runs the FP8 BMM"
        )
    return f"vLLM runs AITER's FP4 BMM on {', '.join(SUPPORTED_ARCHS)} only (MXFP4 needs CDNA 4)"


def launch(shape: Fp4BmmShape, target: Target) -> None:
    import torch

    activation = getattr(torch, shape.activation_dtype)
    meta = torch.device("meta")
    heads, m, k, n = shape.heads, shape.m, shape.k, shape.n
    if shape.product in ("w_uk_quant", "w_uv_quant"):
        # W_UK (L, heads, P) as rows of P; W_UV permuted to (heads, V, L) as rows of L.
        rows = n * heads if shape.product == "w_uk_quant" else heads * n
        quantize = getattr(import_library_module(QUANT_MODULE), QUANT_NAME)
        quantize(torch.empty((rows, k), dtype=activation, device=meta))
        return
    bmm = getattr(import_library_module(WRAPPER_MODULE), WRAPPER_NAME)
    packed, scales = torch.uint8, torch.uint8
    if shape.product == "q_nope_w_uk":
        # Quantized as (L, heads, P/2) and transposed: (heads, L, P/2), L-major.
        weight = torch.empty((n, heads, k // PACK), dtype=packed, device=meta).transpose(0, 1)
        weight_scale = torch.empty((n, heads, k // SCALE_GROUP), dtype=scales, device=meta).transpose(0, 1)
        q = torch.empty((m, heads, shape.source_head_width), dtype=activation, device=meta)
        q_nope = q[..., :k].transpose(0, 1)
        y_scale = torch.empty((), dtype=torch.float32, device=meta) if shape.y_scale else None
        bmm(q_nope, weight, weight_scale, transpose_bm=True, prequant=True, y_scale=y_scale)
    else:
        weight = torch.empty((heads, n, k // PACK), dtype=packed, device=meta)
        weight_scale = torch.empty((heads, n, k // SCALE_GROUP), dtype=scales, device=meta)
        attn_out = torch.empty((m, heads * k), dtype=activation, device=meta).view(-1, heads, k).transpose(0, 1)
        out = torch.empty((m, heads * n), dtype=activation, device=meta).view(-1, heads, n)
        bmm(attn_out, weight, weight_scale, y=out, transpose_bm=True, prequant=True, y_scale=None)


FAMILY = KernelFamily(
    name="fp4_bmm",
    description="AITER's FP4 batched GEMM of MLA's absorbed bf16 weights on gfx950 (and their MXFP4 quantization)",
    library=AITER_DISTRIBUTION,
    traced_modules=("aiter.ops.triton",),
    enumerate_shapes=enumerate_fp4_bmm,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
)
