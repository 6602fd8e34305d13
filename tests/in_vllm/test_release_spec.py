"""vLLM 0.19 and newer's TRITON_ATTN with speculative decoding, traced from the installed vLLM 0.33.0 on
gfx942 and, in a process of its own, sm90; and why AITER's fused rope-and-cache is not planned.

1. What vLLM's real metadata builder makes of the speculative configuration `engine_config` gives
   it (the 3D threshold and scratch rows the backend hands `unified_attention`, seen at the call).
2. Kernels per plan: without speculative decoding and with k draft tokens.
3. Keys: the plan's key equals Triton's launch path's for a 3D and a 2D verify step (a step
   stops at its first launch: reshape-and-cache skipped, in the trace and the launch path alike).
4. Coverage: random engine steps (independent of the plan's enumeration: each request verifies
   a random number of drafts up to a random cap, some prefill, random contexts and layer sizes)
   compile nothing outside the plan; the same sweep against smaller plans: one without
   speculative decoding, and one whose decodes all verify k drafts (none shorter).

Sections 1-4 run for sm90 too (a process of its own, as an NVIDIA request is planned).

5. (gfx942) Whether vLLM's compilation puts AITER's fused rope-and-cache in place of TRITON_ATTN's
   reshape-and-cache under its defaults with AITER on: the pass configuration vLLM builds.
"""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from dataclasses import replace

import pytest
from helpers import launch_path_keys
from kernel_probes import GFX942, LINE, SERVING, SM90, TRITON, _random_layer_blocks, _without_reshape_and_cache

from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.tracing.libraries import import_library_module
from kprecompile.tracing.trace import trace_calls
from kprecompile.vllm.releases import installed_release
from kprecompile.warmup.planning import plan

LLAMA_8B, LLAMA_70B = "llama-3.1-8b-instruct", "llama-3.1-70b-instruct"


def planned(preset: str, target, **serving: object):
    model = load_model(preset)
    selection = select(model, "vllm", "TRITON_ATTN", environ={}, vllm_release=installed_release(), targets=[target])
    return plan(Request(model, ServingParams(**{**SERVING, **serving}), selection, (target,)))


def kernels_of(jobs) -> list[str]:
    return [job.kernel.rpartition(":")[2] for job in jobs]


def plan_keys(preset: str, target, **serving: object) -> set[str]:
    return {job.key for job in planned(preset, target, **serving).jobs}


def builder_view(preset: str, target, num_speculative_tokens: int) -> dict[str, int]:
    """The threshold and scratch rows vLLM's builder passes `unified_attention` for a 3-sequence
    verify step (seen at the call, which then runs as usual; in the traced process's fresh vLLM)."""
    serving = ServingParams(**SERVING, num_speculative_tokens=num_speculative_tokens)
    step = next(
        shape
        for shape in TRITON.enumerate_shapes(load_model(preset), serving, LINE)
        if shape.num_seqs == 3 and shape.max_query_len == serving.decode_query_len
    )
    seen: dict[str, int] = {}

    def call():
        module = import_library_module("vllm.v1.attention.backends.triton_attn")
        original = module.unified_attention

        def watched(**kwargs):
            seen.update(
                threshold=kwargs["seq_threshold_3D"],
                rows=kwargs["softmax_segm_max"].shape[0],
                segments=kwargs["num_par_softmax_segments"],
                max_query_len=kwargs["max_seqlen_q"],
            )
            return original(**kwargs)

        module.unified_attention = watched
        try:
            TRITON.launch(step, target)
        finally:
            module.unified_attention = original

    trace_calls([("call", call)], target, "triton_attn", TRITON.traced_modules)
    return seen


def spec_sweep(preset: str, target, seed: int, count: int, **serving: object) -> tuple[int, set[str]]:
    """Random engine steps with speculative decoding: each decoding request verifies 0..cap drafts
    (a random cap up to k per step), some requests prefill 2 to 64 tokens, random contexts, layer
    regions of random size; traced through the family's real call."""
    model, params = load_model(preset), ServingParams(**{**SERVING, **serving})
    template = TRITON.enumerate_shapes(model, params, LINE)[0]
    model_len = params.model_len(model)
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < count:
        num_seqs = rng.randint(1, params.max_num_seqs)
        prefills = rng.choice([0, 0, 0, 1, rng.randint(1, num_seqs)])
        cap = rng.randint(0, params.num_speculative_tokens)
        query_lens = [1 + rng.randint(0, cap) for _ in range(num_seqs - prefills)]
        query_lens += [rng.randint(2, 64) for _ in range(prefills)]
        tokens = sum(query_lens)
        if tokens > params.max_num_batched_tokens:
            continue
        step = replace(
            template,
            num_seqs=num_seqs,
            tokens=tokens,
            max_query_len=max(query_lens),
            max_seq_len=rng.randint(max(query_lens), model_len),
            kv_cache_storage=rng.choice(["under_2gib", "over_2gib"]),
        )
        shapes.append(replace(step, kv_cache_blocks=_random_layer_blocks(step, rng)))
    swept = trace_calls(TRITON.calls(tuple(shapes), target), target, "triton_attn", TRITON.traced_modules)
    return swept.calls, {job.key for job in swept.jobs}


