"""MLA decode: AITER's `mla_decode_fwd` as vLLM's AITER MLA backends call it.

Per decode step and rank, vLLM calls `aiter.mla.mla_decode_fwd` with the absorbed query
(tokens, heads, kv_lora_rank + qk_rope_head_dim), the latent KV cache viewed as
(slots, 1, 1, kv_lora_rank + rope) pages of one token, an output of kv_lora_rank per head,
int32 index arrays (one sequence per request, every page full) and, with an FP8 KV cache, an
FP8 query with per-tensor scales. Stage 1 is a prebuilt assembly kernel: while tracing it is a
no-op (nothing to compile, no data on meta tensors). Stage 2, which reduces the KV splits, is
a Triton kernel that takes the batch size as a constexpr (docs/design.md, fact 11), so every batch
size the engine can reach is its own kernel: decodes in a mixed prefill/decode step run at
their exact count, so that is every size up to max_num_seqs
(`ServingParams.decode_batch_sizes`). The split count and variant are the wrapper's own choice
for the GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..platforms.triton_driver import meta_allocations
from ..tracing.libraries import AITER_DISTRIBUTION, AITER_PACKAGE, import_library_module
from ..vllm.releases import ReleaseLine
from .family import KernelFamily

# AITER 0.1.7's non-persistent MLA decode supports these head counts per rank.
SUPPORTED_HEADS = (16, 128)
# A context long enough that the KV is split (stage 2 runs) at every batch size.
_LONG_CONTEXT = 8192
WRAPPER_MODULE = "aiter.mla"
# The assembly kernels mla_decode_fwd calls through the `aiter` package.
_PREBUILT_OPS = ("mla_decode_stage1_asm_fwd", "mla_reduce_v1")


@dataclass(frozen=True)
class MlaDecodeShape:
    heads: int
    batch: int
    # Query tokens per sequence: 1, or 1 + speculative tokens.
    query_len: int
    context_len: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    # Model dtype of q and the output; with an FP8 KV cache vLLM quantizes q to FP8 too.
    dtype: str
    kv_cache_fp8: bool


def limits(model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None) -> str | None:
    heads = serving.heads_per_rank(model)
    if heads not in SUPPORTED_HEADS:
        return (
            f"AITER's MLA decode supports {' or '.join(map(str, SUPPORTED_HEADS))} heads per rank; "
            f"{model.name} at tp {serving.tensor_parallel_size} has {heads}"
        )
    if not target.is_rocm:
        return "AITER's MLA decode runs an AMD assembly kernel and AMD-only launch options; ROCm targets only"
    if target.fp8_dtype_name is None:
        return f"AITER's MLA decode kernels are built for gfx942 and gfx950, not {target.name}"
    return None


def enumerate_mla_decode(
    model: ModelConfig, serving: ServingParams, line: ReleaseLine | None
) -> tuple[MlaDecodeShape, ...]:
    if model.mla is None:
        return ()
    heads = serving.heads_per_rank(model)
    context = min(serving.model_len(model), _LONG_CONTEXT)
    shapes = []
    # With speculative decoding a request verifies up to 1 + spec tokens in one step.
    for query_len in range(1, serving.decode_query_len + 1):
        for batch in serving.decode_batch_sizes():
            shapes.append(
                MlaDecodeShape(
                    heads=heads,
                    batch=batch,
                    query_len=query_len,
                    context_len=context,
                    kv_lora_rank=model.mla.kv_lora_rank,
                    qk_rope_head_dim=model.mla.qk_rope_head_dim,
                    dtype=serving.activation_dtype(model),
                    kv_cache_fp8=serving.kv_cache_is_fp8,
                )
            )
    return tuple(shapes)


def describe_shapes(shapes: tuple[MlaDecodeShape, ...]) -> dict[str, object]:
    first = shapes[0]
    return {
        "heads_per_rank": first.heads,
        "head_dim": f"{first.kv_lora_rank}+{first.qk_rope_head_dim}",
        "batch": f"1..{max(shape.batch for shape in shapes)}",
        "query_len": ",".join(str(q) for q in sorted({shape.query_len for shape in shapes})),
        "page_size": 1,
        "kv_cache": "fp8" if first.kv_cache_fp8 else first.dtype,
    }


def describe_call(shape: MlaDecodeShape) -> str:
    return f"mla_decode_fwd(batch={shape.batch}, heads={shape.heads}, query_len={shape.query_len})"


@contextlib.contextmanager
def _prebuilt_ops_skipped() -> Iterator[None]:
    import sys

    package = sys.modules[AITER_PACKAGE]
    saved = {name: getattr(package, name) for name in _PREBUILT_OPS if hasattr(package, name)}
    for name in _PREBUILT_OPS:
        setattr(package, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for name in _PREBUILT_OPS:
            if name in saved:
                setattr(package, name, saved[name])
            else:
                delattr(package, name)


def launch(shape: MlaDecodeShape, target: Target) -> None:
    import torch

    mla = import_library_module(WRAPPER_MODULE)
    meta = torch.device("meta")
    model_dtype = getattr(torch, shape.dtype)
    fp8 = target.fp8_dtype
    head_dim = shape.kv_lora_rank + shape.qk_rope_head_dim
    tokens = shape.batch * shape.query_len
    slots = shape.batch * shape.context_len
    q_dtype = fp8 if shape.kv_cache_fp8 else model_dtype
    q = torch.empty((tokens, shape.heads, head_dim), dtype=q_dtype, device=meta)
    kv_cache = torch.empty((slots, 1, head_dim), dtype=fp8 if shape.kv_cache_fp8 else model_dtype, device=meta)
    kv_buffer = kv_cache.unsqueeze(2).view(-1, 1, 1, head_dim)
    out = torch.empty((tokens, shape.heads, shape.kv_lora_rank), dtype=model_dtype, device=meta)
    qo_indptr = torch.empty(shape.batch + 1, dtype=torch.int32, device=meta)
    kv_indptr = torch.empty(shape.batch + 1, dtype=torch.int32, device=meta)
    kv_indices = torch.empty(slots, dtype=torch.int32, device=meta)
    kv_last_page_lens = torch.empty(shape.batch, dtype=torch.int32, device=meta)
    scales = {}
    if shape.kv_cache_fp8:
        scale = torch.empty((), dtype=torch.float32, device=meta)
        scales = {"q_scale": scale, "kv_scale": scale}
    # The wrapper allocates its split index with device="cuda".
    with _prebuilt_ops_skipped(), meta_allocations():
        mla.mla_decode_fwd(
            q,
            kv_buffer,
            out,
            qo_indptr,
            kv_indptr,
            kv_indices,
            kv_last_page_lens,
            shape.query_len,
            sm_scale=head_dim**-0.5,
            logit_cap=0.0,
            **scales,
        )


FAMILY = KernelFamily(
    name="mla_decode",
    description="AITER's MLA decode (assembly stage 1, Triton stage-2 split reduce)",
    library=AITER_DISTRIBUTION,
    traced_modules=("aiter.mla",),
    enumerate_shapes=enumerate_mla_decode,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
)
