"""ROCM_AITER_FA with sliding windows, built as vLLM builds it: vLLM's own layers in the forward
context its metadata builder reads (0.12 takes its window there), one builder per layer kind.

0.12 decodes a windowed layer through AITER's Triton unified attention; 0.11 passes the window to
AITER's prebuilt attention; from 0.19 a layer with sinks decodes through unified attention.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import engine_steps
import pytest
from release_support import aiter_lacked_by
from vllm_releases import since

from kprecompile.errors import InputError
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.request import resolve_requests
from kprecompile.shapes import FAMILIES, aiter_fa_context
from kprecompile.shapes._paged_kv import KV_CACHE_STORAGE_CLASSES
from kprecompile.shapes.aiter_fa_context import BACKEND_MODULE as AITER_FA_MODULE
from kprecompile.tracing.trace import trace_calls
from kprecompile.vllm.releases import release_line
from kprecompile.warmup.planning import plan, planned_shapes

MODELS = Path(__file__).parent.parent / "models"
GEMMA = str(MODELS / "gemma-2-2b-it.json")
GPT_OSS = str(MODELS / "gpt-oss-20b-bf16.json")
SERVING = ServingParams(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=2048)
GFX942 = TARGETS["gfx942"]
UNIFIED = "kernel_unified_attention_2d"
STEPS = 40
CONTEXT = FAMILIES["aiter_fa_context"]


def _request(spec: str):
    [request] = resolve_requests(
        [spec], SERVING, ["gfx942"], engine="vllm", attention_backend="ROCM_AITER_FA", families=["aiter_fa_context"]
    )
    return request


def _lacking_aiter_is_planned_as_such(spec: str) -> bool:
    """Where the installed AITER lacks a module the release's ROCM_AITER_FA imports (0.31.0:
    AITER's Gluon paged decode; a ROCm server's own AITER has it), the plan fails the family
    naming that module and compiles nothing for it; True there."""
    lacking = aiter_lacked_by(AITER_FA_MODULE)
    if lacking is None:
        return False
    row, kernels = _planned(spec)
    assert not kernels and f"without {lacking}: ROCM_AITER_FA imports" in (row.error or ""), row
    return True


def _planned(spec: str) -> tuple[object, dict[str, str]]:
    """The family's row and its kernels (key to name), with the layers vLLM's own model gives."""
    result = plan(_request(spec))
    [row] = [row for row in result.families if row.family == "aiter_fa_context"]
    return row, {job.key: job.kernel_name for job in result.jobs if job.family == "aiter_fa_context"}


@pytest.mark.vllm
@pytest.mark.compiles
@pytest.mark.slow
@pytest.mark.vllm_process("aiter-fa")
def test_sliding_window_models_plan_their_windowed_decodes(release):
    """Mistral (one window) and Gemma-2 (windowed and full layers) plan without error; where the
    line decodes windows with AITER's unified attention (0.12 to 0.17, 0.23 to 0.32) their plans
    hold it, which Llama's (no window) lacks; 0.11, 0.18 to 0.22 and 0.33 run those decodes in
    prebuilt kernels."""
    if _lacking_aiter_is_planned_as_such("llama-3.1-8b-instruct"):
        return
    _, llama = _planned("llama-3.1-8b-instruct")
    assert llama and UNIFIED not in llama.values()
    for spec in ("mistral-7b-v0.1", GEMMA):
        row, kernels = _planned(spec)
        assert row.error is None and row.skip_reason is None and kernels, row
        assert "cp_mha_gather_cache_kernel" in kernels.values()
        # 0.12 to 0.17 and 0.23 to 0.32 decode a window's single tokens with AITER's unified attention.
        windowed_unified = release_line(release).aiter_fa_windowed_decode == "unified"
        assert (UNIFIED in kernels.values()) == windowed_unified, (spec, sorted(kernels.values()))


def _keys(shapes) -> set[str]:
    """The keys a plan of just these steps has."""
    calls = CONTEXT.calls(tuple(shapes), GFX942)
    return {job.key for job in trace_calls(calls, GFX942, "aiter_fa_context", CONTEXT.traced_modules).jobs}


@pytest.mark.vllm
@pytest.mark.compiles
@pytest.mark.slow
@pytest.mark.vllm_process("aiter-fa")
@pytest.mark.parametrize("spec", ["mistral-7b-v0.1", GEMMA, GPT_OSS], ids=lambda spec: Path(spec).stem)
def test_random_steps_through_the_real_builder_and_impl_are_planned(spec, release):
    """Random engine steps through vLLM's own layers, builder and impl compile nothing outside the
    plan. Negative controls, from the plan's own steps: without its KV caches over 2 GiB it misses
    wherever Triton's AMD buffer ops are on (3.6 on; 0.11 and 0.12's own 3.5 leaves them off);
    without its decode steps it misses where decodes run Triton (windows where the line
    decodes them with unified attention, sinks from 0.23); Gemma-2's windows collapsed to one
    kind miss the other kind's gathers (0.12, and 0.33's full group, whose gather takes int64
    token-to-batch indices). vLLM up to 0.22
    builds no gpt-oss layer with this backend (its impl takes no sinks; from 0.18 its selector
    refuses it)."""
    if spec == GPT_OSS and not since(release, "0.23"):
        # From 0.18 vLLM's selector refuses the backend for sinks (one line naming it); before, its
        # model builds no layer with it.
        try:
            refused, layers = None, list(_request(spec).model.attention_layers)
        except InputError as error:
            refused, layers = str(error), []
        assert not layers, "vLLM built gpt-oss's layers with a ROCM_AITER_FA that takes no sinks"
        assert (refused is not None and "attention sinks not supported" in refused) == since(release, "0.18"), refused
        return
    if _lacking_aiter_is_planned_as_such(spec):
        return
    request = _request(spec)
    layers = list(request.model.attention_layers)
    assert layers and all(layer.backend == "ROCM_AITER_FA" for layer in layers), layers
    _, kernels = _planned(spec)
    swept = engine_steps.sweep(request.model, SERVING, layers, "ROCM_AITER_FA", GFX942, seed=29, count=STEPS)
    assert swept.steps == STEPS * len(layers) and swept.keys, swept
    assert not swept.keys - set(kernels), sorted(swept.keys - set(kernels))
    [shapes] = planned_shapes(request.model, SERVING, request.selection).values()
    # A pointer's 2 GiB class is a specialization only with AMD's buffer ops, which Triton 3.5 (0.11
    # and 0.12's own) leaves off by default and 3.6 on turns on.
    from triton import knobs

    over_2gib_missed = swept.keys - _keys(shape for shape in shapes if shape.kv_cache_storage == "under_2gib")
    assert bool(over_2gib_missed) == bool(knobs.amd.use_buffer_ops), len(over_2gib_missed)
    missed = swept.keys - _keys(shape for shape in shapes if max(shape.query_lens) > 1)
    windowed_unified = release_line(release).aiter_fa_windowed_decode == "unified"
    decodes_run_triton = windowed_unified or (since(release, "0.23") and spec == GPT_OSS)
    assert bool(missed) == decodes_run_triton, len(missed)
    if spec == GEMMA:
        collapsed = [replace(layer, sliding_window=layers[0].sliding_window) for layer in layers]
        without, _ = engine_steps.planned(request.model, SERVING, "ROCM_AITER_FA", GFX942, collapsed)
        assert bool(swept.keys - without) == since(release, "0.12"), len(swept.keys - without)


@pytest.mark.vllm
@pytest.mark.compiles
@pytest.mark.slow
@pytest.mark.vllm_process("aiter-fa")
def test_each_request_mix_is_built_once_for_every_kv_cache_storage_class(release, monkeypatch):
    """The backend's metadata builder never sees the KV cache: Llama's plan builds each request
    mix's layers and metadata once and runs the impl's forward on them in each storage class (up
    to 0.18 its own steps, from 0.19 the engine's), with the keys that steps building their own
    give (each class traced alone). Control: traced alone, each class builds once per step."""
    if _lacking_aiter_is_planned_as_such("llama-3.1-8b-instruct"):
        return
    monkeypatch.setenv("KPRECOMPILE_TRACE_WORKERS", "1")  # every build counted in this process
    built = []
    build = aiter_fa_context.common_attention_metadata
    monkeypatch.setattr(aiter_fa_context, "common_attention_metadata", lambda *args: built.append(args) or build(*args))
    request = _request("llama-3.1-8b-instruct")
    [shapes] = planned_shapes(request.model, SERVING, request.selection).values()
    mixes = {aiter_fa_context._request_mix(shape) for shape in shapes}
    assert len(shapes) == len(KV_CACHE_STORAGE_CLASSES) * len(mixes) > 0
    together = _keys(shapes)
    assert len(built) == len(mixes), len(built)
    alone: set[str] = set()
    for storage in KV_CACHE_STORAGE_CLASSES:
        built.clear()
        steps = [shape for shape in shapes if shape.kv_cache_storage == storage]
        alone |= _keys(steps)
        assert len(built) == len(steps)
    assert together == alone and together
