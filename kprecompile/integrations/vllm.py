"""vLLM plugin: the loader hook, called on every worker with vLLM's own config.

Installed as a `vllm.general_plugins` entry point, so installing kprecompile next to vLLM is
the whole setup. vLLM calls `register` in each process it starts; it wraps the GPU model
runner's `load_model` so that, once the weights are loaded, `kprecompile.hook.prepare` runs
with the configuration vLLM itself resolved (model config, tensor parallelism, scheduler
limits, KV cache, graphs, speculative decoding, attention backend): what the cache was warmed
for is then exactly what this process will launch. `KPRECOMPILE_VLLM_HOOK=0` turns it off; a
failure inside the hook is logged and never stops the server.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from .. import settings
from ..engines import Selection, select
from ..errors import InputError
from ..models import ModelConfig, model_from_dict
from ..serving import ServingParams

logger = logging.getLogger(__name__)
_DTYPE_NAMES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16", "bfloat16": "bfloat16", "float16": "float16"}


def from_vllm_config(vllm_config: Any) -> tuple[ModelConfig, ServingParams, Selection]:
    """The model, serving parameters and engine selection of a vLLM `VllmConfig`."""
    model_config = vllm_config.model_config
    raw = dict(model_config.hf_config.to_dict())
    if "torch_dtype" not in raw and raw.get("dtype") is not None:
        raw["torch_dtype"] = str(raw["dtype"]).removeprefix("torch.")
    model = model_from_dict(raw, name=str(model_config.model), source=f"vLLM config of {model_config.model}")
    dtype = _DTYPE_NAMES.get(str(model_config.dtype), str(model_config.dtype))
    cache_dtype = vllm_config.cache_config.cache_dtype
    if cache_dtype in ("auto", dtype):
        cache_dtype = "auto"
    speculative = getattr(vllm_config, "speculative_config", None)
    enforce_eager = bool(model_config.enforce_eager)
    capture_sizes = getattr(vllm_config.compilation_config, "cudagraph_capture_sizes", None)
    serving = ServingParams(
        tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        max_model_len=model_config.max_model_len,
        block_size=vllm_config.cache_config.block_size,
        kv_cache_dtype=cache_dtype,
        dtype=dtype,
        cudagraph_capture_sizes=None if enforce_eager or not capture_sizes else tuple(capture_sizes),
        enforce_eager=enforce_eager,
        num_speculative_tokens=(speculative.num_speculative_tokens or 0) if speculative is not None else 0,
    )
    return model, serving, select(model, "vllm", _attention_backend(vllm_config))


def _attention_backend(vllm_config: Any) -> str | None:
    """--attention-backend (newer vLLM keeps it in attention_config), else the environment's."""
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if backend is None:
        return None
    return getattr(backend, "name", str(backend))


def prepare_for_vllm(vllm_config: Any, rank: int) -> Any:
    """Run the hook for one vLLM worker; never raises (the server must start regardless)."""
    from ..hook import prepare

    try:
        model, serving, selection = from_vllm_config(vllm_config)
        ranks = min(serving.tensor_parallel_size, _local_gpus())
        report = prepare(model, serving, selection=selection, rank=rank, local_world_size=ranks)
        if rank == 0:
            loaded = report.preload.loaded if report.preload else 0
            logger.info("kprecompile: %s ready (%d kernels preloaded) in %.1f s", model.name, loaded, report.seconds)
        return report
    except Exception as error:  # the hook must never stop the server
        logger.warning("kprecompile: hook skipped: %s: %s", type(error).__name__, error)
        return None


def _local_gpus() -> int:
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except Exception:
        return 1


def register() -> None:
    """The `vllm.general_plugins` entry point."""
    try:
        if not settings.VLLM_HOOK.read():
            return
    except InputError as error:  # the server must start regardless
        logger.warning("kprecompile: %s; the hook stays on", error)
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError as error:
        logger.debug("kprecompile: vLLM's GPU model runner is not importable (%s); no hook", error)
        return
    original = GPUModelRunner.load_model
    if getattr(original, "_kprecompile_hook", False):
        return

    @functools.wraps(original)
    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        device = getattr(self, "device", None)
        prepare_for_vllm(self.vllm_config, getattr(device, "index", None) or 0)
        return result

    load_model._kprecompile_hook = True
    GPUModelRunner.load_model = load_model
