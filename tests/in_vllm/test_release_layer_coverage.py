"""Random engine steps of the tests' own, through each release's own attention layer, metadata
builder and impl (engine_steps.py), with the layers vLLM's own model build gives, compile nothing
outside the plan; with one feature of the layers lost to the plan, the same steps miss kernels.

Public configs that exercise each feature: Gemma-2 (per-layer windows, soft-cap, a float32
checkpoint), gpt-oss (sinks, alternate windows), Mistral (one window), Qwen3 (an explicit
head_dim), Llama (GQA), Mistral with an FP8 KV cache; vLLM's TRITON_ATTN on gfx942 and sm90,
ROCM_ATTN on gfx942. DeepSeek-V2-Lite (MLA): decodes and prefills with and without cached context
through one MLA layer of vLLM's own build of the model, under TRITON_MLA on gfx942 and sm90.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import engine_steps
import pytest
from vllm_releases import since

from kprecompile.errors import InputError
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.request import resolve_requests
from kprecompile.vllm.releases import installed_release, release_line
from kprecompile.warmup.planning import plan

MODELS = Path(__file__).parent.parent / "models"
SERVING = ServingParams(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=2048)
FP8_KV_CACHE = replace(SERVING, kv_cache_dtype="fp8")
STEPS = 40


def _collapsed_windows(layers):
    return [replace(layer, sliding_window=layers[0].sliding_window) for layer in layers]


# What a plan loses when kprecompile does not handle a feature: the layers it would have planned.
LOST = {
    "soft-cap": lambda layers: [replace(layer, logits_soft_cap=0.0) for layer in layers],
    "sinks": lambda layers: [replace(layer, sinks="") for layer in layers],
    "per-layer windows": _collapsed_windows,
    "float32 as float16": lambda layers: [replace(layer, dtype="float16") for layer in layers],
    "window": lambda layers: [replace(layer, sliding_window=0) for layer in layers],
    "GQA": lambda layers: [replace(layer, num_kv_heads=layer.num_heads) for layer in layers],
    "FP8 KV cache": lambda layers: [replace(layer, kv_cache_dtype="auto") for layer in layers],
}
GEMMA = str(MODELS / "gemma-2-2b-it.json")
GPT_OSS = str(MODELS / "gpt-oss-20b-bf16.json")
MLA_MODEL = "deepseek-v2-lite"
# (model, backend, features a plan without their handling misses[, serving parameters if not SERVING])
CASES = {
    "gfx942": [
        (GEMMA, "TRITON_ATTN", ("soft-cap", "per-layer windows", "float32 as float16")),
        (GEMMA, "ROCM_ATTN", ("per-layer windows", "float32 as float16")),
        (GPT_OSS, "TRITON_ATTN", ("sinks", "per-layer windows")),
        (GPT_OSS, "ROCM_ATTN", ("sinks", "per-layer windows")),
        ("mistral-7b-v0.1", "TRITON_ATTN", ("window",)),
        ("mistral-7b-v0.1", "TRITON_ATTN", ("FP8 KV cache", "window"), FP8_KV_CACHE),
        ("qwen3-8b", "TRITON_ATTN", ()),
        ("llama-3.1-8b-instruct", "TRITON_ATTN", ("GQA",)),
    ],
    "sm90": [
        (GEMMA, "TRITON_ATTN", ("soft-cap", "per-layer windows", "float32 as float16")),
        (GPT_OSS, "TRITON_ATTN", ("sinks", "per-layer windows")),
        ("mistral-7b-v0.1", "TRITON_ATTN", ("window",)),
        ("mistral-7b-v0.1", "TRITON_ATTN", ("FP8 KV cache", "window"), FP8_KV_CACHE),
        ("qwen3-8b", "TRITON_ATTN", ()),
        ("llama-3.1-8b-instruct", "TRITON_ATTN", ("GQA",)),
    ],
}


def _serving(case) -> ServingParams:
    return case[3] if len(case) > 3 else SERVING


def _case_id(case) -> str:
    fp8 = "-fp8" if _serving(case).kv_cache_is_fp8 else ""
    return f"{case[0].removesuffix('.json').rpartition('/')[2]}-{case[1]}{fp8}"


def coverage(target_name: str, case, release: str, shared_dir: Path) -> dict[str, object]:
    """One row of the result table (docs/families-and-backends.md), also left in the shared
    directory for the table."""
    spec, backend, features = case[:3]
    serving, target = _serving(case), TARGETS[target_name]
    # The request as `kprecompile plan` makes it: with the layers vLLM's own model build gives.
    [request] = resolve_requests(
        [spec], serving, [target_name], engine="vllm", attention_backend=backend, families=[backend.lower()]
    )
    model = request.model
    name = case[0].removesuffix(".json").rpartition("/")[2]
    row: dict[str, object] = {"model": name, "release": release, "backend": backend, "target": target_name}
    row["kv_cache_dtype"] = serving.kv_cache_dtype
    row["built"] = model.layers_source if model.attention_layers else None
    if model.attention_layers:
        layers = list(model.attention_layers)
        result = plan(request)
        [family] = [family for family in result.families if family.family == backend.lower()]
        plan_keys = {job.key for job in result.jobs if job.family == family.family}
        row["skip_reason"], row["error"] = family.skip_reason, family.error
        if family.skip_reason is None:
            swept = engine_steps.sweep(model, serving, layers, backend, target, seed=23, count=STEPS)
            row.update(
                steps=swept.steps,
                kinds=len(layers),
                planned=len(plan_keys),
                kernels=len(swept.keys),
                misses=len(swept.keys - plan_keys),
                missed=sorted(swept.kernels[key] for key in swept.keys - plan_keys),
                vllm_backends=sorted(set(swept.backends)),
                lost={
                    feature: len(
                        swept.keys - engine_steps.planned(model, serving, backend, target, LOST[feature](layers))[0]
                    )
                    for feature in features
                },
            )
    print(json.dumps(row))
    (shared_dir / f"layer-coverage-{target_name}-{_case_id(case)}.json").write_text(json.dumps(row))
    return row


def _check(row: dict[str, object], features) -> None:
    assert row["built"] is not None, f"vLLM did not build {row['model']}'s layers with {row['backend']}"
    assert row["skip_reason"] is None and row.get("error") is None, row
    assert row["steps"] >= STEPS and row["kernels"] > 0, row
    assert row["vllm_backends"] == [row["backend"]], row
    assert row["misses"] == 0, row
    for feature in features:
        assert row["lost"][feature] > 0, f"a plan without {feature} missed nothing: {row}"


@pytest.mark.vllm
@pytest.mark.compiles
@pytest.mark.slow
@pytest.mark.vllm_process("layers-rocm")
@pytest.mark.parametrize("case", CASES["gfx942"], ids=_case_id)
def test_random_engine_steps_on_gfx942_are_planned(case, release, shared_dir):
    """ROCM (gfx942): 0 kernels outside the plan; > 0 with each feature's handling removed. From
    0.19 vLLM's selector refuses ROCM_ATTN for a layer with sinks (0.18.1's ROCM_ATTN still takes
    them): there, as `vllm serve --attention-backend ROCM_ATTN` does, the request fails naming
    vLLM's reason."""
    if case[0] == GPT_OSS and case[1] == "ROCM_ATTN" and since(release, "0.19"):
        with pytest.raises(InputError, match="attention sinks not supported"):
            coverage("gfx942", case, release, shared_dir)
        return
    _check(coverage("gfx942", case, release, shared_dir), case[2])


