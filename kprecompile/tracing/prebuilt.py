"""Prebuilt kernels while tracing: the HIP, CK and assembly entry points vLLM's backends call
beside their Triton kernels compile nothing, and on a builder without ROCm or vLLM's extensions
they are not even there. These stand-ins take their place where they are absent."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .libraries import AITER_PACKAGE, import_library_module


def prebuilt_varlen_attention(q: Any, k: Any, v: Any, *args: object, **kwargs: object) -> Any:
    """The varlen flash attention vLLM's MLA prefill calls on ROCm (AITER's `flash_attn_varlen_func`
    or flash-attn's), on meta tensors: the output as (tokens, heads, V's head size) in the query's
    dtype and, when asked for, the log-sum-exp as (heads, tokens) float32, as both libraries
    return them (AITER: `gen_mha_varlen_fwd_fake_tensor`)."""
    import torch

    out = kwargs.get("out")
    if out is None:
        out = torch.empty((q.shape[0], q.shape[1], v.shape[-1]), dtype=q.dtype, device=q.device)
    if any(kwargs.get(flag) for flag in ("return_lse", "return_softmax_lse", "return_attn_probs")):
        return out, torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    return out


def _persistent_buffer_sizes(*args: object, **kwargs: object) -> tuple[tuple[tuple[int], Any], ...]:
    """AITER's `get_mla_metadata_info_v1` and `get_ps_metadata_info_v1`, which size the work
    buffers of its HIP MLA kernels from the GPU's compute units (they live in AITER's HIP module):
    the six buffers as one element each, which the builder allocates on meta. Nothing a traced
    kernel compiles reads them; the kernels that do are prebuilt."""
    import torch

    return tuple(((1,), torch.int32) for _ in range(6))


def _prebuilt(*args: object, **kwargs: object) -> None:
    """A prebuilt (HIP, CK, assembly) kernel's entry point while tracing: it compiles nothing."""


@contextlib.contextmanager
def aiter_attention_prebuilt() -> Iterator[None]:
    """AITER's prebuilt attention where the real `aiter` package is not initialized (a builder
    without ROCm: `libraries.py`): `flash_attn_varlen_func` (vLLM's AITER backends call it, or
    import it when built), `paged_attention_common` and the `torch.ops.aiter` paged attention
    vLLM's ROCM_AITER_FA decodes with from 0.19, and the sizes of the persistent buffers vLLM's
    ROCM_AITER_MLA builder allocates from 0.2x (`_persistent_buffer_sizes`)."""
    package = import_library_module(AITER_PACKAGE)
    entries = {
        "flash_attn_varlen_func": prebuilt_varlen_attention,
        "paged_attention_common": _prebuilt,
        "get_mla_metadata_info_v1": _persistent_buffer_sizes,
        "get_ps_metadata_info_v1": _persistent_buffer_sizes,
    }
    missing = [name for name in entries if not hasattr(package, name)]
    for name in missing:
        setattr(package, name, entries[name])
    try:
        with compiled_ops_skipped("aiter.paged_attention_v1"):
            yield
    finally:
        for name in missing:
            delattr(package, name)


@contextlib.contextmanager
def compiled_ops_skipped(*names: str) -> Iterator[None]:
    """Compiled torch operators (`namespace.name` under `torch.ops`) that vLLM's backends call
    directly do nothing while tracing where no library registered them (a builder without
    vLLM's or AITER's extensions); registered ones are left as they are."""
    import torch

    added = []
    for qualified in names:
        namespace, _, name = qualified.partition(".")
        space = getattr(torch.ops, namespace)
        if not hasattr(space, name):
            setattr(space, name, _prebuilt)
            added.append((space, name))
    try:
        yield
    finally:
        for space, name in added:
            delattr(space, name)
