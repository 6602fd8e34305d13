"""Coverage: what the engine launches within the serving limits is a subset of the plan.

Each test traces a dense sweep of realistic engine steps, drawn independently of the plan's
enumeration (seeded random batches of prefills and decodes, every batch size, many sequence
and context lengths, both KV-cache dtypes where the backend supports them) through the same
engine-call mirror, and asserts that every kernel it would compile is in the plan. Negative
controls show the check fails when the plan's limits are smaller than the sweep's.
"""

from __future__ import annotations

import random

import pytest

from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.shapes import FAMILIES
from kprecompile.shapes._paged_kv import PagedAttentionShape
from kprecompile.shapes.mla_decode import MlaDecodeShape
from kprecompile.shapes.mla_prefill import MlaPrefillShape
from kprecompile.shapes.pa_prefill import PaPrefillShape
from kprecompile.tracing.trace import trace_calls
from kprecompile.warmup.planning import plan

MAX_NUM_SEQS = 48
BUDGET = 1024
MODEL_LEN = 4096


def serving(**overrides) -> ServingParams:
    settings = {"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": BUDGET, "max_model_len": MODEL_LEN}
    return ServingParams(**{**settings, **overrides})


def planned_keys(model, params, backend, family, target) -> set[str]:
    selection = select(model, attention_backend=backend, environ={}, families=[family])
    result = plan(Request(model, params, selection, (target,)))
    return {job.key for job in result.jobs}


def traced(family, shapes, target):
    kernel_family = FAMILIES[family]
    return trace_calls(kernel_family.calls(shapes, target), target, family, kernel_family.traced_modules).jobs


def split(total: int, parts: int, rng: random.Random, low: int) -> list[int]:
    """`parts` random integers >= low summing to at most total."""
    lengths = [low] * parts
    for _ in range(total - low * parts):
        if rng.random() < 0.7:
            lengths[rng.randrange(parts)] += 1
    return lengths


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_mla_decode_sweep_is_covered(gfx942, kv_cache_dtype):
    model, params = load_model("deepseek-r1"), serving(tensor_parallel_size=8, kv_cache_dtype=kv_cache_dtype)
    rng = random.Random(3)
    sweep = [
        MlaDecodeShape(16, batch, 1, rng.randint(1, MODEL_LEN), 512, 64, "bfloat16", kv_cache_dtype == "fp8")
        for batch in range(1, MAX_NUM_SEQS + 1)
        for _ in range(3)
    ]
    jobs = traced("mla_decode", sweep, gfx942)
    # One stage-2 kernel per batch size: the sweep reaches every one.
    assert len({job.key for job in jobs}) >= MAX_NUM_SEQS
    assert {job.key for job in jobs} <= planned_keys(model, params, "ROCM_AITER_MLA", "mla_decode", gfx942)
    # Negative control: a plan for fewer sequences misses the larger batches.
    smaller = planned_keys(
        model,
        serving(tensor_parallel_size=8, max_num_seqs=32, kv_cache_dtype=kv_cache_dtype),
        "ROCM_AITER_MLA",
        "mla_decode",
        gfx942,
    )
    assert not {job.key for job in jobs} <= smaller


def test_mla_decode_with_multi_token_prediction_is_covered(gfx942):
    model, params = load_model("deepseek-r1"), serving(tensor_parallel_size=8, num_speculative_tokens=2)
    rng = random.Random(4)
    # Requests verify 1 + accepted drafts: the longest query in a step is 1..3 tokens.
    sweep = [
        MlaDecodeShape(16, batch, query_len, rng.randint(8, MODEL_LEN), 512, 64, "bfloat16", False)
        for batch in range(1, MAX_NUM_SEQS + 1)
        for query_len in (1, 2, 3)
    ]
    keys = {job.key for job in traced("mla_decode", sweep, gfx942)}
    assert keys <= planned_keys(model, params, "ROCM_AITER_MLA", "mla_decode", gfx942)
    assert not keys <= planned_keys(model, serving(tensor_parallel_size=8), "ROCM_AITER_MLA", "mla_decode", gfx942)