@pytest.mark.vllm
@pytest.mark.compiles
@pytest.mark.slow
@pytest.mark.vllm_process("layers-nvidia")
@pytest.mark.parametrize("case", CASES["sm90"], ids=_case_id)
def test_random_engine_steps_on_sm90_are_planned(case, release, shared_dir):
    """NVIDIA (sm90), vLLM's TRITON_ATTN: 0 kernels outside the plan; > 0 with each feature's
    handling removed."""
    _check(coverage("sm90", case, release, shared_dir), case[2])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.vllm_process("layers-rocm")
def test_mla_layers_are_the_ones_vllm_builds(release):
    """DeepSeek-V2-Lite: vLLM's own build gives the MLA layer kind the config's reading gives."""
    model = load_model("deepseek-v2-lite")
    built = engine_steps.built_layers(model, SERVING, TARGETS["gfx942"], "TRITON_MLA")
    assert built is not None, "vLLM did not build DeepSeek-V2-Lite's layers"
    assert [replace(layer, backend="") for layer in built.layers] == list(model.layer_kinds(SERVING))


# What a TRITON_MLA plan loses when kprecompile does not handle a feature: its keys without it.
MLA_LOST = {
    # The merge of a prefill's partial results on steps with cached context (`mla_merge`), and
    # 0.26 and 0.27's mask of context chunks some prefill has no context in.
    "prefill with context": lambda request, target: {
        job.key
        for job in plan(request).jobs
        if job.kernel_name not in ("merge_attn_states_kernel", "mask_empty_context_kernel")
    },
    # 0.26 and 0.27's mask alone (`mask_empty_context`).
    "empty context chunks": lambda request, target: {
        job.key for job in plan(request).jobs if job.kernel_name != "mask_empty_context_kernel"
    },
    # A layer of half the heads: the plan for two ranks of tensor parallelism.
    "heads": lambda request, target: engine_steps.planned(
        request.model,
        replace(request.serving, tensor_parallel_size=2),
        "TRITON_MLA",
        target,
        request.model.attention_layers,
    )[0],
    # Contexts up to 512 tokens: from 0.20 the decode's KV-split count grows with the context.
    "long contexts": lambda request, target: engine_steps.planned(
        request.model, replace(request.serving, max_model_len=512), "TRITON_MLA", target, request.model.attention_layers
    )[0],
}


