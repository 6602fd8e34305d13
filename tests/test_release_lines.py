"""vLLM release lines: one record each (`kprecompile/vllm/releases.py`), read by every rule.

Each line's rules are checked against what the tests assert of the releases of that line
(`RULES`: tests/test_engines.py on the mirrors, tests/test_vllm.py and tests/test_vllm_linear.py
against the real code of 0.11.2, 0.12.0 and 0.33.0), and the selection, the capture sizes and
the families are checked to follow every record's fields. Adding a line is one record and its
row in `RULES` (a record without one fails here).
"""

from __future__ import annotations

import pytest

from kprecompile.errors import InputError
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import FamilyChoice, Selection, select
from kprecompile.shapes import FAMILIES
from kprecompile.shapes._vllm_backend import PagedEngineStep
from kprecompile.shapes.aiter_fa_context import EngineStep
from kprecompile.vllm.releases import (
    CUDA_GQA,
    CUDA_GQA_SM100,
    CUDA_MLA,
    CUDA_MLA_SM100,
    RELEASE_LINES,
    ReleaseLine,
    capture_sizes,
    release_line,
)
from kprecompile.warmup.planning import planned_line, planned_shapes

DEEPSEEK = load_model("deepseek-r1")
V2_LITE = load_model("deepseek-v2-lite")
LLAMA = load_model("llama-3.1-8b-instruct")
MISTRAL = load_model("mistral-7b-v0.1")
SMALL = ServingParams(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=2048)