def full_verify_only_keys(preset: str, target, **serving: object) -> set[str]:
    """The plan's own steps without the decodes that verify fewer than k drafts."""
    model, params = load_model(preset), ServingParams(**{**SERVING, **serving})
    kept = tuple(
        shape
        for shape in TRITON.enumerate_shapes(model, params, LINE)
        if shape.max_query_len >= params.decode_query_len
    )
    return {
        job.key for job in trace_calls(TRITON.calls(kept, target), target, "triton_attn", TRITON.traced_modules).jobs
    }


def key_rows(preset: str, target, num_speculative_tokens: int) -> dict[str, dict[str, list]]:
    serving = ServingParams(**SERVING, num_speculative_tokens=num_speculative_tokens)
    shapes = TRITON.enumerate_shapes(load_model(preset), serving, LINE)
    verify = serving.decode_query_len
    steps = {
        "verify 3d": next(s for s in shapes if s.num_seqs == 3 and s.max_query_len == verify),
        "verify 2d": next(s for s in shapes if s.num_seqs == 16 and s.max_query_len == verify),
    }
    rows = {}
    for label, step in steps.items():
        call = _without_reshape_and_cache(step, target)
        traced = trace_calls([("call", call)], target, "triton_attn", TRITON.traced_modules)
        with tempfile.TemporaryDirectory() as cache:
            launched = launch_path_keys(cache, target, call, TRITON.traced_modules)
        rows[label] = {
            "traced": [job.key for job in traced.jobs],
            "launched": launched,
            "kernels": [job.kernel.rpartition(":")[2] for job in traced.jobs],
        }
    return rows


# (preset, k) cases: Llama-3.1-8B (4 queries per KV head: query blocks of 4) and Llama-3.1-70B
# (8 per KV head: blocks of 2, so a verify of 3 tokens takes two blocks).
CASES = {"llama-3.1-8b k=3": (LLAMA_8B, 3), "llama-3.1-8b k=4 fp8": (LLAMA_8B, 4), "llama-3.1-70b k=2": (LLAMA_70B, 2)}


def fused_rope_and_cache(preset: str) -> dict[str, object]:
    """vLLM's compilation config for a gfx942 server with VLLM_ROCM_USE_AITER=1, with CUDA graphs
    and eager: whether `RopeKVCacheFusionPass` runs, and the two conditions vLLM enables it on."""
    import os

    from kprecompile.platforms.vllm_platform import refresh_switches
    from kprecompile.vllm.engine_config import engine_config

    model, saved = load_model(preset), os.environ.get("VLLM_ROCM_USE_AITER")
    os.environ["VLLM_ROCM_USE_AITER"] = "1"
    refresh_switches()
    document = {}
    try:
        for eager in (False, True):
            config = engine_config(model.config_json, ServingParams(**SERVING, enforce_eager=eager), GFX942)
            compilation = config.compilation_config
            document["eager" if eager else "graphs"] = {
                "fuse_rope_kvcache": compilation.pass_config.fuse_rope_kvcache,
                "rotary_embedding_custom_op": compilation.is_custom_op_enabled("rotary_embedding"),
                "splitting_ops_contain_kv_cache_update": compilation.splitting_ops_contain_kv_cache_update(),
            }
    finally:
        os.environ.pop("VLLM_ROCM_USE_AITER")
        if saved is not None:
            os.environ["VLLM_ROCM_USE_AITER"] = saved
        refresh_switches()
    return document


def probe(target) -> dict[str, object]:
    [choice] = select(
        load_model(LLAMA_8B), "vllm", "TRITON_ATTN", environ={}, vllm_release=installed_release(), targets=[target]
    ).choices
    document: dict[str, object] = {"choice": [choice.family, choice.skip_reason]}
    document["builder"] = {str(k): builder_view(LLAMA_8B, target, k) for k in (0, 3, 4)}
    document["plans"] = {}
    for preset in (LLAMA_8B, LLAMA_70B):
        for k in (0, 2, 4):
            jobs = planned(preset, target, num_speculative_tokens=k).jobs
            document["plans"][f"{preset} k={k}"] = {
                "kernels": dict(Counter(kernels_of(jobs))),
                "keys": sorted(job.key for job in jobs),
            }
    document["keys"] = key_rows(LLAMA_70B, target, 2)
    coverage = {}
    for seed, (label, (preset, k)) in enumerate(CASES.items()):
        serving = {"num_speculative_tokens": k, **({"kv_cache_dtype": "fp8"} if "fp8" in label else {})}
        steps, swept = spec_sweep(preset, target, seed, 80, **serving)
        without_spec = plan_keys(preset, target, **{**serving, "num_speculative_tokens": 0})
        coverage[label] = {
            "steps": steps,
            "kernels": len(swept),
            "missing": len(swept - plan_keys(preset, target, **serving)),
            "missing_from_plan_without_spec": len(swept - without_spec),
            "missing_from_full_verify_only": len(swept - full_verify_only_keys(preset, target, **serving)),
        }
    document["coverage"] = coverage
    if target.is_rocm:
        document["fused_rope_and_cache"] = fused_rope_and_cache(LLAMA_8B)
    return document


pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.compiles, pytest.mark.vllm_releases("0.33.0")]

# Each target's tests in the process of that target's other kernel tests.
GFX942_PROCESS = pytest.param("gfx942", marks=pytest.mark.vllm_process("kernels-rocm"))
SPEC_TARGETS = [GFX942_PROCESS, pytest.param("sm90", marks=pytest.mark.vllm_process("kernels-nvidia"))]


@pytest.fixture(scope="module")
def spec_probe(target):
    return {"release": installed_release(), **probe(SM90 if target == "sm90" else GFX942)}


@pytest.mark.parametrize("target", SPEC_TARGETS, scope="module")
def test_the_builder_sizes_its_3d_scratch_from_vllms_speculative_config(spec_probe):
    """engine_config gives vLLM's builder the speculative configuration: 16 sequences (its 3D
    threshold, 128 / 8 KV heads) x (1 + k) scratch rows, and verify steps of 1 + k tokens."""
    document = spec_probe
    assert document["release"] == "0.33.0" and document["choice"] == ["triton_attn", None]
    for k, seen in document["builder"].items():
        assert seen == {"threshold": 16, "rows": 16 * (1 + int(k)), "segments": 16, "max_query_len": 1 + int(k)}, k


@pytest.mark.parametrize("target", SPEC_TARGETS, scope="module")
def test_speculative_steps_keys_are_the_launch_paths(spec_probe):
    """Llama-3.1-70B (query blocks of 2 tokens), 2 drafts: 3 verifying sequences take the 3D kernel,
    16 take the 2D one (two query blocks each exceed the threshold); keys equal the launch path's."""
    keys = spec_probe["keys"]
    assert keys["verify 3d"]["kernels"] == ["kernel_unified_attention", "reduce_segments"]
    assert keys["verify 2d"]["kernels"] == ["kernel_unified_attention"]
    for row in keys.values():
        assert row["traced"][:1] == row["launched"] and len(row["launched"]) == 1, row


@pytest.mark.parametrize("target", SPEC_TARGETS, scope="module")
def test_random_speculative_steps_are_covered_by_the_plan(spec_probe):
    """Random steps (each request verifies 0 to a random cap of drafts, some prefill, random
    contexts and layer sizes) compile nothing outside the plan; a plan whose decodes all verify k
    drafts misses kernels where a full verify takes more query blocks than a shorter one."""
    coverage = spec_probe["coverage"]
    for label, row in coverage.items():
        assert row["steps"] >= 60 and row["kernels"] >= 8 and row["missing"] == 0, label
    for label in ("llama-3.1-8b k=4 fp8", "llama-3.1-70b k=2"):
        assert coverage[label]["missing_from_full_verify_only"] > 0, label


@pytest.mark.parametrize("target", SPEC_TARGETS, scope="module")
def test_speculative_decoding_adds_no_triton_attn_kernel_under_vllm_0_33(spec_probe, target):
    """What was measured: with k drafts, steps move between the 3D and the 2D kernel, but the 3D
    kernel's key does not depend on the query length and every sequence-count class still reaches
    both kernels, so the plan's keys are those of the plan without speculative decoding, and that
    plan misses nothing of the speculative sweeps."""
    document = spec_probe
    expected = (
        {"kernel_unified_attention": 18, "reduce_segments": 3, "reshape_and_cache_kernel_flash": 3}
        if target == "gfx942"
        else {"kernel_unified_attention": 6, "reduce_segments": 3, "reshape_and_cache_kernel_flash": 1}
    )
    for preset in ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct"):
        plans = [document["plans"][f"{preset} k={k}"] for k in (0, 2, 4)]
        assert all(Counter(plan["kernels"]) == expected for plan in plans), preset
        assert plans[0]["keys"] == plans[1]["keys"] == plans[2]["keys"], preset
    assert all(row["missing_from_plan_without_spec"] == 0 for row in document["coverage"].values())


@pytest.mark.parametrize("target", [GFX942_PROCESS], scope="module")
def test_vllms_defaults_keep_reshape_and_cache_with_aiter_on(spec_probe):
    """The reason triton_attn's plan gives for AITER's fused rope-and-cache: with
    VLLM_ROCM_USE_AITER=1 on gfx942, vLLM 0.33's default compilation does not run
    RopeKVCacheFusionPass (rotary embedding is not a custom op, and the KV-cache update splits the
    graph); in eager mode no pass runs at all."""
    document = spec_probe["fused_rope_and_cache"]
    assert document["graphs"] == {
        "fuse_rope_kvcache": False,
        "rotary_embedding_custom_op": False,
        "splitting_ops_contain_kv_cache_update": True,
    }
    assert document["eager"]["fuse_rope_kvcache"] is False