def mla_lost_features(target_name: str) -> tuple[str, ...]:
    """What a plan without each feature misses in the installed release: the merge is Triton on
    ROCm up to 0.31 (compiled on CDNA3 from 0.32, CUDA's compiled merge on NVIDIA); 0.26 and 0.27
    mask empty context chunks with Triton on every platform; the split count follows the context
    from 0.20 (0.19 splits 4 ways)."""
    release = installed_release()
    line = release_line(release)
    masks = since(release, "0.26") and not since(release, "0.28")
    merge = TARGETS[target_name].is_rocm and line.mla_merge == "triton"
    context = ("prefill with context",) if merge or masks else ()
    empty = ("empty context chunks",) if masks else ()
    contexts = ("long contexts",) if since(release, "0.20") else ()
    return (*context, *empty, "heads", *contexts)


def mla_coverage(target_name: str, release: str, shared_dir: Path) -> dict[str, object]:
    """DeepSeek-V2-Lite's row: random steps through one MLA layer of vLLM's own build of the
    model (engine_steps.mla_sweep) against the TRITON_MLA plan."""
    backend, target = "TRITON_MLA", TARGETS[target_name]
    [request] = resolve_requests(
        [MLA_MODEL], SERVING, [target_name], engine="vllm", attention_backend=backend, families=["triton_mla"]
    )
    model = request.model
    row: dict[str, object] = {"model": MLA_MODEL, "release": release, "backend": backend, "target": target_name}
    row["built"] = model.layers_source if model.attention_layers else None
    result = plan(request)
    [family] = [family for family in result.families if family.family == "triton_mla"]
    plan_keys = {job.key for job in result.jobs if job.family == family.family}
    row["skip_reason"] = family.skip_reason
    row["error"] = family.error
    if family.skip_reason is None and family.error is None:
        swept = engine_steps.mla_sweep(model, SERVING, backend, target, seed=29, count=STEPS)
        row.update(
            steps=swept.steps,
            step_kinds=swept.step_kinds,
            kinds=len(model.attention_layers),
            planned=len(plan_keys),
            kernels=len(swept.keys),
            misses=len(swept.keys - plan_keys),
            missed=sorted(swept.kernels[key] for key in swept.keys - plan_keys),
            vllm_backends=sorted(set(swept.backends)),
            lost={feature: len(swept.keys - lost(request, target)) for feature, lost in MLA_LOST.items()},
        )
    print(json.dumps(row))
    (shared_dir / f"layer-coverage-{target_name}-{MLA_MODEL}-{backend}.json").write_text(json.dumps(row))
    return row


def _check_mla(row: dict[str, object], target_name: str) -> None:
    _check(row, mla_lost_features(target_name))
    assert all(row["step_kinds"][kind] > 0 for kind in ("decode", "prefill", "prefill with context")), row


@pytest.mark.vllm
@pytest.mark.compiles
@pytest.mark.slow
@pytest.mark.vllm_process("layers-rocm")
def test_random_mla_steps_on_gfx942_are_planned(release, shared_dir):
    """DeepSeek-V2-Lite, vLLM's TRITON_MLA on ROCM (gfx942): decodes, prefills and prefills with
    cached context through vLLM's own MLA layer compile nothing outside the plan; a plan without
    the context's merge (up to 0.31), without 0.26 and 0.27's mask of empty context chunks, for
    half the heads, or (from 0.19) for short contexts misses kernels."""
    _check_mla(mla_coverage("gfx942", release, shared_dir), "gfx942")


@pytest.mark.vllm
@pytest.mark.compiles
@pytest.mark.slow
@pytest.mark.vllm_process("layers-nvidia")
def test_random_mla_steps_on_sm90_are_planned(release, shared_dir):
    """The same on NVIDIA (sm90), where the context's merge is vLLM's compiled CUDA operator (0.26
    and 0.27's mask of empty context chunks is Triton there too)."""
    _check_mla(mla_coverage("sm90", release, shared_dir), "sm90")