# vLLM's default capture sizes up to 0.19: the size grid alone, 512 at most on every GPU.
CAPTURE_UP_TO_0_19 = {"capture_batched_tokens": False, "capture_ceiling_sm100": 512, "capture_decodes": "none"}
# The rules of 0.11 to 0.18 that 0.19 changed, as the tests assert them of 0.11.2 and 0.12.0.
UP_TO_0_18 = {
    # test_vllm.py: test_the_cuda_selection_mirror_follows_the_releases_priority_list;
    # test_engines.py: test_nvidia_targets_take_vllms_cuda_selection (CUTLASS_MLA on sm100).
    "cuda_mla_priorities_sm100": CUDA_MLA_SM100,
    # in_vllm/test_release_capture.py (the release's own rule, on gfx942, sm90 and sm100).
    **CAPTURE_UP_TO_0_19,
    "backend_variable": True,
    # test_vllm.py: test_triton_attn_kernels_keys_and_coverage, test_aiter_fa_context_keys_and_coverage.
    "tracing": "call_site",
    # test_vllm.py: test_triton_mla_decode_keys_and_coverage (4 KV splits, its prefill merges).
    "triton_mla_decode": "forward_decode",
    "triton_mla_fp8_kv_cache": False,
    # test_vllm.py: test_a_cold_cache_is_warmed_beside_the_load... (MLA decode's Triton reduce).
    "aiter_mla_triton_reduce": True,
    # test_vllm.py: test_mla_merge_keys_and_coverage; test_engines.py: test_aiter_backends_list_vllms_kernels...
    "mla_merge": "triton",
    # test_engines.py: test_a_block_fp8_model_on_nvidia...; test_vllm_linear.py.
    "cuda_sm89_block_fp8": "triton_gemm",
    # test_engines.py: test_block_fp8_linear_runs_where_vllm_takes_its_triton_gemm; test_vllm.py.
    "aiter_block_fp8": "ck_on_gfx942",
    # in_vllm/test_release_aiter_fa.py: test_random_steps_through_the_real_builder_and_impl_are_planned
    # (0.12.0: its sweeps miss the windowed decodes without them; 0.11 has no unified attention).
    "aiter_fa_windowed_decode": "unified",
    # ROCM_AITER_FA takes no sinks (test_engines.py: gpt-oss under AITER's flags).
    "aiter_fa_sinks": False,
}
# The same since 0.11 (test_engines.py and test_vllm.py's CUDA and ROCm selection tests).
EVERY_LINE = {
    # test_flag_defaults.py: AITER's FP4 BMM on gfx950 alone, but in 0.15 and 0.16.
    "fp4_bmm_targets": "cdna4",
    "rocm_gqa_backends": ("ROCM_AITER_UNIFIED_ATTN", "ROCM_AITER_FA", "TRITON_ATTN", "ROCM_ATTN"),
    "cuda_mla_priorities": CUDA_MLA,
    "cuda_gqa_priorities": CUDA_GQA,
    "cuda_gqa_priorities_sm100": CUDA_GQA_SM100,
}
ALL_MLA = ("ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA", "TRITON_MLA")
SM100_MLA_FROM_0_15 = ("FLASHINFER_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")
# 0.21.0's platforms/cuda.py: TOKENSPEED_MLA behind FLASHINFER_MLA.
SM100_MLA_FROM_0_21 = ("FLASHINFER_MLA", "TOKENSPEED_MLA", *SM100_MLA_FROM_0_15[1:])
CAPTURE_FROM_0_31 = {
    "capture_batched_tokens": True,
    "capture_ceiling_sm100": 1024,
    "capture_decodes": "speculative_and_max_num_seqs",
}
# The rules from 0.19 on as the tests assert them of 0.33.0 (and of the releases the matrix runs,
# docs/release-matrix.md), but the capture sizes.
FROM_0_19 = {
    **EVERY_LINE,
    "rocm_mla_backends": ALL_MLA,
    # test_engines.py: test_each_release_line_selects_as_that_release_does (0.33.0 rows).
    "gqa_rule": "priority_list",
    "backend_variable": False,
    # test_vllm.py: CLI_CASES "none" (0.33 finds no backend for pages of one token).
    "aiter_mla_for_block_size_1": False,
    # test_engines.py: test_nvidia_targets_take_vllms_cuda_selection (FLASHINFER_MLA on sm100; read
    # in 0.15.0's to 0.20.0's platforms/cuda.py).
    "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_15,
    "capture_scales_with_speculation": True,
    # test_vllm.py: test_triton_attn_from_0_19_is_traced_through_the_releases_builder_and_kv_cache_view.
    "tracing": "engine_step",
    "triton_mla_decode": "forward_mqa",
    "triton_mla_fp8_kv_cache": True,
    "aiter_mla_triton_reduce": False,
    # in_vllm/test_release_kernels.py: the release's own dispatcher merges with Triton on ROCm up to
    # 0.31 (0.25.1: gfx90a, gfx942 and gfx950), with its compiled operator on CDNA3 from 0.32.
    "mla_merge": "triton",
    # in_vllm/test_release_linear.py: vLLM's FP8 Marlin refuses sm89 and newer up to 0.28.
    "cuda_sm89_block_fp8": "triton_gemm",
    # Read in 0.13.0 to 0.30.0: AITER on every arch, vLLM's own is_triton_gemm_w8a8_tuned list.
    "aiter_block_fp8": "vllm_tuned_list",
    # in_vllm/test_release_aiter_fa.py: windowed one-token decodes run AITER's paged attention with
    # the window (0.19.1: nothing missed without them), AITER's unified attention from 0.23 (0.25.1:
    # the random steps miss them without) until 0.33 trims the block table for its paged kernel.
    "aiter_fa_windowed_decode": "paged",
    # in_vllm/test_release_spec.py and test_engines.py: gpt-oss (sinks) under AITER's flags takes
    # ROCM_AITER_UNIFIED_ATTN up to 0.22 (vLLM's ROCM_AITER_FA refuses sinks), ROCM_AITER_FA from 0.23.
    "aiter_fa_sinks": False,
}
# The rules of 0.13 as the tests assert them of 0.13.0, read in 0.13.0's to 0.17.1's
# platforms/rocm.py: the 0.12 selector, pages of one token on AITER's MLA (in_vllm/test_release_cli.py,
# CLI_CASES "none").
FROM_0_13 = {
    **EVERY_LINE,
    **UP_TO_0_18,
    "rocm_mla_backends": ALL_MLA,
    "gqa_rule": "named_then_unified_flag",
    "aiter_mla_for_block_size_1": True,
    # test_engines.py: test_capture_sizes_follow_the_release (0.13 on: x (1 + spec)).
    "capture_scales_with_speculation": True,
    # The engine's own step from 0.13 (its TRITON_ATTN metadata carries the builder's 3D
    # threshold; docs/release-matrix.md, 0.13.0's row).
    "tracing": "engine_step",
    "aiter_block_fp8": "vllm_tuned_list",
}
# 0.15's config/attention.py no longer reads VLLM_ATTENTION_BACKEND nor
# VLLM_V1_USE_PREFILL_DECODE_ATTENTION (--attention-backend, --attention-config).
FROM_0_15 = {**FROM_0_13, "backend_variable": False, "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_15}
# What the tests assert of a release of each line, field by field.
RULES: dict[str, dict[str, object]] = {
    "0.11.2": {
        **EVERY_LINE,
        **UP_TO_0_18,
        # test_engines.py: test_rocm_aiter_triton_mla_arrived_after_0_11.
        "rocm_mla_backends": ("ROCM_AITER_MLA", "TRITON_MLA"),
        # test_engines.py: test_each_release_line_selects_as_that_release_does (0.11.2 rows).
        "gqa_rule": "aiter_flags_first",
        # test_vllm.py: CLI_CASES "none" (0.11 and 0.12 take AITER's MLA for pages of one token).
        "aiter_mla_for_block_size_1": True,
        "capture_scales_with_speculation": False,
        "aiter_fa_windowed_decode": "paged",
    },
    "0.12.0": {
        **EVERY_LINE,
        **UP_TO_0_18,
        "rocm_mla_backends": ALL_MLA,
        "gqa_rule": "named_then_unified_flag",
        "aiter_mla_for_block_size_1": True,
        # test_engines.py: test_capture_sizes_follow_the_release (0.11 and 0.12: 2 x max-num-seqs).
        "capture_scales_with_speculation": False,
    },
    "0.13.0": FROM_0_13,
    # 0.15.1's and 0.16.0's _aiter_ops.py: `is_fp4bmm_enabled` on every GPU.
    "0.15.0": {**FROM_0_15, "fp4_bmm_targets": "every"},
    # 0.16.0's v1/attention/backends/mla/triton_mla.py: `forward_mqa`, 4 KV splits.
    "0.16.0": {**FROM_0_15, "triton_mla_decode": "forward_mqa", "fp4_bmm_targets": "every"},
    # 0.17.1's _aiter_ops.py: `is_fp4bmm_enabled` on gfx950 only.
    "0.17.1": {**FROM_0_15, "triton_mla_decode": "forward_mqa"},
    # 0.18.1's platforms/rocm.py: a list by AITER's flags, then TRITON_ATTN; MLA by AITER's MLA flag
    # alone. Its impl passes the window to AITER's paged attention (its rocm_aiter_fa.py); its
    # triton_mla.py takes fp8 (in_vllm: its TRITON_MLA runs).
    "0.18.1": {
        **FROM_0_15,
        "gqa_rule": "aiter_flags_list",
        "aiter_mla_for_block_size_1": False,
        "aiter_fa_windowed_decode": "paged",
        "triton_mla_decode": "forward_mqa",
        "triton_mla_fp8_kv_cache": True,
    },
    **{
        release: {**FROM_0_19, **capture}
        for release, capture in (
            ("0.19.1", CAPTURE_UP_TO_0_19),
            # in_vllm/test_release_capture.py: max-num-batched-tokens captured from 0.20.1 (0.20.0's
            # run, 2026-12-05: not captured), sm100's ceiling of 1024 from 0.28, speculative decode
            # batches from 0.29, max-num-seqs from 0.31.
            ("0.20.0", CAPTURE_UP_TO_0_19),
            ("0.20.1", {**CAPTURE_UP_TO_0_19, "capture_batched_tokens": True}),
            (
                "0.22.1",
                {
                    **CAPTURE_UP_TO_0_19,
                    "capture_batched_tokens": True,
                    "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_21,
                },
            ),
            (
                "0.25.1",
                {
                    **CAPTURE_UP_TO_0_19,
                    "capture_batched_tokens": True,
                    "aiter_fa_sinks": True,
                    "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_21,
                    "aiter_fa_windowed_decode": "unified",
                },
            ),
            (
                "0.28.0",
                {
                    **CAPTURE_UP_TO_0_19,
                    "capture_batched_tokens": True,
                    "capture_ceiling_sm100": 1024,
                    "aiter_fa_sinks": True,
                    "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_21,
                    "aiter_fa_windowed_decode": "unified",
                },
            ),
            (
                "0.30.0",
                {
                    "capture_batched_tokens": True,
                    "capture_ceiling_sm100": 1024,
                    "capture_decodes": "speculative",
                    "cuda_sm89_block_fp8": "marlin",
                    "aiter_fa_sinks": True,
                    "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_21,
                    "aiter_fa_windowed_decode": "unified",
                },
            ),
            (
                "0.31.0",
                {
                    **CAPTURE_FROM_0_31,
                    "cuda_sm89_block_fp8": "marlin",
                    "aiter_block_fp8": "aiter_blockscale",
                    "aiter_fa_sinks": True,
                    "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_21,
                    "aiter_fa_windowed_decode": "unified",
                },
            ),
            (
                "0.32.0",
                {
                    **CAPTURE_FROM_0_31,
                    "cuda_sm89_block_fp8": "marlin",
                    "aiter_block_fp8": "aiter_blockscale",
                    "mla_merge": "compiled_on_cdna3",
                    "aiter_fa_sinks": True,
                    "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_21,
                    "aiter_fa_windowed_decode": "unified",
                },
            ),
            (
                "0.33.0",
                {
                    **CAPTURE_FROM_0_31,
                    "cuda_sm89_block_fp8": "marlin",
                    "aiter_block_fp8": "aiter_blockscale",
                    "mla_merge": "compiled_on_cdna3",
                    "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_21,
                    "aiter_fa_windowed_decode": "trimmed_paged",
                    "aiter_fa_sinks": True,
                },
            ),
            (
                "0.34.0",
                {
                    # test_release_capture.py (0.34.0): prefill and decode graphs sized apart, and
                    # sm100's grids up to 8,192 tokens.
                    **CAPTURE_FROM_0_31,
                    "capture_ceiling_sm100": 8192,
                    "capture_decodes": "split_prefill_decode",
                    "cuda_sm89_block_fp8": "marlin",
                    "aiter_block_fp8": "aiter_blockscale",
                    "mla_merge": "compiled_on_cdna3",
                    "cuda_mla_priorities_sm100": SM100_MLA_FROM_0_21,
                    "aiter_fa_windowed_decode": "trimmed_paged",
                    "aiter_fa_sinks": True,
                },
            ),
        )
    },
}


def test_the_lines_follow_one_another_and_each_has_its_rules_row():
    """Oldest first, each named after its first minor release; a release belongs to the last line
    it reaches; every line has a release in `RULES`, and every field is in each row."""
    assert [line.since for line in RELEASE_LINES] == sorted({line.since for line in RELEASE_LINES})
    for line in RELEASE_LINES:
        assert line.name == ".".join(map(str, line.since[:2]))
        assert release_line(line.first_release) is line
    covered = {release_line(release).name for release in RULES}
    assert covered == {line.name for line in RELEASE_LINES}
    fields = set(ReleaseLine.__dataclass_fields__) - {"name", "since"}
    for release, row in RULES.items():
        assert set(row) == fields, release
    releases = ("0.14.1", "0.15.1", "0.16.9", "0.17.9", "0.18.9", "0.19.1", "0.20.0", "0.20.2")
    lines = ["0.13", "0.15", "0.16", "0.17", "0.18", "0.19", "0.19", "0.20"]
    assert [release_line(release).name for release in releases] == lines
    assert release_line("0.30.0").name == "0.29" and release_line("0.40").name == RELEASE_LINES[-1].name
    for too_old in ("0.11.1", "0.10.2", "vllm"):
        with pytest.raises(InputError, match="expected a vLLM release, 0.11.2 or newer"):
            release_line(too_old)


@pytest.mark.parametrize("release", RULES)
def test_each_lines_rules_are_what_the_tests_assert_of_its_releases(release):
    line = release_line(release)
    assert {field: getattr(line, field) for field in RULES[release]} == RULES[release]


@pytest.mark.parametrize("line", RELEASE_LINES, ids=lambda line: line.name)
def test_the_rocm_selection_follows_every_records_rules(line):
    release = line.first_release

    def chosen(model, engine="vllm-aiter", environ=None, requested=None, **options):
        return select(model, engine, requested, environ or {}, vllm_release=release, **options)

    named = chosen(LLAMA, "vllm", {"VLLM_ATTENTION_BACKEND": "ROCM_AITER_UNIFIED_ATTN"})
    assert (named.attention_backend == "ROCM_AITER_UNIFIED_ATTN") == line.backend_variable
    for model, offered, every in ((DEEPSEEK, line.rocm_mla_backends, ALL_MLA), (LLAMA, line.rocm_gqa_backends, ())):
        for backend in offered:
            assert chosen(model, "vllm", requested=backend).attention_backend == backend
        for backend in set(every) - set(offered):
            with pytest.raises(InputError, match=f"got '{backend}', expected one of {', '.join(offered)} for"):
                chosen(model, requested=backend)
    # AITER on (the default engine): nothing set, the unified-attention flag, its backend named.
    gqa = (
        chosen(LLAMA).attention_backend,
        chosen(LLAMA, environ={"VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION": "1"}).attention_backend,
        chosen(LLAMA, requested="ROCM_AITER_UNIFIED_ATTN").attention_backend,
    )
    assert (
        gqa
        == {
            "aiter_flags_first": ("ROCM_AITER_FA", "ROCM_AITER_FA", "ROCM_AITER_FA"),
            "named_then_unified_flag": ("ROCM_AITER_FA", "ROCM_AITER_UNIFIED_ATTN", "ROCM_AITER_UNIFIED_ATTN"),
            "aiter_flags_list": ("ROCM_AITER_FA", "ROCM_AITER_UNIFIED_ATTN", "ROCM_AITER_UNIFIED_ATTN"),
            "priority_list": ("ROCM_ATTN", "ROCM_ATTN", "ROCM_AITER_UNIFIED_ATTN"),
        }[line.gqa_rule]
    )
    # AITER off, the prefill/decode split asked by its variable, which vLLM reads up to 0.14.
    split = chosen(LLAMA, "vllm", {"VLLM_V1_USE_PREFILL_DECODE_ATTENTION": "1"}).attention_backend
    read = line.backend_variable or line.gqa_rule == "priority_list"  # from 0.19 ROCM_ATTN anyway
    assert split == ("ROCM_ATTN" if read else "TRITON_ATTN")
    one_token_pages = chosen(DEEPSEEK, "vllm", block_size=1).attention_backend
    assert one_token_pages == ("ROCM_AITER_MLA" if line.aiter_mla_for_block_size_1 else "TRITON_MLA")
    aiter_mla = chosen(DEEPSEEK)
    assert aiter_mla.attention_backend == "ROCM_AITER_MLA"
    assert ("mla_decode" in aiter_mla.planned) == line.aiter_mla_triton_reduce
    [merge] = [choice for choice in aiter_mla.choices if choice.family == "mla_merge"]
    assert ("compiled merge_attn_states" in merge.skip_reason) == (line.mla_merge == "compiled_on_cdna3")
    [linear] = [choice for choice in aiter_mla.choices if choice.family == "block_fp8_linear"]
    if line.aiter_block_fp8 == "aiter_blockscale":
        assert linear.backend == "AiterFp8BlockScaledMMKernel" and "nothing to compile" in linear.skip_reason
    elif line.aiter_block_fp8 == "vllm_tuned_list":
        assert linear.backend == "AITER" and "does not trace those" in linear.skip_reason
    else:
        assert "e4m3fnuz" in linear.skip_reason_on("gfx942") and linear.skip_reason_on("gfx950") is None


@pytest.mark.parametrize("line", RELEASE_LINES, ids=lambda line: line.name)
def test_the_cuda_selection_follows_every_records_priority_lists(line):
    release = line.first_release

    def backend(model, target):
        return select(model, "vllm", None, {}, vllm_release=release, targets=[TARGETS[target]]).attention_backend

    assert backend(V2_LITE, "sm90") == line.cuda_mla_priorities[0]
    assert backend(V2_LITE, "sm100") == line.cuda_mla_priorities_sm100[0]
    assert backend(LLAMA, "sm90") == line.cuda_gqa_priorities[0]
    assert backend(LLAMA, "sm100") == line.cuda_gqa_priorities_sm100[0]
    sm89 = select(DEEPSEEK, "vllm", None, {}, vllm_release=release, targets=[TARGETS["sm89"]])
    [linear] = [choice for choice in sm89.choices if choice.family == "block_fp8_linear"]
    assert ("Marlin" in (linear.skip_reason or "")) == (line.cuda_sm89_block_fp8 == "marlin")


@pytest.mark.parametrize("line", RELEASE_LINES, ids=lambda line: line.name)
def test_the_capture_sizes_follow_every_records_rule(line):
    release = line.first_release
    speculative = (1, 2, 4, 8, 16) if line.capture_scales_with_speculation else (1, 2, 4, 8)
    assert capture_sizes(release, 4, 2048, 2)[:5] == speculative
    assert (100 in capture_sizes(release, 64, 100, 1)) == line.capture_batched_tokens
    assert max(capture_sizes(release, 1024, 8192, 1, target=TARGETS["sm100"])) == line.capture_ceiling_sm100
    assert max(capture_sizes(release, 1024, 8192, 1, target=TARGETS["sm90"])) == 512
    # Four requests verifying two drafts each: 12 tokens, off the size grid, captured as a decode batch.
    assert (12 in capture_sizes(release, 8, 2048, 3)) == (line.capture_decodes != "none")
    with_max_num_seqs = ("speculative_and_max_num_seqs", "split_prefill_decode")
    assert (3 in capture_sizes(release, 3, 2048, 1)) == (line.capture_decodes in with_max_num_seqs)


@pytest.mark.parametrize("line", RELEASE_LINES, ids=lambda line: line.name)
def test_the_families_follow_every_records_rules(line):
    """The families of vLLM's kernels read the planned line, never the installed vLLM (none here)."""
    engine_steps = line.tracing == "engine_step"
    for family in ("triton_attn", "rocm_attn"):
        shapes = FAMILIES[family].enumerate_shapes(LLAMA, SMALL, line)
        assert shapes and all(isinstance(shape, PagedEngineStep) == engine_steps for shape in shapes), family
    context = FAMILIES["aiter_fa_context"].enumerate_shapes(LLAMA, SMALL, line)
    assert context and all(isinstance(shape, EngineStep) == engine_steps for shape in context)
    windowed = FAMILIES["aiter_fa_context"].enumerate_shapes(MISTRAL, SMALL, line)
    one_token_decodes = any(max(shape.query_lens) == 1 for shape in windowed)
    assert one_token_decodes == (not engine_steps or line.aiter_fa_windowed_decode == "unified")
    mla = FAMILIES["triton_mla"].enumerate_shapes(V2_LITE, SMALL, line)
    assert {(shape.decode_entry, shape.merge) for shape in mla} == {(line.triton_mla_decode, line.mla_merge)}
    fp8 = ServingParams(max_num_seqs=4, kv_cache_dtype="fp8")
    refused = FAMILIES["triton_mla"].skip_reason(V2_LITE, fp8, TARGETS["gfx942"], line)
    assert (refused is None or "refuses an FP8 KV cache" not in refused) == line.triton_mla_fp8_kv_cache
    with pytest.raises(ValueError, match="triton_attn runs vLLM's own kernels: plan it for a vLLM release line"):
        FAMILIES["triton_attn"].enumerate_shapes(LLAMA, SMALL, None)


def test_planning_gives_the_families_the_selections_release_line():
    """`--vllm-version 0.33.0` on a builder with another vLLM (or none): the families' shapes are
    0.33's engine steps, whatever is installed."""
    choices = (FamilyChoice("triton_attn", "TRITON_ATTN"),)
    for release, step in (("0.33.0", PagedEngineStep), ("0.12.0", None)):
        selection = Selection("vllm", "TRITON_ATTN", {}, choices, release)
        assert planned_line(selection) is release_line(release)
        [shapes] = planned_shapes(LLAMA, SMALL, selection).values()
        assert all(isinstance(shape, PagedEngineStep) == (step is not None) for shape in shapes)
    aiter = select(DEEPSEEK, "aiter", environ={})
    assert planned_line(aiter) is None and planned_shapes(DEEPSEEK, SMALL, aiter)
