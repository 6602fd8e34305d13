"""What the families of vLLM's own attention kernels share: one engine step through the real
backend of the installed vLLM.

The call is the backend's `forward` as vLLM's runner makes it: vLLM's impl class (from the
backend), the backend's metadata record (its fields as the release has them, filled with what
the metadata builder computes for the step), the per-layer KV cache in the backend's shape, and
a layer carrying the KV scales. vLLM's compiled (HIP/CUDA) operators are prebuilt: they do
nothing while tracing. vLLM's modules are imported under the target's platform
(`libraries.import_library_module`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..errors import InputError
from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import Target
from ..tracing.libraries import VLLM_DISTRIBUTION, import_library_module, release_attribute
from ..tracing.trace import active_capture
from ..vllm.releases import ReleaseLine
from ._paged_kv import KV_CACHE_STORAGE_CLASSES, TWO_GIB, PagedAttentionShape, StorageClass, block_count
from .family import FamilyName, KernelFamily

# vLLM's attention kernels (moved under v1/ in later releases): imported anew per traced target
# with the backend that calls them, since they read the platform at import.
VLLM_ATTENTION_OPS = ("vllm.attention.ops", "vllm.v1.attention.ops")


@dataclass(frozen=True)
class VllmBackend:
    """Where a backend lives in the installed vLLM, and what of it the step needs."""

    module: str
    backend_class: str
    metadata_class: str
    # vLLM's compiled operators the step calls besides the Triton kernels.
    prebuilt_ops: tuple[str, ...] = ()
    # The per-layer KV cache for a backend that declares no shape (blocks, element type) -> tensor.
    layer_view: Callable[[PagedAttentionShape, Any, int], Any] | None = None


def describe_call(shape: PagedAttentionShape) -> str:
    return (
        f"forward(num_seqs={shape.num_seqs}, tokens={shape.tokens}, max_query_len={shape.max_query_len}, "
        f"max_seq_len={shape.max_seq_len}, kv_cache {shape.kv_cache_storage})"
    )


@contextlib.contextmanager
def prebuilt_ops_skipped(names: tuple[str, ...]) -> Iterator[None]:
    """vLLM's compiled operators do nothing while tracing: prebuilt, and absent on a CPU build.

    vLLM's modules take `vllm._custom_ops` from the package (`from vllm import _custom_ops`): it
    is imported once, never per target, so the module patched here is the one they call."""
    ops = import_library_module("vllm._custom_ops")
    saved = {name: getattr(ops, name) for name in names if hasattr(ops, name)}
    for name in saved:
        setattr(ops, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for name, op in saved.items():
            setattr(ops, name, op)


_ABSENT = object()


@contextlib.contextmanager
def attributes_set(*changes: tuple[object, str, object]) -> Iterator[None]:
    """Set (object, attribute, value) for the block; then put back what the object itself held,
    or nothing, so that what it finds on its class (a method) is found there again."""
    saved = [(owner, name, vars(owner).get(name, _ABSENT)) for owner, name, _ in changes]
    for owner, name, value in changes:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


@contextlib.contextmanager
def host_copies(values: dict[int, Any]) -> Iterator[None]:
    """Device tensors whose host copy a metadata builder takes (`.cpu()`, which a meta tensor
    cannot give) give the step's values: `values` maps the meta tensor's id to them, as vLLM's
    runner filled the device tensor from them."""
    import torch
    from torch.overrides import TorchFunctionMode

    class HostCopies(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if func is torch.Tensor.cpu and args and id(args[0]) in values:
                return values[id(args[0])].clone()
            return func(*args, **(kwargs or {}))

    with HostCopies():
        yield


@contextlib.contextmanager
def unpinned_host_memory() -> Iterator[None]:
    """vLLM's metadata builders allocate their host tensors in pinned memory, which needs a GPU
    runtime: on a builder without one, the same tensors unpinned (pinning changes how fast they
    copy, not what they hold)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Unpinned(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.pin_memory:
                return args[0]
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            return func(*args, **kwargs)

    if torch.cuda.is_available():
        yield
        return
    with Unpinned():
        yield


# The attention layer a step is traced for (layer 0 of vLLM's model), by the name vLLM registers it under.
LAYER_NAME = "model.layers.0.self_attn.attn"
# vLLM's `Attention` layer class, by module: moved in 0.19.
ATTENTION_MODULES = ("vllm.model_executor.layers.attention.attention", "vllm.attention.layer")


def attention_class() -> type:
    """vLLM's `Attention` layer class, wherever the installed release keeps it."""
    return release_attribute("Attention", ATTENTION_MODULES)


def kv_scales_layer() -> Any:
    """What a backend reads of vLLM's attention layer besides the step: its query and KV scales,
    held as 0-d float32 tensors beside their floats (1.0 unless the checkpoint has them)."""
    import torch

    scale = torch.empty((), dtype=torch.float32, device="meta")
    return SimpleNamespace(
        _q_scale=scale, _k_scale=scale, _v_scale=scale, _q_scale_float=1.0, _k_scale_float=1.0, _v_scale_float=1.0
    )


def layer_arguments(shape: Any) -> dict[str, Any]:
    """The impl's arguments for the layer's soft-cap and sinks, as vLLM's `Attention` passes them
    (`logits_soft_cap`, and `sinks` as the model's per-head parameter), where the layer has them:
    an impl that takes neither is built as before."""
    import torch

    arguments: dict[str, Any] = {}
    if shape.logits_soft_cap:
        arguments["logits_soft_cap"] = shape.logits_soft_cap
    if shape.sinks:
        arguments["sinks"] = torch.empty(shape.q_heads, dtype=getattr(torch, shape.sinks), device="meta")
    return arguments


def query_type(impl: Any, shape: Any, target: Target) -> Any:
    """The query's element type at the impl: vLLM's `Attention` quantizes it to the platform's FP8
    first (`query_quant`) when the KV cache is FP8 and the impl takes an FP8 query (a method up to
    0.18, an attribute from 0.19)."""
    import torch

    takes = getattr(impl, "supports_quant_query_input", False)
    takes = takes() if callable(takes) else takes
    return target.fp8_dtype if shape.kv_cache_fp8 and takes else getattr(torch, shape.dtype)


def required_line(line: ReleaseLine | None, family: str) -> ReleaseLine:
    """The release line a family of vLLM's kernels is planned for: a vLLM engine always names one
    (`select` plans vLLM's families only under it); None is a caller's mistake."""
    if line is None:
        raise ValueError(f"{family} runs vLLM's own kernels: plan it for a vLLM release line, not None")
    return line


def layer_blocks(needed: int, page_bytes: int, head_bytes: int, storage: StorageClass) -> int:
    """Blocks of a layer's region whose key and value views fall in `storage`'s classes."""
    if storage == "under_2gib":
        return max(needed, 1)
    if storage == "straddles_2gib":
        return max(needed, -(-TWO_GIB // page_bytes))
    return max(needed, -(-(TWO_GIB + head_bytes) // page_bytes))


def layer_kv_cache(config: Any, backend: type, spec: Any, shape: Any, target: Target) -> tuple[Any, int]:
    """Layer 0's KV cache as the runner binds it in a line whose `tracing` is "engine_step": the
    engine's layout resolved by vLLM, its planner's placement of every layer in one allocation,
    and its per-layer view; with the width of the runner's block table. `shape` gives the step's
    `num_seqs`, `max_seq_len`, `kv_cache_storage` and `kv_cache_blocks` (0: as few as
    `layer_blocks` gives).

    Each step is the release's own code wherever it keeps it: the planner moved from
    `kv_cache_utils` to `kv_cache_planning` (0.33), the per-layer view from the runner's
    `_reshape_kv_cache_tensors` to `create_kv_cache_views` (0.29), the block table's width into
    `get_block_table_width` (0.27)."""
    import torch

    from ..vllm.engine_config import cutlass_answered

    interface = import_library_module("vllm.v1.kv_cache_interface")
    # The runner's helpers; their module imports vLLM's model loader, which asks the CUDA build's
    # CUTLASS support at import (`engine_config`: no answer on a builder without the extension).
    with cutlass_answered(target):
        worker = import_library_module("vllm.v1.worker.utils")
    layers = config.model_config.get_num_layers(config.parallel_config)
    names = [LAYER_NAME.replace(".0.", f".{index}.") for index in range(layers)]
    spec = runner_spec(backend, spec, target)
    # The layout the engine core resolves once (0.29) for the backend's spec, before it plans
    # the allocation.
    utils = import_library_module("vllm.v1.attention.backends.utils")
    layout = None
    if hasattr(utils, "resolve_kv_cache_layout"):
        supported = [kind.name for kind in utils.get_supported_kv_cache_layouts([backend])]
        layout = utils.resolve_kv_cache_layout(config, [supported], [spec])
    select_block_size = getattr(worker, "select_common_block_size", None)
    if select_block_size is None:  # up to 0.18: the runner's static method, over its attention groups
        with cutlass_answered(target):
            runner = import_library_module("vllm.v1.worker.gpu_model_runner").GPUModelRunner
        select_block_size = runner.select_common_block_size
    try:
        kernel_block = _call_with(
            select_block_size,
            kv_manager_block_size=spec.block_size,
            backends=[backend],
            kv_cache_specs=[spec],
            attn_groups=[SimpleNamespace(backend=backend)],
        )
    except ValueError as error:
        # The engine refuses the page size at its KV-cache setup (up to 0.18 its selector takes a
        # backend whatever the block size): the user's setting, as the server would say.
        expected = f"a block size vLLM's {backend.get_name()} takes; it says: {str(error).strip()}"
        raise InputError("--block-size", spec.block_size, expected) from error
    width = _block_table_width(config, spec, kernel_block, target)
    needed = -(-shape.max_seq_len // spec.block_size) * shape.num_seqs
    element = torch.empty((), dtype=spec.dtype, device="meta").element_size()
    if shape.kv_cache_blocks:
        blocks = max(needed, shape.kv_cache_blocks)
    else:
        blocks = layer_blocks(needed, spec.page_size_bytes, spec.head_size * element, shape.kv_cache_storage)
    group = interface.KVCacheGroupSpec(names, spec)
    planner = _first_module_with(
        "get_kv_cache_config_from_groups", "vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils"
    )
    kv_config = planner.get_kv_cache_config_from_groups(config, [group], blocks * spec.page_size_bytes * layers)
    if layout is not None:
        [tensor] = kv_config.kv_cache_tensors
        raw = torch.empty(tensor.size, dtype=torch.int8, device="meta")
        views = interface.create_kv_cache_views(
            raw, spec, kv_config.num_blocks, layout, tensor, kernel_block_size=kernel_block
        )
        return views[0], width
    return _runner_views(config, backend, spec, kv_config, names, kernel_block, worker, target)[names[0]], width


def runner_spec(backend: type, spec: Any, target: Target) -> Any:
    """The layer's KV-cache spec as the runner hands it to the allocation and the builder: the
    backend customizes an attention spec there (0.31's ROCM_ATTN packs K and V as two head groups:
    `backend.customize_spec`; a worker's `customize_attention_spec` where the release has one).
    Customizing again leaves it as it is."""
    from ..vllm.engine_config import cutlass_answered

    # The runner's helpers; their module imports vLLM's model loader (`layer_kv_cache`).
    with cutlass_answered(target):
        worker = import_library_module("vllm.v1.worker.utils")
    customize = getattr(worker, "customize_attention_spec", None)
    if customize is not None:
        return customize(backend, spec)
    interface = import_library_module("vllm.v1.kv_cache_interface")
    if hasattr(backend, "customize_spec") and isinstance(spec, interface.AttentionSpec):
        return backend.customize_spec(spec)
    return spec


def _call_with(function: Callable[..., Any], **known: Any) -> Any:
    """`function` called with the arguments of `known` its signature takes (by name); one it
    needs that `known` lacks fails with its name (a release to read)."""
    parameters = inspect.signature(function).parameters
    missing = [
        name
        for name, parameter in parameters.items()
        if name not in known
        and parameter.default is inspect.Parameter.empty
        and name != "self"
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if missing:
        raise TypeError(f"{function.__qualname__} needs {missing[0]!r}, which kprecompile does not fill")
    return function(**{name: value for name, value in known.items() if name in parameters})


def _first_module_with(attribute: str, *modules: str) -> Any:
    """The first of vLLM's `modules` (by name) that holds `attribute`."""
    for name in modules:
        with contextlib.suppress(ImportError):
            module = import_library_module(name)
            if hasattr(module, attribute):
                return module
    raise ImportError(f"vLLM's {attribute} is in none of {', '.join(modules)}")


def _block_table_width(config: Any, spec: Any, kernel_block: int, target: Target) -> int:
    """The width of the runner's block table for the layer group: `get_block_table_width` from
    0.27 (in `kv_cache_interface` from 0.34); before it, the width vLLM's own
    `MultiGroupBlockTable` gives for the runner's arguments (its alignment came and went between
    releases)."""
    import torch

    from ..vllm.engine_config import cutlass_answered

    max_model_len = config.model_config.max_model_len
    with contextlib.suppress(ImportError):
        width = release_attribute("get_block_table_width", ("vllm.v1.kv_cache_interface", "vllm.v1.worker.block_table"))
        return width(-(-max_model_len // kernel_block), kernel_block)
    block_table = import_library_module("vllm.v1.worker.block_table")
    with unpinned_host_memory(), cutlass_answered(target):
        table = _call_with(
            block_table.MultiGroupBlockTable,
            max_num_reqs=1,
            max_model_len=max_model_len,
            max_num_batched_tokens=1,
            pin_memory=False,
            device=torch.device("meta"),
            block_sizes=[spec.block_size],
            kernel_block_sizes=[kernel_block],
            max_num_blocks=[-(-max_model_len // spec.block_size)],
        )
    return table.block_tables[0].max_num_blocks_per_req


def _runner_views(
    config: Any,
    backend: type,
    spec: Any,
    kv_config: Any,
    names: list[str],
    kernel_block: int,
    worker: Any,
    target: Target,
) -> dict[str, Any]:
    """Every layer's KV-cache view as the runner of 0.19 to 0.28 makes it: its own
    `_allocate_kv_cache_tensors` and `_reshape_kv_cache_tensors`, called on a runner that holds
    only what they read (the KV-cache config, the attention group, the cache config)."""
    import torch

    from ..vllm.engine_config import cutlass_answered

    with cutlass_answered(target):
        runner_module = import_library_module("vllm.v1.worker.gpu_model_runner")
    runner = object.__new__(runner_module.GPUModelRunner)
    group = vllm_record(
        worker.AttentionGroup,
        {"backend": backend, "layer_names": names, "kv_cache_spec": spec, "kv_cache_group_id": 0},
    )
    runner.device = torch.device("meta")
    runner.kv_cache_config = kv_config
    runner.cache_config = config.cache_config
    runner.runner_only_attn_layers = set()
    runner.attn_groups = [[group]]
    raw = _call_with(runner._allocate_kv_cache_tensors, kv_cache_config=kv_config)
    return _call_with(
        runner._reshape_kv_cache_tensors,
        kv_cache_config=kv_config,
        kv_cache_raw_tensors=raw,
        kernel_block_sizes=[kernel_block],
    )


def _kv_cache(backend: type, spec: VllmBackend, shape: PagedAttentionShape, element_type: Any, blocks: int) -> Any:
    """The per-layer KV cache as vLLM's runner hands it to the backend: in the shape the backend
    declares (up to 0.18), else the family's view of the release's layout."""
    import torch

    get_shape = getattr(backend, "get_kv_cache_shape", None)
    if get_shape is not None:
        with contextlib.suppress(NotImplementedError):
            dims = get_shape(blocks, shape.block_size, shape.kv_heads, shape.head_size)
            return torch.empty(dims, dtype=element_type, device="meta")
    if spec.layer_view is None:
        raise NotImplementedError(f"{spec.backend_class} declares no KV-cache shape in this vLLM release")
    return spec.layer_view(shape, element_type, blocks)


# vLLM's Triton merge of partial attention results, by module (moved under v1/ in later releases).
TRITON_MERGE_MODULES = ("vllm.v1.attention.ops.triton_merge_attn_states", "vllm.attention.ops.triton_merge_attn_states")
# The merge kernel's count of leading tokens that have cached context (None: every token).
_MERGE_COUNT = "prefill_tokens_with_context"
# The merge's log-sum-exp strides over heads (from 0.27): a [heads, tokens] tensor's head stride
# is its count of tokens (or of the tensor it is a slice of).
_LSE_HEAD_STRIDE = "_lse_head_stride"


@dataclass(frozen=True)
class _Widening:
    """What a launch is launched as well with: the argument positions that vary, every variant's
    arguments (the first as Triton specializes the launch itself), and what else identifies it."""

    varied: set[int | None]
    variants: Callable[[], Iterator[list[Any]]]
    identity: tuple = ()


@contextlib.contextmanager
def _launched_as_well(kernel: Any, name: str, widening: Callable[[tuple], _Widening | None]) -> Iterator[None]:
    """Each launch of `kernel` (its `run`) launched as well with every variant `widening` gives
    for it: untraced, once per launch that differs in anything else (dtypes, strides, flags; the
    varied arguments by their dtype); traced, once per capture for each kernel its first variant
    is, as Triton specializes it (two launches that agree there agree at every variant), however
    many of the plan's steps launch it."""
    original = kernel.run
    widened: set[tuple] = set()

    def run(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        found = widening(args)
        if found is None:
            return result
        capture = active_capture()
        if capture is None:
            done = widened
            identity = tuple(
                getattr(arg, "dtype", None) if position in found.varied else _launch_identity(arg)
                for position, arg in enumerate(args)
            )
        else:
            done = capture.done
            first = next(found.variants())
            identity = (name, capture.key_of(lambda: original(*first, **kwargs)))
        identity += found.identity
        if identity not in done:
            done.add(identity)
            for changed in found.variants():
                if any(new is not old for new, old in zip(changed, args, strict=True)):
                    original(*changed, **kwargs)
        return result

    kernel.run = run
    try:
        yield
    finally:
        del kernel.run


@contextlib.contextmanager
def merges_for_every_token_count(budget: int) -> Iterator[None]:
    """Each Triton merge a step launches, launched as well for the token counts a server meets,
    read from the installed vLLM's merge kernel. Where it takes the count of tokens with context
    as a constexpr (0.20 to 0.26), a server compiles one merge per count: every count from 1 to
    `budget` (the step budget, max-num-batched-tokens). Where the count and the log-sum-exp head
    strides are ordinary integers (from 0.27), Triton specializes each on its class (1, a
    multiple of 16, other), and a log-sum-exp sliced at a token on its address's alignment:
    every combination (`_TokenGroup`). Before 0.20 the merge takes no token count, and this does
    nothing."""
    kernel = None
    for name in TRITON_MERGE_MODULES:
        with contextlib.suppress(ImportError):
            kernel = import_library_module(name).merge_attn_states_kernel
            break
    names = list(getattr(kernel, "arg_names", ()))
    if kernel is None or _MERGE_COUNT not in names:
        yield
        return
    index = names.index(_MERGE_COUNT)
    count_is_constexpr = kernel.params[index].is_constexpr

    def widening(args: tuple) -> _Widening | None:
        if count_is_constexpr:
            # (A count passed by keyword is left as it is.)
            groups = [_TokenGroup(integers=(index,), values=tuple(range(1, budget + 1)))] if len(args) > index else []
        else:
            groups = _token_groups(kernel, names, args, budget)
        if not groups:
            return None
        return _Widening(
            {position for group in groups for position in (*group.integers, *group.tensors)},
            lambda: (
                _with_choices(args, groups, choices) for choices in itertools.product(*(g.choices() for g in groups))
            ),
        )

    with _launched_as_well(kernel, _MERGE_COUNT, widening):
        yield


@dataclass(frozen=True)
class _TokenGroup:
    """Integer arguments of a launch that are one number a server's token counts decide, each
    taking one value per Triton class it can be in, and the log-sum-exp tensors they are the
    head strides of where those are sliced at a token (their address then aligned or not)."""

    integers: tuple[int, ...]
    values: tuple[int, ...]
    tensors: tuple[int, ...] = ()

    def choices(self) -> list[tuple[int, int | None]]:
        alignments = (0, 1) if self.tensors else (None,)
        return [(value, alignment) for value in self.values for alignment in alignments]

    def apply(self, choice: tuple[int, int | None], args: list[Any]) -> None:
        value, alignment = choice
        for position in self.integers:
            if args[position] != value:
                args[position] = value
        for position in self.tensors:
            args[position] = _aligned_or_not(args[position], alignment)


def _with_choices(args: tuple, groups: list[_TokenGroup], choices: Iterable[tuple[int, int | None]]) -> list[Any]:
    """`args` with each group's arguments set to its choice."""
    changed = list(args)
    for group, choice in zip(groups, choices, strict=True):
        group.apply(choice, changed)
    return changed


def _token_groups(kernel: Any, names: list[str], args: tuple, budget: int) -> list[_TokenGroup]:
    """The merge's integer arguments that a server's token counts decide: the count, and each
    log-sum-exp's head stride, tied to the head strides of the same region of memory or of
    contiguous tensors of the same shape (whose head stride is their own token count). A stride
    of 0 (no merged log-sum-exp) and an argument Triton does not specialize stay as they are."""
    values = tuple(value for value in (1, 2, 16) if value <= budget)
    regions: dict[object, tuple[list[int], list[int]]] = {}
    for position, name in enumerate(names[: len(args)]):
        value = args[position]
        if kernel.params[position].is_constexpr or kernel.params[position].do_not_specialize:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value == 0:
            continue
        if name == _MERGE_COUNT:
            regions.setdefault(("count",), ([], []))[0].append(position)
        elif name.endswith(_LSE_HEAD_STRIDE):
            owner = name.removesuffix(_LSE_HEAD_STRIDE) + "_lse"
            tensor = args[names.index(owner)] if owner in names else None
            integers, tensors = regions.setdefault(_memory_region(tensor, position), ([], []))
            integers.append(position)
            # A slice starting past its tensor's first token starts where the step's counts say.
            if tensor is not None and not tensor.is_contiguous() and tensor.storage_offset():
                tensors.append(names.index(owner))
    return [
        _TokenGroup(integers=tuple(integers), values=values, tensors=tuple(tensors))
        for integers, tensors in regions.values()
    ]


def _memory_region(tensor: Any, position: int) -> object:
    """What makes two log-sum-exp tensors' head strides the same number in every step."""
    if tensor is None or not hasattr(tensor, "stride"):
        return ("argument", position)
    if tensor.is_contiguous():
        return ("contiguous", tuple(tensor.shape))
    base = tensor._base if tensor._base is not None else tensor
    return ("view", id(base), tensor.storage_offset(), tuple(tensor.stride()), tuple(tensor.shape))


def _launch_identity(argument: Any) -> Any:
    """What of a launch argument can change the kernel Triton compiles for it."""
    if hasattr(argument, "stride") and hasattr(argument, "dtype"):
        return (argument.dtype, tuple(argument.stride()), argument.storage_offset(), tuple(argument.shape[1:]))
    return argument


# vLLM 0.26 and 0.27's mask of context chunks that cover no keys of some prefill
# (`mask_empty_context`, beside the merge), and the arguments a step's counts decide.
_MASK_KERNEL = "mask_empty_context_kernel"
_MASK_PREFILLS = "num_reqs"
_MASK_LSE_HEAD_STRIDE = "lse_head_stride"
_MASK_CONTEXT_STARTS = "context_start_loc"


@contextlib.contextmanager
def empty_context_masks_for_every_class(serving: ServingParams) -> Iterator[None]:
    """Each launch of vLLM's Triton mask of empty context chunks, launched as well for every
    specialization a server's steps give it, where the installed vLLM has one (0.26 and 0.27:
    `vllm/v1/attention/ops/triton_merge_attn_states.py`, called by `mla_attention.py`'s
    `_compute_prefill_context` on a chunk in which some prefill has no context left). Triton
    specializes its count of prefills (`num_reqs`) and its log-sum-exp's head stride (the step's
    prefill tokens: the context chunk's attention returns it as [heads, tokens]) on their class
    (1, a multiple of 16, other); both come in every pair of classes a step within
    max-num-seqs and max-num-batched-tokens can have (`_mask_classes`: two prefills at least,
    two tokens each). The chunk's context offsets are row `i` of a (chunks, prefills + 1) int32
    table: the first chunk's row is 16-byte aligned, a later chunk's is or is not by the count of
    prefills, so a launch on a later chunk (its row past the table's start) is launched on both
    alignments. Nothing where the release has no such kernel."""
    kernel = None
    for name in TRITON_MERGE_MODULES:
        with contextlib.suppress(ImportError):
            kernel = getattr(import_library_module(name), _MASK_KERNEL, None)
            break
    names = list(getattr(kernel, "arg_names", ()))
    if kernel is None or not {_MASK_PREFILLS, _MASK_LSE_HEAD_STRIDE} <= set(names):
        yield
        return
    prefills_at, stride_at = names.index(_MASK_PREFILLS), names.index(_MASK_LSE_HEAD_STRIDE)
    starts_at = names.index(_MASK_CONTEXT_STARTS) if _MASK_CONTEXT_STARTS in names else None
    pairs = _mask_classes(serving)

    def widening(args: tuple) -> _Widening | None:
        if len(args) <= max(prefills_at, stride_at) or not pairs:
            return None  # (arguments passed by keyword are left as they are)
        starts = args[starts_at] if starts_at is not None and starts_at < len(args) else None
        alignments = (0, 1) if getattr(starts, "storage_offset", lambda: 0)() else (None,)

        def changed(pair: tuple[int, int], alignment: int | None) -> list[Any]:
            new = list(args)
            new[prefills_at], new[stride_at] = pair
            if alignment is not None:
                new[starts_at] = _aligned_or_not(starts, alignment)
            return new

        # Whether its row's alignment varies is part of what identifies the launch.
        return _Widening(
            {prefills_at, stride_at, starts_at},
            lambda: (changed(pair, alignment) for pair in pairs for alignment in alignments),
            (alignments,),
        )

    with _launched_as_well(kernel, _MASK_KERNEL, widening):
        yield


def _mask_classes(serving: ServingParams) -> list[tuple[int, int]]:
    """(prefills, prefill tokens): for each class of the count of prefills a step can have
    (2 and more: one prefill's context chunks are never empty; 16 where max-num-seqs allows),
    the fewest tokens of each class of the token count those prefills can take, two each at
    least (one new token is a decode to MLA's builders), within max-num-batched-tokens."""
    pairs = []
    for prefills in (2, 16):
        least = 2 * prefills
        if prefills > serving.max_num_seqs or least > serving.max_num_batched_tokens:
            continue
        for tokens in (least if least % 16 else least + 1, -(-least // 16) * 16):
            if tokens <= serving.max_num_batched_tokens:
                pairs.append((prefills, tokens))
    return pairs


def _aligned_or_not(tensor: Any, alignment: int) -> Any:
    """`tensor` moved within its storage to a 16-element boundary (16-byte aligned whatever the
    element size) or one element past it (not), near where it starts."""
    offset = tensor.storage_offset() // 16 * 16
    offset += alignment if offset + alignment <= tensor.storage_offset() else -alignment
    if offset == tensor.storage_offset():
        return tensor
    return tensor.as_strided(tuple(tensor.shape), tuple(tensor.stride()), offset)


def vllm_record(record_cls: type, known: dict[str, object]) -> Any:
    """One of vLLM's metadata records (its fields as the release has them) from the values its
    builder computes for the step; a required field this does not know fails the trace with its
    name (a release to read)."""
    arguments = {}
    for field in dataclasses.fields(record_cls):
        if field.name in known:
            arguments[field.name] = known[field.name]
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise TypeError(f"{record_cls.__name__} needs {field.name!r}, which kprecompile does not fill")
    return record_cls(**arguments)


# Where vLLM's `CommonAttentionMetadata` lives: moved in 0.19.
COMMON_METADATA_MODULES = ("vllm.v1.attention.backend", "vllm.v1.attention.backends.utils")
# vLLM's `AttentionType`, by module: moved in 0.19.
ATTENTION_TYPE_MODULES = ("vllm.v1.attention.backend", "vllm.attention.backends.abstract")


def common_metadata_class() -> type:
    """vLLM's `CommonAttentionMetadata`, wherever the installed release keeps it."""
    return release_attribute("CommonAttentionMetadata", COMMON_METADATA_MODULES)


def attention_type() -> Any:
    """vLLM's `AttentionType`, wherever the installed release keeps it."""
    return release_attribute("AttentionType", ATTENTION_TYPE_MODULES)


def common_attention_metadata(
    query_lens: list[int], context_lens: list[int], width: int, max_seq_len: int | None = None
) -> tuple[Any, dict[int, Any]]:
    """vLLM's `CommonAttentionMetadata` for one step, as its model runner fills it (the host-side
    tensors real: builders compute chunks and splits from them; the device ones on meta), and
    the host values of its device tensors for `host_copies`."""
    import torch

    meta = torch.device("meta")
    requests, tokens = len(query_lens), sum(query_lens)
    query_start_loc = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32)
    seq_lens = torch.tensor([q + c for q, c in zip(query_lens, context_lens, strict=True)], dtype=torch.int32)
    computed = torch.tensor(context_lens, dtype=torch.int32)
    device = {
        "query_start_loc": torch.empty(requests + 1, dtype=torch.int32, device=meta),
        "seq_lens": torch.empty(requests, dtype=torch.int32, device=meta),
    }
    record = vllm_record(
        common_metadata_class(),
        {
            **device,
            "query_start_loc_cpu": query_start_loc,
            "seq_lens_cpu": seq_lens,
            "seq_lens_cpu_upper_bound": seq_lens,
            "num_computed_tokens_cpu": computed,
            # 0.19's runner fills the host copies behind its deprecated properties.
            "_seq_lens_cpu": seq_lens,
            "_num_computed_tokens_cpu": computed,
            "num_reqs": requests,
            "num_actual_tokens": tokens,
            "max_query_len": max(query_lens),
            "max_seq_len": max_seq_len or int(seq_lens.max()),
            "block_table_tensor": torch.empty((requests, width), dtype=torch.int32, device=meta),
            "slot_mapping": torch.empty(tokens, dtype=torch.int64, device=meta),
            "causal": True,
        },
    )
    host_values = {id(device["query_start_loc"]): query_start_loc, id(device["seq_lens"]): seq_lens}
    # From 0.19 builders take the context lengths as the record computes them on the device (and
    # remembers them): their host copy is the step's.
    compute_context_lens = getattr(record, "compute_num_computed_tokens", None)
    if compute_context_lens is not None:
        host_values[id(compute_context_lens())] = computed
    return record, host_values


# What the metadata builders of 0.11 to 0.18 set for a step without cascade attention.
_NO_CASCADE = {
    "use_cascade": False,
    "common_prefix_len": 0,
    "cu_prefix_query_lens": None,
    "prefix_kv_lens": None,
    "suffix_kv_lens": None,
}


def backend_impl(backend: type, shape: PagedAttentionShape, kv_cache_dtype: str) -> Any:
    """The backend's impl for the step's layer, built with the arguments vLLM's `Attention` gives it."""
    return backend.get_impl_cls()(
        shape.q_heads,
        shape.head_size,
        shape.head_size**-0.5,
        shape.kv_heads,
        None,
        shape.sliding_window or None,
        kv_cache_dtype,
        **layer_arguments(shape),
    )


def backend_step(spec: VllmBackend, shape: PagedAttentionShape, target: Target) -> None:
    """One step through the backend's real `forward` on meta tensors."""
    import torch

    from ..platforms.vllm_platform import refresh_switches

    module = import_library_module(spec.module)
    backend = getattr(module, spec.backend_class)
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    # vLLM allocates an FP8 KV cache as bytes and views it as the platform's FP8 type.
    element_type = torch.uint8 if shape.kv_cache_fp8 else dtype
    element = torch.empty((), dtype=element_type, device=meta).element_size()
    per_block = 2 * shape.block_size * shape.kv_heads * shape.head_size * element
    needed = -(-shape.max_seq_len // shape.block_size) * shape.num_seqs
    kv_cache = _kv_cache(backend, spec, shape, element_type, block_count(needed, per_block, shape.kv_cache_storage))
    impl = backend_impl(backend, shape, "fp8" if shape.kv_cache_fp8 else "auto")
    query_shape = (shape.tokens, shape.q_heads, shape.head_size)
    query = torch.empty(query_shape, dtype=query_type(impl, shape, target), device=meta)
    key = torch.empty((shape.tokens, shape.kv_heads, shape.head_size), dtype=dtype, device=meta)
    layer = kv_scales_layer()
    metadata = vllm_record(
        getattr(module, spec.metadata_class),
        {
            **_NO_CASCADE,
            "num_actual_tokens": shape.tokens,
            "max_query_len": shape.max_query_len,
            "query_start_loc": torch.empty(shape.num_seqs + 1, dtype=torch.int32, device=meta),
            "max_seq_len": shape.max_seq_len,
            "seq_lens": torch.empty(shape.num_seqs, dtype=torch.int32, device=meta),
            "block_table": torch.empty((shape.num_seqs, shape.max_blocks_per_seq), dtype=torch.int32, device=meta),
            "slot_mapping": torch.empty(shape.tokens, dtype=torch.int64, device=meta),
        },
    )
    # vLLM's rules read its switches (environment flags) at import: read them for this step.
    refresh_switches()
    # In the model's dtype, not the query's: vLLM's `Attention.forward` allocates it before it
    # quantizes the query to FP8 (`output_dtype = query.dtype`, 0.11 and 0.12).
    output = torch.empty(query_shape, dtype=dtype, device=meta)
    with prebuilt_ops_skipped(spec.prebuilt_ops):
        impl.forward(layer, query, key, torch.empty_like(key), kv_cache, metadata, output=output)


@dataclass(frozen=True)
class PagedEngineStep(PagedAttentionShape):
    """An engine step (a line whose `tracing` is "engine_step"), whose metadata builder and
    KV-cache layout read the engine's configuration: the model's config.json and the serving
    parameters it is built from."""

    config_json: str = ""
    serving: ServingParams | None = None
    # Blocks in each layer's region (vLLM sizes it from the GPU's free memory); 0: as few as the
    # step needs that put the layer in `kv_cache_storage`'s class.
    kv_cache_blocks: int = 0


def layer_view_storage_classes(model: ModelConfig, serving: ServingParams) -> tuple[StorageClass, ...]:
    """In an engine step (from 0.19) vLLM bounds the KV cache's key and value views on ROCm by the
    end of the layer's region (`set_triton_ptr_range`), which is what Triton's buffer-ops
    specialization then reads: the value view starts one head later, so a layer of whole blocks
    that ends within one head's bytes past 2 GiB gives keys over and values within
    ("straddles_2gib"). vLLM's default layout gives every layer a region of its own
    (layer-compact)."""
    element = 1 if serving.kv_cache_is_fp8 else 2
    head_bytes = model.head_dim * element
    page = 2 * serving.block_size * serving.kv_heads_per_rank(model) * head_bytes
    first_over = -(-TWO_GIB // page) * page
    straddles: tuple[StorageClass, ...] = ("straddles_2gib",) if first_over <= TWO_GIB - 1 + head_bytes else ()
    return (*KV_CACHE_STORAGE_CLASSES, *straddles)


def engine_step(spec: VllmBackend, shape: PagedEngineStep, target: Target) -> None:
    """One engine step: the engine's configuration with this backend (one per backend, as each
    server has: from 0.29 the engine records the KV layout it resolves for its backend in the
    configuration, which a configuration shared with another backend would then impose on
    it), the layer's KV-cache spec (the `Attention`
    layer's own method), the layer's view of the engine's KV cache (`layer_kv_cache`), the metadata
    built by the backend's real builder, then the impl's KV-cache write where the layer makes it
    apart from `forward` (`forward_includes_kv_cache_update`), and `forward`."""
    import torch

    from ..platforms.vllm_platform import refresh_switches
    from ..vllm.engine_config import engine_config

    assert shape.serving is not None
    backend = getattr(import_library_module(spec.module), spec.backend_class)
    config = engine_config(shape.config_json, shape.serving, target, backend.get_name())
    torch_utils = import_library_module("vllm.utils.torch_utils")
    meta = torch.device("meta")
    dtype = getattr(torch, shape.dtype)
    kv_cache_dtype = shape.serving.kv_cache_dtype if shape.kv_cache_fp8 else "auto"
    sliding_window = shape.sliding_window or None
    refresh_switches()
    with import_library_module("vllm.config").set_current_vllm_config(config):
        # The layer's own KV-cache spec (its method, on the fields it reads).
        layer_fields = SimpleNamespace(
            attn_type=attention_type().DECODER,
            kv_cache_dtype=kv_cache_dtype,
            sliding_window=sliding_window,
            attn_backend=backend,
            num_kv_heads=shape.kv_heads,
            head_size=shape.head_size,
            head_size_v=shape.head_size,
            kv_cache_torch_dtype=torch_utils.kv_cache_dtype_str_to_dtype(kv_cache_dtype, config.model_config),
        )
        kv_spec = attention_class().get_kv_cache_spec(layer_fields, config)
        kv_spec = runner_spec(backend, kv_spec, target)
        kv_cache, width = layer_kv_cache(config, backend, kv_spec, shape, target)
        builder = backend.get_builder_cls()(kv_spec, [LAYER_NAME], config, meta)

        def ints(*dims: int, dtype: Any = torch.int32) -> Any:
            return torch.empty(dims, dtype=dtype, device=meta)

        common = vllm_record(
            common_metadata_class(),
            {
                "query_start_loc": ints(shape.num_seqs + 1),
                "query_start_loc_cpu": torch.empty(shape.num_seqs + 1, dtype=torch.int32),
                "seq_lens": ints(shape.num_seqs),
                "num_reqs": shape.num_seqs,
                "num_actual_tokens": shape.tokens,
                "max_query_len": shape.max_query_len,
                "max_seq_len": shape.max_seq_len,
                "block_table_tensor": ints(shape.num_seqs, width),
                "slot_mapping": ints(shape.tokens, dtype=torch.int64),
                "causal": True,
            },
        )
        metadata = builder.build(0, common)
        impl = backend_impl(backend, shape, kv_cache_dtype)
    query = torch.empty(
        (shape.tokens, shape.q_heads, shape.head_size), dtype=query_type(impl, shape, target), device=meta
    )
    key = torch.empty((shape.tokens, shape.kv_heads, shape.head_size), dtype=dtype, device=meta)
    layer = kv_scales_layer()
    output = torch.empty((shape.tokens, shape.q_heads, shape.head_size), dtype=dtype, device=meta)
    with prebuilt_ops_skipped(spec.prebuilt_ops):
        layer_step(backend, impl, layer, (query, key, torch.empty_like(key)), kv_cache, metadata, output)


def layer_step(backend: type, impl: Any, layer: Any, qkv: tuple, kv_cache: Any, metadata: Any, output: Any) -> None:
    """One attention layer's step as vLLM's runner makes it: from 0.19 the impl's own KV-cache
    write before `forward`, where the backend says `forward` leaves it out."""
    query, key, value = qkv
    if hasattr(impl, "do_kv_cache_update") and not getattr(backend, "forward_includes_kv_cache_update", True):
        impl.do_kv_cache_update(layer, key, value, kv_cache, metadata.slot_mapping)
    impl.forward(layer, query, key, value, kv_cache, metadata, output=output)


def launch_step(spec: VllmBackend, shape: PagedAttentionShape, target: Target) -> None:
    """The engine's own step where the shape is one (`PagedEngineStep`), else the call site."""
    if isinstance(shape, PagedEngineStep):
        engine_step(spec, shape, target)
    else:
        backend_step(spec, shape, target)


def vllm_backend_family(
    name: FamilyName,
    description: str,
    backend: VllmBackend,
    enumerate_shapes: Callable[[ModelConfig, ServingParams, ReleaseLine | None], tuple[PagedAttentionShape, ...]],
    describe_shapes: Callable[[tuple[PagedAttentionShape, ...]], dict[str, object]],
    limits: Callable[[ModelConfig, ServingParams, Target, ReleaseLine | None], str | None],
) -> KernelFamily[PagedAttentionShape]:
    """A family of steps through `backend`: its call and its modules are the backend's."""
    return KernelFamily(
        name=name,
        description=description,
        library=VLLM_DISTRIBUTION,
        # The backend and its kernels, which read the platform at import (not `vllm._custom_ops`,
        # see `prebuilt_ops_skipped`, nor `vllm._aiter_ops`, which registers torch operators at
        # import: its switches are read again for each step).
        traced_modules=(backend.module, *VLLM_ATTENTION_OPS),
        enumerate_shapes=enumerate_shapes,
        describe_shapes=describe_shapes,
        describe_call=describe_call,
        launch=functools.partial(launch_step, backend),
        limits=limits,
    )
