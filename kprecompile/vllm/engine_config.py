"""vLLM's own configuration for a model and serving parameters, built as `vllm serve` builds it.

Some of vLLM's attention implementations read the engine's configuration when they are built:
the families traced through them get a `VllmConfig` from vLLM's `EngineArgs` (a temporary model
directory with only config.json; no weights, no tokenizer), under the target's platform, once
per (model, serving, target) in a process. Why speculative decoding uses `ngram` and how CUTLASS
queries are answered on NVIDIA targets: docs/engine-kernels.md, "vLLM's configuration on a builder".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..inputs import settings
from ..inputs.serving import ServingParams
from ..inputs.targets import Target

_TORCH_DTYPES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16", "torch.float32": "float32"}
# Model directories live as long as the process: vLLM's config keeps their path.
_MODEL_DIRS: list[tempfile.TemporaryDirectory] = []
# Where each model keeps its own code, by its config's text (families hand on the text only).
_CODE_DIRECTORIES: dict[str, str] = {}


def remember_model_directory(config_json: str, directory: str | None) -> None:
    """The directory of the model whose config is `config_json`: with --trust-remote-code, vLLM's
    config is built from the model's own code there (its `auto_map` names the files)."""
    if directory is not None:
        _CODE_DIRECTORIES[config_json] = directory


def engine_config(
    config_json: str, serving: ServingParams, target: Target, attention_backend: str | None = None
) -> Any:
    """vLLM's `VllmConfig` for this model and these serving parameters under the process's vLLM
    flags (vLLM imported under the target's platform: `libraries.import_library_module`), with
    `attention_backend` as `vllm serve --attention-backend` takes it (up to 0.18 the caller sets
    VLLM_ATTENTION_BACKEND instead)."""
    flags = tuple(sorted((name, value) for name, value in os.environ.items() if name.startswith("VLLM_")))
    return _engine_config(config_json, serving, target, flags, attention_backend)


def serving_from_vllm(vllm_config: Any) -> ServingParams:
    """The serving parameters vLLM resolved in `vllm_config`: its defaults, its platform's and its
    model class's rules (gpt-oss captures graphs up to 1024 tokens whatever --max-num-seqs says)
    applied to the flags. Raises InputError where kprecompile cannot plan what vLLM resolved."""
    model_config = vllm_config.model_config
    dtype = _TORCH_DTYPES.get(str(model_config.dtype), str(model_config.dtype))
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    speculative = getattr(vllm_config, "speculative_config", None)
    capture_sizes = getattr(vllm_config.compilation_config, "cudagraph_capture_sizes", None) or ()
    enforce_eager = bool(model_config.enforce_eager) or not capture_sizes
    return ServingParams(
        tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        max_model_len=model_config.max_model_len,
        block_size=vllm_config.cache_config.block_size,
        kv_cache_dtype="auto" if cache_dtype in ("auto", dtype) else cache_dtype,
        dtype=dtype,
        cudagraph_capture_sizes=None if enforce_eager else tuple(capture_sizes),
        enforce_eager=enforce_eager,
        num_speculative_tokens=(speculative.num_speculative_tokens or 0) if speculative is not None else 0,
        trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
    )


