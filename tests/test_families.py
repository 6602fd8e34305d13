"""The attention families end to end on real AITER kernels: keys, compiles, specializations."""

from __future__ import annotations

import json

import pytest
from test_trace import launch_path_keys

from kprecompile.cache.entries import compiled_files
from kprecompile.engines import select
from kprecompile.models import load_model
from kprecompile.planning import plan
from kprecompile.providers import provider_for
from kprecompile.serving import ServingParams
from kprecompile.shapes import enumerate_shapes
from kprecompile.targets import TARGETS
from kprecompile.trace import trace_calls
from kprecompile.warming import warm

SMALL = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 2048}


def first_shape(preset, family, pick=lambda shape: True, **serving):
    model = load_model(preset)
    [shapes] = enumerate_shapes(model, ServingParams(**{**SMALL, **serving}), [family])
    return next(shape for shape in shapes.shapes if pick(shape))


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
    provider = provider_for(family)

    def call():
        provider.launch(shape, gfx942)

    traced = trace_calls([("call", call)], gfx942, family, provider.module_prefixes)
    launched = launch_path_keys(tmp_path, gfx942, call, provider.module_prefixes)
    # The launch path stops at its first kernel's launch; the trace sees every kernel.
    assert len(launched) == 1 and [job.key for job in traced.jobs][:1] == launched


def test_sliding_window_is_its_own_specialization(gfx942):
    def planned(preset):
        selection = select(load_model(preset), attention_backend="ROCM_AITER_UNIFIED_ATTN", environ={})
        return plan(load_model(preset), ServingParams(**SMALL), [gfx942], selection).jobs

    mistral, llama = planned("mistral-7b-v0.1"), planned("llama-3.1-8b-instruct")
    # Same heads and head size; only the window differs, and every attention kernel with it.
    assert {job.key for job in mistral}.isdisjoint({job.key for job in llama})
    assert any("2d" in job.kernel_name for job in mistral)
    assert all("SLIDING_WINDOW=4096" in job.describe_specialization() for job in mistral if "2d" in job.kernel_name)
    # A window keeps every step on the 2D kernel: fewer kernels than full attention.
    assert len(mistral) < len(llama)


@pytest.mark.parametrize(
    "preset, backend, families, targets",
    [
        ("llama-3.1-8b-instruct", "ROCM_AITER_UNIFIED_ATTN", ("prefix_prefill", "paged_decode"), ("gfx942", "gfx950")),
        # mla_decode on gfx942 is compiled by test_cache's warm of the default selection.
        ("deepseek-v2-lite", "ROCM_AITER_TRITON_MLA", ("mla_decode", "mla_prefill"), ("gfx950",)),
    ],
)
def test_warm_compiles_the_attention_families(cache_layout, preset, backend, families, targets):
    model = load_model(preset)
    serving = ServingParams(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=1024)
    selection = select(model, attention_backend=backend, environ={}, families=families)
    report = warm(model, serving, [TARGETS[name] for name in targets], cache_layout, selection=selection, max_workers=2)
    assert report.failed == 0, report.failures
    assert report.compiled == report.kernels > 4
    assert {family.name for family in report.families} == set(families)
    for manifest in report.manifests:
        for job in json.loads(open(manifest).read())["jobs"]:
            files = compiled_files(cache_layout, job["key"])
            [hsaco] = [path for path in files if path.suffix == ".hsaco"]
            assert hsaco.read_bytes()[:4] == b"\x7fELF"
