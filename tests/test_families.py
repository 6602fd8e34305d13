"""The attention families end to end on real AITER kernels: keys, compiles, specializations."""

from __future__ import annotations

import json

import pytest
from helpers import launch_path_keys

from kprecompile.cache.entries import compiled_files
from kprecompile.cache.jobs import CompileJob
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.shapes import FAMILIES
from kprecompile.tracing.trace import trace_calls
from kprecompile.vllm.releases import DEFAULT_RELEASE, release_line
from kprecompile.warmup.planning import plan
from kprecompile.warmup.warming import warm

SMALL = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 2048}


def first_shape(preset, family, pick=lambda shape: True, **serving):
    shapes = FAMILIES[family].enumerate_shapes(
        load_model(preset), ServingParams(**{**SMALL, **serving}), release_line(DEFAULT_RELEASE)
    )
    return next(shape for shape in shapes if pick(shape))


@pytest.mark.compiles
@pytest.mark.parametrize(
    "preset, family, pick",
    [
        ("deepseek-v2-lite", "mla_decode", lambda shape: shape.batch == 3),
        ("deepseek-v2-lite", "mla_prefill", lambda shape: shape.kind == "new_tokens"),
        ("deepseek-v2-lite", "mla_prefill", lambda shape: shape.kind == "context_chunk"),
        ("llama-3.1-8b-instruct", "prefix_prefill", lambda shape: shape.max_seq_len > 512),
        ("llama-3.1-8b-instruct", "paged_decode", lambda shape: shape.kv_cache_storage == "over_2gib"),
        ("mistral-7b-v0.1", "paged_decode", lambda shape: True),
    ],
)
def test_traced_key_equals_the_launch_paths_key(tmp_path, gfx942, preset, family, pick):
    """The key a plan records is the key the engine's own launch computes for the same call."""
    shape = first_shape(preset, family, pick)
    kernel_family = FAMILIES[family]

    def call():
        kernel_family.launch(shape, gfx942)

    traced = trace_calls([("call", call)], gfx942, family, kernel_family.traced_modules)
    launched = launch_path_keys(tmp_path, gfx942, call, kernel_family.traced_modules)
    # The launch path stops at its first kernel's launch; the trace sees every kernel.
    assert len(launched) == 1 and [job.key for job in traced.jobs][:1] == launched


def test_sliding_window_is_its_own_specialization(gfx942):
    def planned(preset):
        selection = select(load_model(preset), attention_backend="ROCM_AITER_UNIFIED_ATTN", environ={})
        return plan(Request(load_model(preset), ServingParams(**SMALL), selection, (gfx942,))).jobs

    mistral, llama = planned("mistral-7b-v0.1"), planned("llama-3.1-8b-instruct")
    # Same heads and head size; only the window differs, and every attention kernel with it.
    assert {job.key for job in mistral}.isdisjoint({job.key for job in llama})
    assert any("2d" in job.kernel_name for job in mistral)
    assert all("SLIDING_WINDOW=4096" in job.describe_specialization() for job in mistral if "2d" in job.kernel_name)
    # A window keeps every step on the 2D kernel: fewer kernels than full attention.
    assert len(mistral) < len(llama)


@pytest.mark.slow
@pytest.mark.compiles
# Small limits that still reach every kernel kind: unified attention's 2D and 3D kernels and
# the segment reduction; MLA's stage-2 reduce and both prefill kinds (new tokens, context).
@pytest.mark.parametrize(
    "preset, backend, families, targets, serving, kernels",
    [
        (
            "llama-3.1-8b-instruct",
            "ROCM_AITER_UNIFIED_ATTN",
            ("prefix_prefill", "paged_decode"),
            ("gfx942", "gfx950"),
            ServingParams(max_num_seqs=1, max_num_batched_tokens=2, max_model_len=600),
            {"kernel_unified_attention_2d", "kernel_unified_attention_3d", "reduce_segments"},
        ),
        # mla_decode on gfx942 (and gfx950) is compiled by the session's bake of the default selection.
        (
            "deepseek-v2-lite",
            "ROCM_AITER_TRITON_MLA",
            ("mla_decode", "mla_prefill"),
            ("gfx950",),
            ServingParams(max_num_seqs=4, max_num_batched_tokens=4, max_model_len=3),
            {"_fwd_kernel_stage2_asm", "_attn_fwd"},
        ),
    ],
)
def test_warm_compiles_the_attention_families(cache_layout, preset, backend, families, targets, serving, kernels):
    model = load_model(preset)
    selection = select(model, attention_backend=backend, environ={}, families=families)
    report = warm(
        Request(model, serving, selection, tuple(TARGETS[name] for name in targets)), cache_layout, max_workers=2
    )
    assert report.failed == 0, report.failures
    assert report.compiled == report.kernels > 4
    assert {family.family for family in report.families} == set(families)
    jobs = [job for manifest in report.manifests for job in json.loads(open(manifest).read())["jobs"]]
    assert {job["kernel"].rpartition(":")[2].rpartition(".")[2] for job in jobs} == kernels
    if "mla_prefill" in families:
        # New tokens attend causally, cached-context chunks do not: both are compiled.
        prefill = [CompileJob(**{k: v for k, v in job.items() if k != "artifacts"}) for job in jobs]
        causal = {"IS_CAUSAL=True" in job.describe_specialization() for job in prefill if job.family == "mla_prefill"}
        assert causal == {True, False}
    for job in jobs:
        files = compiled_files(cache_layout, job["key"])
        [hsaco] = [path for path in files if path.suffix == ".hsaco"]
        assert hsaco.read_bytes()[:4] == b"\x7fELF"
