"""vLLM 0.19 and newer's TRITON_ATTN with speculative decoding, traced from the installed vLLM 0.33.0
(tests/vllm_spec_probe.py, on gfx942 and, in a process of its own, sm90); and why AITER's fused
rope-and-cache is not planned."""

from __future__ import annotations

from collections import Counter

import pytest
from test_vllm import HERE, probe_environment, run_probes

TARGETS = {"gfx942": [], "sm90": ["--nvidia"]}


@pytest.fixture(scope="module")
def spec_probes(tmp_path_factory):
    return run_probes(
        {
            target: (
                [HERE / "vllm_spec_probe.py", *arguments],
                probe_environment("0.33.0", tmp_path_factory.mktemp(f"spec-{target}")),
            )
            for target, arguments in TARGETS.items()
        }
    )


@pytest.mark.parametrize("target", TARGETS)
def test_the_builder_sizes_its_3d_scratch_from_vllms_speculative_config(spec_probes, target):
    """engine_config gives vLLM's builder the speculative configuration: 16 sequences (its 3D
    threshold, 128 / 8 KV heads) x (1 + k) scratch rows, and verify steps of 1 + k tokens."""
    document = spec_probes[target]
    assert document["release"] == "0.33.0" and document["choice"] == ["triton_attn", None]
    for k, seen in document["builder"].items():
        assert seen == {"threshold": 16, "rows": 16 * (1 + int(k)), "segments": 16, "max_query_len": 1 + int(k)}, k


@pytest.mark.parametrize("target", TARGETS)
def test_speculative_steps_keys_are_the_launch_paths(spec_probes, target):
    """Llama-3.1-70B (query blocks of 2 tokens), 2 drafts: 3 verifying sequences take the 3D kernel,
    16 take the 2D one (two query blocks each exceed the threshold); keys equal the launch path's."""
    keys = spec_probes[target]["keys"]
    assert keys["verify 3d"]["kernels"] == ["kernel_unified_attention", "reduce_segments"]
    assert keys["verify 2d"]["kernels"] == ["kernel_unified_attention"]
    for row in keys.values():
        assert row["traced"][:1] == row["launched"] and len(row["launched"]) == 1, row


@pytest.mark.parametrize("target", TARGETS)
def test_random_speculative_steps_are_covered_by_the_plan(spec_probes, target):
    """Random steps (each request verifies 0 to a random cap of drafts, some prefill, random
    contexts and layer sizes) compile nothing outside the plan; a plan whose decodes all verify k
    drafts misses kernels where a full verify takes more query blocks than a shorter one."""
    coverage = spec_probes[target]["coverage"]
    for label, row in coverage.items():
        assert row["steps"] >= 60 and row["kernels"] >= 8 and row["missing"] == 0, label
    for label in ("llama-3.1-8b k=4 fp8", "llama-3.1-70b k=2"):
        assert coverage[label]["missing_from_full_verify_only"] > 0, label


@pytest.mark.parametrize("target", TARGETS)
def test_speculative_decoding_adds_no_triton_attn_kernel_under_vllm_0_33(spec_probes, target):
    """What was measured: with k drafts, steps move between the 3D and the 2D kernel, but the 3D
    kernel's key does not depend on the query length and every sequence-count class still reaches
    both kernels, so the plan's keys are those of the plan without speculative decoding, and that
    plan misses nothing of the speculative sweeps."""
    document = spec_probes[target]
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


def test_vllms_defaults_keep_reshape_and_cache_with_aiter_on(spec_probes):
    """The reason triton_attn's plan gives for AITER's fused rope-and-cache: with
    VLLM_ROCM_USE_AITER=1 on gfx942, vLLM 0.33's default compilation does not run
    RopeKVCacheFusionPass (rotary embedding is not a custom op, and the KV-cache update splits the
    graph); in eager mode no pass runs at all."""
    document = spec_probes["gfx942"]["fused_rope_and_cache"]
    assert document["graphs"] == {
        "fuse_rope_kvcache": False,
        "rotary_embedding_custom_op": False,
        "splitting_ops_contain_kv_cache_update": True,
    }
    assert document["eager"]["fuse_rope_kvcache"] is False
