"""AITER's MLA decode (`aiter.mla.mla_decode_fwd`), called as vLLM's AITER MLA backends call it.

vLLM passes the absorbed query (tokens, heads, kv_lora_rank + rope), the latent KV cache viewed
as (slots, 1, 1, kv_lora_rank + rope) pages of one token, an output of kv_lora_rank per head,
int32 index arrays (one sequence per request, every page full) and, with an FP8 KV cache, an
FP8 query with per-tensor scales. The wrapper's stage 1 is a prebuilt assembly kernel: while
tracing it is a no-op (nothing to compile, no data on meta tensors); its stage-2 Triton reduce
is what gets traced, with the split count and variant the wrapper itself chooses for the GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..driver import meta_allocations
from ..shapes.mla_decode import MlaDecodeShape
from ..targets import Target
from ._imports import AITER_PACKAGE, import_library_module

WRAPPER_MODULE = "aiter.mla"
# The assembly kernels mla_decode_fwd calls through the `aiter` package.
_PREBUILT_OPS = ("mla_decode_stage1_asm_fwd", "mla_reduce_v1")


def unsupported_reason(target: Target) -> str | None:
    if not target.is_rocm:
        return "AITER's MLA decode runs an AMD assembly kernel and AMD-only launch options; ROCm targets only"
    if target.fp8_dtype_name is None:
        return f"AITER's MLA decode kernels are built for gfx942 and gfx950, not {target.name}"
    return None


def describe(shape: MlaDecodeShape) -> str:
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