@functools.cache
def _engine_config(
    config_json: str, serving: ServingParams, target: Target, flags: tuple, attention_backend: str | None
) -> Any:
    from ..platforms.vllm_platform import target_imports
    from ..tracing.libraries import aiter_hip_absent, import_library_module, installed_aiter_without_hip

    EngineArgs = import_library_module("vllm.engine.arg_utils").EngineArgs  # noqa: N806

    directory = tempfile.TemporaryDirectory(prefix="kprecompile-model-")
    _MODEL_DIRS.append(directory)
    Path(directory.name, "config.json").write_text(config_json)
    code = _CODE_DIRECTORIES.get(config_json)
    if serving.trust_remote_code and code is not None:
        # transformers imports a local model's own code from beside its config.json.
        for source in Path(code).glob("*.py"):
            shutil.copyfile(source, Path(directory.name, source.name))
    arguments: dict[str, Any] = {
        "model": directory.name,
        "skip_tokenizer_init": True,
        "load_format": "dummy",
        "tensor_parallel_size": serving.tensor_parallel_size,
        "max_num_seqs": serving.max_num_seqs,
        "max_num_batched_tokens": serving.max_num_batched_tokens,
        "max_model_len": serving.max_model_len,
        "block_size": serving.block_size,
        "kv_cache_dtype": serving.kv_cache_dtype,
        "dtype": serving.dtype,
        "enforce_eager": serving.enforce_eager,
        "trust_remote_code": serving.trust_remote_code,
    }
    names = {field.name for field in dataclasses.fields(EngineArgs)}
    if attention_backend is not None and "attention_backend" in names:
        arguments["attention_backend"] = attention_backend
    if serving.num_speculative_tokens:
        # The lightest method vLLM accepts without a draft model (see the module doc).
        arguments["speculative_config"] = {"method": "ngram", "num_speculative_tokens": serving.num_speculative_tokens}
    if serving.cudagraph_capture_sizes is not None:
        # `cuda_graph_sizes` up to 0.18 (beside `cudagraph_capture_sizes`), gone by 0.33.
        option = "cuda_graph_sizes" if "cuda_graph_sizes" in names else "cudagraph_capture_sizes"
        arguments[option] = list(serving.cudagraph_capture_sizes)
    if not target.is_rocm and serving.tensor_parallel_size > 1:
        # vLLM's CUDA platform checks that the ranks fit the GPUs it sees (none on a builder)
        # before it picks its executor: on the serving host they fit, and it picks "mp".
        arguments["distributed_executor_backend"] = "mp"
    # CPU swap space per rank is checked against this host's memory, which a builder's is not.
    if "swap_space" in names:
        arguments["swap_space"] = 0
    # transformers warns about config fields it validates more strictly than the model's authors wrote them.
    transformers_logger = logging.getLogger("transformers")
    level = transformers_logger.level
    transformers_logger.setLevel(logging.ERROR)
    try:
        # A quantized model's config imports vLLM's quantization configs, some of which try AITER's HIP ops;
        # vLLM inspects the model's class (its modules import as on the target's host: `target_imports`).
        with (
            plugin_hook_off(),
            target_imports(target),
            aiter_hip_absent(),
            cutlass_answered(target),
            models_inspected_here(),
        ):
            installed_aiter_without_hip()
            engine_args = EngineArgs(**{name: value for name, value in arguments.items() if name in names})
            try:
                return engine_args.create_engine_config()
            except Exception as error:
                if serving.trust_remote_code or "trust_remote_code" not in str(error):
                    raise
                # As `vllm serve` without the flag: the model's own code is not run.
                raise InputError(
                    "--trust-remote-code",
                    "not given",
                    "the flag: the model's config names its own code (auto_map), which vLLM runs only "
                    "with --trust-remote-code",
                ) from error
    finally:
        transformers_logger.setLevel(level)


@contextlib.contextmanager
def plugin_hook_off() -> Iterator[None]:
    """kprecompile's vLLM plugin does nothing in the block: vLLM loads its plugins while
    kprecompile builds vLLM's objects in its own process, where no hook must act."""
    saved = os.environ.get(settings.VLLM_HOOK.name)
    os.environ[settings.VLLM_HOOK.name] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(settings.VLLM_HOOK.name, None)
        else:
            os.environ[settings.VLLM_HOOK.name] = saved


@contextlib.contextmanager
def models_inspected_here() -> Iterator[None]:
    """vLLM inspects a model's class in a subprocess of its own (`_run_in_subprocess`, to keep CUDA
    out of its parent), which has none of the builder's stand-ins (AITER without HIP, the target's
    platform): 0.13 to 0.16 import AITER at the top of `vllm._aiter_ops`, so there every model
    "failed to be inspected". kprecompile's process is already the one vLLM's configuration is
    built for, with no GPU: the class is inspected in it (also saving a Python start and vLLM's import)."""
    from ..tracing.libraries import import_library_module

    registry = import_library_module("vllm.model_executor.models.registry")
    saved = getattr(registry, "_run_in_subprocess", None)
    if saved is None:
        yield
        return
    registry._run_in_subprocess = _run_here
    try:
        yield
    finally:
        registry._run_in_subprocess = saved


def _run_here(function: Any) -> Any:
    return function()


# vLLM's CUTLASS capability queries and the smallest compute capability each answers yes for, as
# its extension answers on the GPU (`csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu`, in the
# CUDA 12.8+ builds vLLM releases): FP8 from sm89, block FP8, grouped and sparse GEMMs from sm90.
CUTLASS_FROM_CAPABILITY = {
    "cutlass_scaled_mm_supports_fp8": 89,
    "cutlass_scaled_mm_supports_block_fp8": 90,
    "cutlass_group_gemm_supported": 90,
    "cutlass_sparse_scaled_mm_supported": 90,
}


def cutlass_answer(first: int, capability: int) -> bool:
    """Whether a CUTLASS query built for `first` and newer answers yes for `capability`."""
    return capability >= first


@contextlib.contextmanager
def cutlass_answered(target: Target) -> Iterator[None]:
    """See the module doc: on an NVIDIA target whose vLLM extension cannot be loaded here, vLLM's
    CUTLASS capability queries answer in the block as the extension answers on the target's GPU."""
    import torch

    from ..tracing.libraries import import_library_module

    ops = import_library_module("vllm._custom_ops")
    if target.is_rocm or hasattr(torch.ops._C, next(iter(CUTLASS_FROM_CAPABILITY))):
        yield
        return
    saved = {name: getattr(ops, name) for name in CUTLASS_FROM_CAPABILITY if hasattr(ops, name)}
    for name in saved:
        setattr(ops, name, functools.partial(cutlass_answer, CUTLASS_FROM_CAPABILITY[name]))
    try:
        yield
    finally:
        for name, query in saved.items():
            setattr(ops, name, query)