def test_mla_prefill_sweep_is_covered(gfx942):
    model, params = load_model("deepseek-r1"), serving(tensor_parallel_size=8)
    rng = random.Random(5)
    sweep = []
    for _ in range(150):
        prefills = rng.randint(1, min(MAX_NUM_SEQS, BUDGET // 2))
        query_lens = split(rng.randint(2 * prefills, BUDGET), prefills, rng, low=2)
        tokens, longest = sum(query_lens), max(query_lens)
        sweep.append(
            MlaPrefillShape("new_tokens", 16, prefills, tokens, longest, tokens, longest, 128, 64, 128, "bfloat16")
        )
        contexts = [rng.randint(1, MODEL_LEN - q) for q in query_lens]
        sweep.append(
            MlaPrefillShape(
                "context_chunk", 16, prefills, tokens, longest, sum(contexts), max(contexts), 128, 64, 128, "bfloat16"
            )
        )
    jobs = traced("mla_prefill", sweep, gfx942)
    assert len({job.key for job in jobs}) > 4
    assert {job.key for job in jobs} <= planned_keys(model, params, "ROCM_AITER_TRITON_MLA", "mla_prefill", gfx942)


def _gqa_step(model, params, rng, decodes: int, prefills: int, storage: str) -> PagedAttentionShape:
    kv_heads = model.num_key_value_heads // params.tensor_parallel_size
    query_lens = [1] * decodes + (
        split(rng.randint(2 * prefills, BUDGET - decodes), prefills, rng, 2) if prefills else []
    )
    seq_lens = [q + rng.randint(0, MODEL_LEN - q) for q in query_lens]
    return PagedAttentionShape(
        q_heads=model.num_attention_heads // params.tensor_parallel_size,
        kv_heads=kv_heads,
        head_size=model.head_dim,
        block_size=params.block_size,
        max_blocks_per_seq=MODEL_LEN // params.block_size,
        num_seqs=len(query_lens),
        tokens=sum(query_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        sliding_window=model.sliding_window or 0,
        dtype="bfloat16",
        kv_cache_fp8=params.kv_cache_is_fp8,
        kv_cache_storage=storage,
    )


@pytest.mark.parametrize(
    "preset, kv_cache_dtype, tp",
    [
        ("llama-3.1-8b-instruct", "auto", 1),
        ("llama-3.1-8b-instruct", "fp8", 1),
        ("mistral-7b-v0.1", "auto", 1),
        ("llama-3.1-70b-instruct", "auto", 8),
    ],
)
def test_prefix_prefill_sweep_is_covered(gfx942, preset, kv_cache_dtype, tp):
    model, params = load_model(preset), serving(kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=tp)
    rng = random.Random(7)
    sweep = []
    for _ in range(400):
        prefills = rng.randint(1, 8)
        decodes = rng.randint(0, MAX_NUM_SEQS - prefills)
        # Short steps too: a single short chunk over a long context takes the 3D kernel.
        if rng.random() < 0.3:
            prefills, decodes = 1, rng.randint(0, 3)
        storage = rng.choice(["under_2gib", "over_2gib"])
        sweep.append(_gqa_step(model, params, rng, decodes, prefills, storage))
    jobs = traced("prefix_prefill", sweep, gfx942)
    names = {job.kernel_name for job in jobs}
    if not model.sliding_window and tp == 1:
        assert {"kernel_unified_attention_2d", "kernel_unified_attention_3d", "reduce_segments"} <= names
    keys = {job.key for job in jobs}
    assert keys <= planned_keys(model, params, "ROCM_AITER_UNIFIED_ATTN", "prefix_prefill", gfx942)


@pytest.mark.parametrize(
    "preset, kv_cache_dtype",
    [("llama-3.1-8b-instruct", "auto"), ("llama-3.1-8b-instruct", "fp8"), ("mistral-7b-v0.1", "auto")],
)
def test_paged_decode_sweep_is_covered(gfx942, preset, kv_cache_dtype):
    model, params = load_model(preset), serving(kv_cache_dtype=kv_cache_dtype)
    rng = random.Random(11)
    sweep = [
        _gqa_step(model, params, rng, batch, 0, storage)
        for batch in range(1, MAX_NUM_SEQS + 1)
        for storage in ("under_2gib", "over_2gib")
        for _ in range(3)
    ]
    jobs = traced("paged_decode", sweep, gfx942)
    keys = {job.key for job in jobs}
    assert keys <= planned_keys(model, params, "ROCM_AITER_UNIFIED_ATTN", "paged_decode", gfx942)
    if not model.sliding_window:
        # Both storage classes and several 3D segment counts are reached.
        assert len(keys) > 6


@pytest.mark.parametrize("target_name, kv_cache_dtype", [("gfx942", "auto"), ("gfx942", "fp8"), ("sm90", "auto")])
def test_pa_prefill_sweep_is_covered(target_name, kv_cache_dtype):
    target = TARGETS[target_name]
    model, params = load_model("llama-3.1-8b-instruct"), serving(kv_cache_dtype=kv_cache_dtype)
    rng = random.Random(17)
    sweep = []
    for _ in range(200):
        batch = rng.randint(1, 16)
        query_lens = split(rng.randint(batch, BUDGET), batch, rng, low=1)
        sweep.append(
            PaPrefillShape(
                32,
                8,
                128,
                16,
                MODEL_LEN // 16,
                batch,
                sum(query_lens),
                max(query_lens),
                0,
                "bfloat16",
                kv_cache_dtype == "fp8",
                rng.choice(["under_2gib", "over_2gib"]),
            )
        )
    keys = {job.key for job in traced("pa_prefill", sweep, target)}
    selection = select(model, engine="aiter", environ={})
    assert keys <= {job.key for job in plan(Request(model, params, selection, (target,))).jobs}


def test_coverage_check_fails_for_a_plan_without_the_fp8_kv_cache(gfx942):
    """Negative control: a sweep with an FP8 KV cache is not covered by a plan for the model dtype."""
    model = load_model("llama-3.1-8b-instruct")
    rng = random.Random(13)
    sweep = [_gqa_step(model, serving(kv_cache_dtype="fp8"), rng, 4, 1, "over_2gib") for _ in range(5)]
    keys = {job.key for job in traced("prefix_prefill", sweep, gfx942)}
    assert not keys <= planned_keys(model, serving(), "ROCM_AITER_UNIFIED_ATTN", "prefix_prefill", gfx942)
    assert keys <= planned_keys(
        model, serving(kv_cache_dtype="fp8"), "ROCM_AITER_UNIFIED_ATTN", "prefix_prefill", gfx942
    )
