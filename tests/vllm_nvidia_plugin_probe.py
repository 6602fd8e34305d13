"""Run inside a real vLLM release (PYTHONPATH=.vllm/<version>:tests): the plugin in a vLLM server on
an NVIDIA H200 (sm90). Prints one JSON document.

    python vllm_nvidia_plugin_probe.py MODEL_DIR CACHE_DIR

After the plugins load, vLLM runs under its CUDA platform for sm90 (a stand-in of the GPU's device
queries), as an H200 server's vLLM has it from the start; the hook's target is the one an sm90
worker detects (no GPU here). Two servers of MODEL_DIR (Llama-3.1-8B's config.json):

1. `--attention-backend TRITON_ATTN` (VLLM_ATTENTION_BACKEND up to 0.18): vLLM builds its config
   and its own `Attention` layer, which resolves the backend; the hook, after the model is built,
   plans what that layer runs on sm90, warms it in the background, joins it, and preloads it.
2. No backend named, on an H200 vLLM's CUDA default: FLASH_ATTN. Its backend module needs vLLM's
   flash-attention build, which cannot load here (vLLM's selector then falls back to TRITON_ATTN),
   so the model's layer is one that reports FLASH_ATTN, as vLLM's layers report their backend.
   The hook says in one line that nothing runs through Triton there, instead of failing.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from vllm_probe import _bind_platform

from kprecompile.inputs.targets import TARGETS
from kprecompile.platforms.vllm_platform import cuda_platform, target_imports
from kprecompile.serve.vllm.plugin import loader_hook
from kprecompile.warmup.manifest_key import find_manifest

SM90 = TARGETS["sm90"]


class _FlashAttentionLayer(torch.nn.Module):
    """What the hook reads from a layer vLLM built with FLASH_ATTN: its backend's name."""

    class attn_backend:  # noqa: N801 - mirrors vLLM's attribute
        @staticmethod
        def get_name() -> str:
            return "FLASH_ATTN"


def server(model_dir: str, hook, backend: str | None) -> dict[str, object]:
    """One server's load as the hook sees it: vLLM's config, a model of vLLM's own attention layer
    (the backend named resolved as vLLM resolves it; none named: FLASH_ATTN's, see the module doc),
    then the three moments the hook acts at."""
    import vllm
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    named = {}
    if backend is not None:
        if vllm.__version__.startswith(("0.11", "0.12")):
            os.environ["VLLM_ATTENTION_BACKEND"] = backend
        else:
            named["attention_backend"] = backend
    config = EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        max_model_len=4096,
        max_num_seqs=1,
        max_num_batched_tokens=4096,
        **named,
    ).create_engine_config()
    try:
        from vllm.model_executor.layers.attention import Attention
    except ImportError:  # up to 0.18
        from vllm.attention.layer import Attention
    model = torch.nn.Module()
    if backend is None:
        model.attn = _FlashAttentionLayer()
    else:
        with target_imports(SM90), set_current_vllm_config(config):
            model.attn = Attention(
                32,
                128,
                128**-0.5,
                num_kv_heads=8,
                cache_config=config.cache_config,
                prefix="model.layers.0.self_attn.attn",
            )
    os.environ.pop("VLLM_ATTENTION_BACKEND", None)
    hook.request, hook.background, hook.events = None, None, []
    hook._model_built(model, (), {"vllm_config": config})
    request = hook.request
    started = hook.background is not None
    hook._before_weights_processed((), {})
    hook._model_loaded(None, (), {})
    lookup = request and find_manifest(request, SM90, hook.layout, remember=False)
    manifest = lookup.manifest if lookup else None
    return {
        "manifest_kernels": sorted(job.kernel.rpartition(":")[2] for job in manifest.jobs) if manifest else None,
        "layer_backend": model.attn.attn_backend.get_name(),
        "selected": request.selection.attention_backend if request else None,
        "targets": [target.name for target in request.targets] if request else [],
        "families": {choice.family: choice.skip_reason for choice in request.selection.choices} if request else {},
        "started_background": started,
        "events": list(hook.events),
    }


def main(model_dir: str, cache_dir: str) -> None:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    hook = loader_hook()
    with cuda_platform(SM90):
        _bind_platform()
        hook.target = SM90  # no GPU here: the target an H200 worker detects
        document = {"triton": server(model_dir, hook, "TRITON_ATTN"), "default": server(model_dir, hook, None)}
    print(json.dumps(document))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
