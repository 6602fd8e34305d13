"""The vLLM plugin in a server on an NVIDIA H200 (sm90), inside each real vLLM release, in a process of
its own: it plans what vLLM resolved for the local GPU under vLLM's CUDA rules, not its ROCm ones.

After the plugins load, vLLM runs under its CUDA platform for sm90 (a stand-in of the GPU's device
queries), as an H200 server's vLLM has it from the start; the hook's target is the one an sm90
worker detects (no GPU here). Two servers of a model directory holding
Llama-3.1-8B's config.json:

1. `--attention-backend TRITON_ATTN` (VLLM_ATTENTION_BACKEND up to 0.18): vLLM builds its config
   and its own `Attention` layer, which resolves the backend; the hook, after the model is built,
   plans what that layer runs on sm90, warms it in the background, joins it, and preloads it.
2. No backend named, on an H200 vLLM's CUDA default: FLASH_ATTN. Its backend module needs vLLM's
   flash-attention build, which cannot load here (vLLM's selector then falls back to TRITON_ATTN),
   so the model's layer is one that reports FLASH_ATTN, as vLLM's layers report their backend.
   The hook says in one line that nothing runs through Triton there, instead of failing.
"""

from __future__ import annotations

import os
from importlib import resources

import pytest
import torch
from release_support import bind_platform, load_plugins_on
from vllm_releases import since

from kprecompile.inputs.targets import TARGETS
from kprecompile.platforms.vllm_platform import cuda_platform, target_imports
from kprecompile.serve.vllm.plugin import loader_hook
from kprecompile.vllm.engine_config import models_inspected_here
from kprecompile.warmup.manifest_key import find_manifest

pytestmark = [pytest.mark.vllm, pytest.mark.compiles, pytest.mark.slow, pytest.mark.vllm_process("nvidia-plugin")]

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


def run_probe(model_dir: str) -> dict[str, object]:
    load_plugins_on(SM90)
    hook = loader_hook()
    # The model's class inspected in this process (0.13 to 0.16's inspection subprocess imports
    # the builder's AITER without its stand-ins).
    with cuda_platform(SM90), models_inspected_here():
        bind_platform()
        hook.target = SM90  # no GPU here: the target an H200 worker detects
        return {"triton": server(model_dir, hook, "TRITON_ATTN"), "default": server(model_dir, hook, None)}


@pytest.fixture(scope="module")
def nvidia_servers(tmp_path_factory):
    """Both servers, the plugin loaded by vLLM in this process (its cache named by
    KPRECOMPILE_CACHE_DIR, AITER's JIT directory left for the plugin to set)."""
    model_dir = tmp_path_factory.mktemp("llama")
    (model_dir / "config.json").write_text(
        (resources.files("kprecompile.inputs.presets") / "llama-3.1-8b-instruct.json").read_text()
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KPRECOMPILE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        patch.delenv("AITER_JIT_DIR", raising=False)
        return run_probe(str(model_dir))


def test_a_triton_attn_server_on_an_h200_plans_warms_and_preloads_sm90_kernels(nvidia_servers, release):
    """`--attention-backend TRITON_ATTN`: vLLM's own layer resolves TRITON_ATTN; the hook plans it
    for sm90 under vLLM's CUDA rules (one sequence: reshape-and-cache, the 2D and 3D kernel, the
    reduce), warms it beside the load and loads exactly those kernels after it."""
    server = nvidia_servers["triton"]
    assert server["layer_backend"] == server["selected"] == "TRITON_ATTN" and server["targets"] == ["sm90"]
    assert server["families"] == {"triton_attn": None} and server["started_background"]
    not_warm, joined, loaded = server["events"]
    assert "(TRITON_ATTN) is not warm on sm90: warming" in not_warm
    assert joined.startswith("background warm: 4 kernels (4 compiled, 0 cached) in ")
    unified = (
        ["kernel_unified_attention"] * 2
        if since(release, "0.20")  # one kernel for both paths from 0.20
        else ["kernel_unified_attention_2d", "kernel_unified_attention_3d"]
    )
    assert server["manifest_kernels"] == sorted([*unified, "reduce_segments", "reshape_and_cache_kernel_flash"])
    # Loading a CUDA binary needs the CUDA driver, which this machine lacks: the hook reached all
    # four of the configuration's kernels, and nothing compiled in the process.
    assert "(4 could not be loaded: " in loaded and "libcuda.so cannot found" in loaded
    assert loaded.endswith("; 0 kernels compiled in this process since it started")


def test_a_flash_attn_server_on_an_h200_says_nothing_compiles_ahead(nvidia_servers):
    """vLLM's CUDA default on sm90 is FLASH_ATTN (prebuilt kernels): the hook plans under vLLM's
    CUDA rules and says why nothing compiles, instead of rejecting a backend ROCm does not have."""
    server = nvidia_servers["default"]
    assert server["selected"] == "FLASH_ATTN" and server["targets"] == ["sm90"]
    assert not server["started_background"] and server["manifest_kernels"] is None
    reason = (
        "FLASH_ATTN runs vLLM's prebuilt flash-attention build (vllm_flash_attn), not Triton: kprecompile plans "
        "Triton kernels (--attention-backend TRITON_ATTN runs vLLM's own)"
    )
    assert server["families"] == {"triton_attn": reason}
    said, loaded = server["events"]
    assert said.endswith(f"(FLASH_ATTN) on sm90: nothing to compile ahead ({reason})")
    assert loaded == "0 kernels compiled in this process since it started"
