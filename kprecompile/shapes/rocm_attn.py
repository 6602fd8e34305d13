"""vLLM's ROCM_ATTN backend: its own Triton kernels, traced from the installed vLLM.

Each step, the backend's `forward` calls vLLM's `chunked_prefill_paged_decode`: steps with a
prefill run the prefix-prefill kernel (`context_attention_fwd`'s `_fwd_kernel`, decodes skipped),
and decodes run vLLM's HIP `paged_attention_rocm` where vLLM's rule takes it, else the Triton
`kernel_paged_attention_2d` (sliding window, sinks, head or block sizes, GQA ratios, dtypes or
context lengths the HIP kernel does not take, or `VLLM_ROCM_CUSTOM_PAGED_ATTN=0`). The plan
calls the backend's real `forward` (vLLM's impl, metadata and call, as the release has them) on
meta tensors, so vLLM's own rule picks the kernels; its HIP operators are prebuilt (nothing to
compile) and skipped while tracing.

The kernels' specializations depend on the model, the KV cache's type and size class and the
kind of step, not on batch sizes (those only shape the grid): the plan walks steps with and
without a prefill, on contexts either side of the HIP kernel's limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

from ..libraries import VLLM_DISTRIBUTION, import_library_module
from ..models import ModelConfig
from ..serving import ServingParams
from ..targets import Target
from ._paged_kv import KV_CACHE_STORAGE_CLASSES, StorageClass, block_count, kv_cache_parameters, paged_kv_fields
from .family import KernelFamily

BACKEND_MODULE = "vllm.v1.attention.backends.rocm_attn"
# vLLM's HIP paged attention takes contexts up to this many tokens.
HIP_CONTEXT_LIMIT = 128 * 1024
# vLLM's compiled operators the backend calls besides its Triton kernels.
_PREBUILT_OPS = ("paged_attention_rocm", "reshape_and_cache")


@dataclass(frozen=True)
class RocmAttnShape:
    q_heads: int
    kv_heads: int
    head_size: int
    block_size: int
    max_blocks_per_seq: int
    num_seqs: int
    tokens: int
    max_query_len: int
    max_seq_len: int
    sliding_window: int
    dtype: str
    kv_cache_fp8: bool
    kv_cache_storage: StorageClass


def enumerate_rocm_attn(model: ModelConfig, serving: ServingParams) -> tuple[RocmAttnShape, ...]:
    """Decode-only steps and steps with a prefill, on a short context, one at the HIP kernel's
    limit and the longest one, for each KV storage class."""
    if model.mla is not None:
        return ()
    base = paged_kv_fields(model, serving)
    model_len = serving.model_len(model)
    query_lens = sorted({1, min(serving.max_num_batched_tokens, model_len, 2 * serving.decode_query_len + 1)})
    contexts = sorted({min(512, model_len), min(HIP_CONTEXT_LIMIT, model_len), model_len})
    shapes = []
    for storage in KV_CACHE_STORAGE_CLASSES:
        for query_len in query_lens:
            for seq_len in contexts:
                if seq_len < query_len:
                    continue
                num_seqs = min(2, serving.max_num_seqs)
                shapes.append(
                    RocmAttnShape(
                        **base,
                        num_seqs=num_seqs,
                        tokens=query_len + num_seqs - 1,
                        max_query_len=query_len,
                        max_seq_len=seq_len,
                        kv_cache_storage=storage,
                    )  # fmt: skip
                )
    return tuple(shapes)


def describe_shapes(shapes: tuple[RocmAttnShape, ...]) -> dict[str, object]:
    return kv_cache_parameters(
        shapes[0],
        steps="decode, prefill" if len({shape.max_query_len > 1 for shape in shapes}) == 2 else "decode",
        contexts=",".join(str(length) for length in sorted({shape.max_seq_len for shape in shapes})),
    )


def describe_call(shape: RocmAttnShape) -> str:
    return (
        f"RocmAttentionImpl.forward(num_seqs={shape.num_seqs}, tokens={shape.tokens}, "
        f"max_query_len={shape.max_query_len}, max_seq_len={shape.max_seq_len}, kv_cache {shape.kv_cache_storage})"
    )


def limits(model: ModelConfig, serving: ServingParams, target: Target) -> str | None:
    if not target.is_rocm:
        return "vLLM's ROCM_ATTN backend runs on ROCm only"
    if serving.block_size % 16:
        return f"vLLM's ROCM_ATTN takes block sizes that are multiples of 16, not {serving.block_size}"
    return None


@contextlib.contextmanager
def prebuilt_ops_skipped() -> Iterator[None]:
    """vLLM's HIP operators do nothing while tracing: they are prebuilt, and absent on a CPU build."""
    ops = import_library_module("vllm._custom_ops")
    saved = {name: getattr(ops, name) for name in _PREBUILT_OPS if hasattr(ops, name)}
    for name in saved:
        setattr(ops, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for name, op in saved.items():
            setattr(ops, name, op)


def _kv_cache(backend: type, shape: RocmAttnShape, element_type, blocks: int):
    """The per-layer KV cache as vLLM's runner hands it to the backend: the backend's own shape
    where it declares one (0.11 to 0.18: (2, blocks, block_size, kv_heads, head_size)); from 0.19
    the per-layer view of the K/V-group-first layout, logical (blocks, 2, block_size,
    kv_heads * head_size) over physical (2, blocks, ...)."""
    import torch

    meta = torch.device("meta")
    get_shape = getattr(backend, "get_kv_cache_shape", None)
    if get_shape is not None:
        try:
            dims = get_shape(blocks, shape.block_size, shape.kv_heads, shape.head_size)
        except NotImplementedError:
            dims = None
        if dims is not None:
            return torch.empty(dims, dtype=element_type, device=meta)
    physical = torch.empty((2, blocks, shape.block_size, shape.kv_heads * shape.head_size), dtype=element_type,
                           device=meta)  # fmt: skip
    return physical.transpose(0, 1)


def _metadata(metadata_cls: type, values: dict[str, object]):
    """The backend's metadata record from the values a metadata builder computes; a required
    field this does not know fails the trace with its name (a release to read)."""
    known = {"use_cascade": False, "common_prefix_len": 0, "cu_prefix_query_lens": None, "prefix_kv_lens": None,
             "suffix_kv_lens": None, **values}  # fmt: skip
    arguments = {}
    for field in dataclasses.fields(metadata_cls):
        if field.name in known:
            arguments[field.name] = known[field.name]
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise TypeError(f"{metadata_cls.__name__} needs {field.name!r}, which kprecompile does not fill")
    return metadata_cls(**arguments)


def launch(shape: RocmAttnShape, target: Target) -> None:
    import torch

    from ..integrations.vllm.platform import refresh_switches

    module = import_library_module(BACKEND_MODULE)
    backend = module.RocmAttentionBackend
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    # vLLM allocates an FP8 KV cache as bytes and views it as the platform's FP8 type.
    element_type = torch.uint8 if shape.kv_cache_fp8 else dtype
    element = torch.empty((), dtype=element_type, device=meta).element_size()
    per_block = 2 * shape.block_size * shape.kv_heads * shape.head_size * element
    needed = -(-shape.max_seq_len // shape.block_size) * shape.num_seqs
    kv_cache = _kv_cache(backend, shape, element_type, block_count(needed, per_block, shape.kv_cache_storage))
    impl = backend.get_impl_cls()(shape.q_heads, shape.head_size, shape.head_size**-0.5, shape.kv_heads, None,
                                  shape.sliding_window or None, "fp8" if shape.kv_cache_fp8 else "auto")  # fmt: skip
    query = torch.empty((shape.tokens, shape.q_heads, shape.head_size), dtype=dtype, device=meta)
    key = torch.empty((shape.tokens, shape.kv_heads, shape.head_size), dtype=dtype, device=meta)
    scale = torch.empty((), dtype=torch.float32, device=meta)
    layer = SimpleNamespace(_q_scale=scale, _k_scale=scale, _v_scale=scale, _q_scale_float=1.0, _k_scale_float=1.0,
                            _v_scale_float=1.0)  # fmt: skip
    metadata = _metadata(module.RocmAttentionMetadata, {
        "num_actual_tokens": shape.tokens,
        "max_query_len": shape.max_query_len,
        "query_start_loc": torch.empty(shape.num_seqs + 1, dtype=torch.int32, device=meta),
        "max_seq_len": shape.max_seq_len,
        "seq_lens": torch.empty(shape.num_seqs, dtype=torch.int32, device=meta),
        "block_table": torch.empty((shape.num_seqs, shape.max_blocks_per_seq), dtype=torch.int32, device=meta),
        "slot_mapping": torch.empty(shape.tokens, dtype=torch.int64, device=meta),
    })  # fmt: skip
    # vLLM's rule for decode reads the AITER switches (AITER's paged attention takes decode then).
    refresh_switches()
    with prebuilt_ops_skipped():
        impl.forward(layer, query, key, torch.empty_like(key), kv_cache, metadata, output=torch.empty_like(query))


FAMILY = KernelFamily(
    name="rocm_attn",
    description="vLLM's ROCM_ATTN: its Triton prefix prefill, and its Triton paged decode where vLLM declines HIP",
    library=VLLM_DISTRIBUTION,
    # The backend and its kernels, which read the platform at import. Not `vllm._custom_ops` (no
    # Triton kernels): the backend takes it from the package (`from vllm import _custom_ops`), so
    # it must stay the one module `prebuilt_ops_skipped` patches; not `vllm._aiter_ops` (it
    # registers torch operators at import): its switches are read again for each call.
    traced_modules=("vllm.v1.attention.backends.rocm_attn", "vllm.attention.ops", "vllm.v1.attention.ops"),
    enumerate_shapes=enumerate_rocm_attn,
    describe_shapes=describe_shapes,
    describe_call=describe_call,
    launch=launch,
    limits=limits,
)
