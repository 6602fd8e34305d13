"""vLLM's own Triton kernels as the plan traces them from each installed release, on ROCm targets
(gfx942, gfx950): plans, keys against Triton's launch path, random engine steps against the plan
(kernel_probes.py computes each section; NVIDIA's: test_release_kernels_nvidia.py)."""

from __future__ import annotations

import json
from collections import Counter

import kernel_probes as probes
import pytest
from release_support import empty_context_masks, kv_storage_classes
from vllm_releases import merges_per_launch, since

from kprecompile.vllm.releases import TESTED_RELEASES, release_line

pytestmark = [pytest.mark.vllm, pytest.mark.compiles, pytest.mark.slow, pytest.mark.vllm_process("kernels-rocm")]


@pytest.fixture(scope="module", autouse=True)
def block_fp8_linear():
    # First: it imports vLLM's model modules (some register operators at import) outside any
    # family's per-target re-import of vLLM's attention ops.
    return probes.block_fp8_linear()


@pytest.fixture(scope="module")
def plans():
    return probes.plans()


@pytest.fixture(scope="module")
def fp8_ranges():
    return probes.fp8_ranges()


@pytest.fixture(scope="module")
def rocm_attn_keys():
    return probes.keys()


@pytest.fixture(scope="module")
def coverage():
    return probes.coverage()


@pytest.fixture(scope="module")
def triton_attn(shared_dir):
    document = probes.triton_attn()
    # For the NVIDIA process's test that its keys are other keys (test_release_kernels_nvidia.py).
    keys = sorted({key for row in document.get("keys", []) for key in row["traced"]})
    (shared_dir / probes.ROCM_TRITON_ATTN_KEYS).write_text(json.dumps(keys))
    return document


@pytest.fixture(scope="module")
def triton_mla():
    return probes.triton_mla()


@pytest.fixture(scope="module")
def mla_merge():
    return probes.mla_merge()


@pytest.fixture(scope="module")
def aiter_fa_context():
    return probes.aiter_fa_context()


@pytest.fixture(scope="module")
def untraceable():
    return probes.untraceable()


def test_rocm_attn_kernels_are_the_ones_vllms_own_rule_launches(plans, release):
    """Prefix prefill on every model; the Triton paged decode only where vLLM's rule declines its
    HIP kernel (a sliding window; VLLM_ROCM_CUSTOM_PAGED_ATTN=0, which 0.33 no longer reads)."""
    classes = kv_storage_classes()
    prefill, decode = ["_fwd_kernel"] * classes, ["kernel_paged_attention_2d"] * classes
    assert plans["choice"] == ["rocm_attn", None]
    assert plans["llama-3.1-8b-instruct"] == plans["llama-3.1-8b-instruct fp8"] == prefill
    assert plans["mistral-7b-v0.1"] == plans["mistral-7b-v0.1 fp8"] == prefill + decode
    without_hip = plans["llama-3.1-8b-instruct VLLM_ROCM_CUSTOM_PAGED_ATTN=0"]
    assert without_hip == (prefill if since(release, "0.19") else prefill + decode)


def test_vllm_kernels_are_traced_under_the_targets_platform(fp8_ranges):
    # vLLM reads its platform's FP8 type at import: e4m3fnuz (+-240) on gfx942, e4m3fn (+-448) on gfx950.
    assert fp8_ranges == {"gfx942": [-240.0, 240.0], "gfx950": [-448.0, 448.0]}


def test_rocm_attn_traced_keys_equal_the_launch_paths_keys(rocm_attn_keys):
    prefill, decode = rocm_attn_keys
    # The launch path stops at the first kernel's launch; the trace sees each kernel of the step.
    assert prefill["kernels"] == ["_fwd_kernel", "kernel_paged_attention_2d"]
    assert prefill["traced"][:1] == prefill["launched"] and len(prefill["launched"]) == 1
    assert decode["kernels"] == ["kernel_paged_attention_2d"] and decode["traced"] == decode["launched"]
    assert prefill["traced"][1] == decode["traced"][0]


def test_rocm_attn_random_engine_steps_are_covered_by_the_plan(coverage):
    for case in ("mistral-7b-v0.1 auto", "mistral-7b-v0.1 fp8", "llama-3.1-8b-instruct auto"):
        assert coverage[case]["steps"] >= 50 and coverage[case]["kernels"] >= kv_storage_classes(), case
        assert coverage[case]["missing"] == 0, case
    # The same sweep against a plan without the KV caches over 2 GiB finds what it lacks, where
    # the size class specializes the kernels (Triton's buffer ops); one without the steps that
    # prefill lacks the prefix-prefill kernel, on every Triton (in an engine step the sweep's size
    # class is the whole allocation's, which its random contexts may leave over 2 GiB every time).
    assert coverage["negative control"]["missing"] == 2 * (kv_storage_classes() - 1)
    assert 1 <= coverage["decodes only"]["missing"] <= kv_storage_classes()


def test_triton_attn_kernels_keys_and_coverage(triton_attn, release):
    """TRITON_ATTN up to 0.18: reshape-and-cache, the 2D kernel (steps with a prefill, large
    decode batches) and the 3D kernel with its reduce (small decode batches), one per integer
    class of the sequence count and per KV storage class (0.19+: `test_triton_attn_from_0_19...`)."""
    document = triton_attn
    assert document["choice"] == ["triton_attn", None]
    if release_line(release).tracing == "engine_step":
        return
    # vLLM's ROCm launch of reshape-and-cache: 8 warps, 4 stages (16 and 10 under its CUDA platform).
    assert document["reshape_launch"] == [8, 4]
    # Per KV storage class (one where Triton has no buffer ops), but the reduce, which reads no KV cache.
    classes = kv_storage_classes()
    expected = {
        "kernel_unified_attention_2d": 3 * classes,
        "kernel_unified_attention_3d": 2 * classes,
        "reduce_segments": 2,
        "reshape_and_cache_kernel_flash": classes,
    }
    probes.assert_triton_attn_up_to_0_18(document, expected)
    coverage = document["coverage"]
    assert coverage["steps"] >= 60 and coverage["kernels"] >= 8 and coverage["missing"] == 0
    assert coverage["missing_from_smaller_plan"] > 0


# vLLM 0.33's TRITON_ATTN per ROCm plan (llama-3.1-8b and mistral-7b, 8 KV heads: 3D threshold 16):
# per KV storage class (under 2 GiB, over, keys over and values within) reshape-and-cache and the
# one attention kernel in 3D (1 sequence, 2..15, 16) and 2D (1, other, multiples of 16); the
# reduce after 3D once per integer class (it takes no KV cache).
TRITON_ATTN_0_33_ROCM = {"kernel_unified_attention": 18, "reduce_segments": 3, "reshape_and_cache_kernel_flash": 3}


@pytest.mark.vllm_releases("0.33.0")
def test_triton_attn_from_0_19_is_traced_through_the_releases_builder_and_kv_cache_view(triton_attn):
    """vLLM 0.33.0's TRITON_ATTN through its real metadata builder, KV-cache view and
    `do_kv_cache_update` + `forward`, on gfx942 and gfx950 (sm90: test_release_kernels_nvidia.py):
    keys are the launch path's (an FP8 KV cache takes an FP8 query); the 3D threshold follows the
    capture sizes (capture sizes whose nearest to 16 is 8 lose the 3D kernel for 16 sequences);
    dense random steps (mixed prefills, 3D-sized prefills, random layer sizes around 2 GiB, a
    sliding-window model, an FP8 KV cache, other capture sizes) compile nothing outside their plan,
    and do outside a plan for 8 sequences and one without the layers whose keys cross 2 GiB and
    values do not."""
    rocm = triton_attn
    for case in (
        "mistral-7b-v0.1",
        "llama-3.1-8b-instruct",
        "llama-3.1-8b-instruct fp8",
        "gfx950 llama-3.1-8b-instruct",
        "gfx950 llama-3.1-8b-instruct fp8",
    ):
        assert Counter(rocm[case]) == TRITON_ATTN_0_33_ROCM, case
    # Threshold 8: 3D for 1 and 2..8 sequences only.
    assert Counter(rocm["other_capture_sizes"]) == {
        "kernel_unified_attention": 15,
        "reduce_segments": 2,
        "reshape_and_cache_kernel_flash": 3,
    }
    assert rocm["fp8_range"] == [-240.0, 240.0]
    assert rocm["reshape_launch"] == [8, 4]
    probes.assert_triton_attn_from_0_19(rocm)
    assert rocm["coverage_0_19"]["missing_without_straddling_layers"] > 0


def test_triton_mla_decode_keys_and_coverage(triton_mla, release):
    """TRITON_MLA's decode (built as vLLM builds it, from a VllmConfig): the grouped stage 1 per KV
    storage class and a stage-2 reduce, for 4 KV splits up to 0.19, for each power-of-2 split
    count vLLM 0.20+ derives from the context (5 up to 8192 tokens); and the merges of its prefill
    with cached context, one chunk and two, where ROCm merges with Triton (up to 0.31)."""
    document = triton_mla
    assert document["choice"] == ["triton_mla", None]
    line = release_line(release)
    budget = probes.SERVING["max_num_batched_tokens"]
    per_step = merges_per_launch(release, budget) + merges_per_launch(
        release, budget, continuation=since(release, "0.28")
    )
    merges = ["merge_attn_states_kernel"] * (per_step if line.mla_merge == "triton" else 0)
    # 0.26 and 0.27 mask the context chunks some prefill has no context in (the two-chunk step's
    # second chunk, and a one-chunk step beside a new prompt) before merging.
    masks = ["mask_empty_context_kernel"] * empty_context_masks(
        release, probes.SERVING["max_num_seqs"], budget, several_chunks=True
    )
    if line.triton_mla_decode == "forward_mqa" and since(release, "0.20"):
        stage1 = ["_fwd_grouped_kernel_stage1"] * 5 * kv_storage_classes()
        assert document["kernels"] == stage1 + ["_fwd_kernel_stage2"] * 5 + masks + merges
    else:
        stage1 = ["_fwd_grouped_kernel_stage1"] * kv_storage_classes()
        assert document["kernels"] == stage1 + ["_fwd_kernel_stage2"] + masks + merges
    keys = document["keys"]
    assert keys["kernels"] == ["_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2"]
    assert keys["traced"][:1] == keys["launched"] and len(keys["launched"]) == 1
    coverage = document["coverage"]
    assert coverage["steps"] == 20 and coverage["missing"] == 0 and coverage["missing_from_smaller_plan"] >= 1


def test_mla_merge_keys_and_coverage(mla_merge, release):
    """vLLM's merge around ROCM_AITER_MLA's prefill with cached context where it is Triton on ROCm
    (up to 0.31; from 0.17 through vLLM's MLAAttention layer and its builder's metadata): with and
    without the merged log-sum-exp, each for every token count where the count is a constexpr;
    from 0.32 the release's own dispatcher takes its compiled operator on CDNA3 and newer, which
    is the reason the plan gives."""
    document = mla_merge
    if release_line(release).mla_merge == "compiled_on_cdna3":
        assert document["choice"][0] == "mla_merge" and "compiled merge_attn_states" in document["choice"][1]
        assert document["dispatch"] == {"gfx90a": 1, "gfx942": 0, "gfx950": 0}
        return
    assert document["choice"] == ["mla_merge", None]
    budget = probes.SERVING["max_num_batched_tokens"]
    final = merges_per_launch(release, budget)
    # The continuation merge (`accumulate_mla_context_chunk`) is in 0.28's MLA prefill on (read in
    # 0.28.0 and 0.29.0; 0.29.0 ran 63 merges, as 0.31.0 does).
    chunk = merges_per_launch(release, budget, continuation=since(release, "0.28"))
    # 0.26 and 0.27 mask the context chunks some prefill has no context in before merging, on
    # the first chunk (one-chunk step beside a new prompt) and on a later one (two chunks).
    seqs = probes.SERVING["max_num_seqs"]
    first_chunk_masks = empty_context_masks(release, seqs, budget, several_chunks=False)
    masks = empty_context_masks(release, seqs, budget, several_chunks=True)
    assert document["kernels"] == ["mask_empty_context_kernel"] * masks + ["merge_attn_states_kernel"] * (final + chunk)
    one_chunk, two_chunks = document["keys"]
    assert one_chunk["traced"][:1] == one_chunk["launched"]
    assert len(one_chunk["traced"]) == final + first_chunk_masks
    # Two chunks: the second chunk's mask (0.26 and 0.27), else the chunk merge (keeping the
    # log-sum-exp) launches first.
    assert two_chunks["traced"][:1] == two_chunks["launched"] and len(two_chunks["traced"]) == final + chunk + masks
    assert one_chunk["traced"][0] in two_chunks["traced"]
    coverage = document["coverage"]
    assert coverage["steps"] == 12 and coverage["kernels"] >= 2
    assert coverage["missing"] == 0 and coverage["missing_from_smaller_plan"] > 0
    # Where the merge specializes on token counts (from 0.20), the plan's steps as served miss.
    assert (coverage["missing_from_plan_as_served"] > 0) == since(release, "0.20")
    # A plan without the masks misses where vLLM launches them.
    assert (coverage["missing_from_plan_without_masks"] > 0) == (masks > 0)


def test_merges_are_widened_once_per_trace_and_lose_nothing(release):
    """A plan widens each merge kernel to every token count once per trace (the first step that
    launches it), not once per step: the same keys as widening every step on its own, and more
    than the steps as served where the merge specializes on token counts (Triton's merge from
    0.20 to 0.31)."""
    document = probes.merge_widening()
    assert document["steps"] >= 2 and document["kernels"] > 0
    assert document["missing_from_once"] == document["missing_from_per_step"] == 0
    widens = since(release, "0.20") and release_line(release).mla_merge == "triton"
    assert (document["widened"] > 0) == widens, document


def test_aiter_fa_context_keys_and_coverage(aiter_fa_context, release):
    """vLLM's gather and merge around ROCM_AITER_FA's prefill with cached context: the gather's
    key is the launch path's; random request mixes through vLLM's own metadata builder compile
    nothing outside the plan, and do outside a plan without the large KV caches. From 0.19 the
    step is the engine's (its attention layer, KV-cache view and builder): the merge is Triton up
    to 0.31 (compiled on CDNA3 after), the shuffled layout adds its Triton cache write, decodes
    are mixed in, and with speculative decoding the verify steps run AITER's Triton unified
    attention."""
    document = aiter_fa_context
    assert document["choice"] == ["aiter_fa_context", None]
    if "aiter_lacks" in document:
        # The release's ROCM_AITER_FA imports what the installed amd-aiter lacks (0.31.0: AITER's
        # Gluon paged decode): the plan fails the family naming the module, and compiles nothing.
        assert document["aiter_lacks"].startswith("aiter.") and document["kernels_planned"] == 0
        assert f"without {document['aiter_lacks']}: ROCM_AITER_FA imports" in document["plan_error"]
        return
    keys = document["keys"]
    coverage = document["coverage"]
    assert coverage["missing"] == 0 and coverage["missing_from_smaller_plan"] > 0
    line = release_line(release)
    if line.tracing == "engine_step":
        kernels = document["kernels"]
        # ROCm merges with Triton up to 0.31: with and without the merged log-sum-exp, each for
        # every token count where the count is a constexpr.
        merges = 2 * merges_per_launch(release, probes.SERVING["max_num_batched_tokens"])
        merges *= line.mla_merge == "triton"
        gather = "cp_mha_gather_cache_kernel"
        assert set(kernels["default"]) == set(kernels["fp8"]) == {gather, *(["merge_attn_states_kernel"] * merges)}
        assert kernels["default"].count("merge_attn_states_kernel") == merges
        assert kernels["default"].count(gather) == kernels["fp8"].count(gather) >= 6
        # The shuffled layout's gather reads another layout, and its KV-cache write is Triton (the
        # layout and VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT arrived in 0.15; read in 0.13.0 to 0.18.1).
        # 0.15 takes it only with AITER's master switch on (`is_shuffle_kv_cache_enabled`:
        # `cls._AITER_ENABLED and cls._SHUFFLE_KV_CACHE_ENABLED`, vllm/_aiter_ops.py:946 in 0.15.0
        # and 0.15.1); from 0.16 the variable alone (read in 0.16.0, 0.17.0, 0.25.1, 0.31.0, 0.33.0).
        # The probe's engine leaves the switch off: the variable alone shuffles nothing in 0.15. One
        # cache write per KV storage class (one on Triton 3.5, 0.15's own, which has no buffer ops).
        writes = kv_storage_classes()
        assert kernels["shuffle"].count("reshape_and_cache_shuffle_kernel") == (writes if since(release, "0.16") else 0)
        shuffled = ["shuffle"]
        if since(release, "0.15") and not since(release, "0.16"):
            assert kernels["shuffle_aiter"].count("reshape_and_cache_shuffle_kernel") == writes
            shuffled.append("shuffle_aiter")
        for label in shuffled:
            assert kernels[label].count("cp_mha_gather_cache_kernel") == kernels["default"].count(
                "cp_mha_gather_cache_kernel"
            )
        # One gather per chunk, each with its own slices of the builder's tables; where the merge
        # is Triton, two more: the chunk merge (after the 2nd and 3rd chunks, one kernel) and the
        # final one, as launched for the step's own token count.
        traced = dict(zip(keys["traced"], keys["traced_kernels"], strict=True))
        gathers = [key for key in keys["traced"] if traced[key] == gather]
        assert len(gathers) == 3 and [key for key in keys["launched"] if key in gathers] == gathers
        assert set(keys["launched"]) <= set(traced)
        assert len(keys["launched"]) == 3 + (2 if merges else 0)
        assert coverage["steps"] == 60 and coverage["kernels"] >= 6
        speculative = document["speculative"]
        launched = speculative["keys"]["launched"]
        assert len(launched) == 1 and speculative["keys"]["traced"][:1] == launched
        assert speculative["coverage"]["missing"] == 0
        if not since(release, "0.17"):
            # Up to 0.16 the builder's decode threshold is one token: verify steps are extends,
            # gathered and merged as any other (read in 0.13.0's to 0.17.1's rocm_aiter_fa.py).
            assert set(speculative["kernels"]) == set(kernels["default"])
            return
        # From 0.17 verify steps are decodes (`supports_spec_as_decode`), through AITER's Triton
        # unified attention.
        assert set(speculative["kernels"]) == {
            "cp_mha_gather_cache_kernel",
            "kernel_unified_attention_2d",
            "kernel_unified_attention_3d",
            "reduce_segments",
            *(["merge_attn_states_kernel"] if merges else []),
        }
        assert speculative["coverage"]["missing_without_speculation"] > 0
        # Every batch size is needed: AITER's 2D/3D choice and segment count move with it.
        assert speculative["coverage"]["missing_from_class_representatives"] > 0
        return
    assert document["kernels"].count("merge_attn_states_kernel") == 2
    assert set(document["kernels"]) == {"cp_mha_gather_cache_kernel", "merge_attn_states_kernel"}
    assert keys["traced"][:1] == keys["launched"] and len(keys["launched"]) == 1
    assert coverage["steps"] == 16 and coverage["kernels"] > 2


def test_block_fp8_linear_keys_and_coverage(block_fp8_linear, release):
    """DeepSeek-R1's block-FP8 linear layers: the engine rule is the GEMM path vLLM's own linear
    method chooses per target and AITER setting; planned keys are the launch path's (the group
    quantization, eager, up to 0.18; the GEMM under the default config and an MI300X table); random
    layers, token counts and devices compile nothing outside the plan, and do outside a plan
    without the M multiples of 16 or (on gfx942) without the tuned devices."""
    document = block_fp8_linear
    choices, chose = document["choices"], document["vllm_chose"]
    for setting, path in chose.items():
        planned = choices[setting] is None
        assert planned == (path in ("_run_triton", "TritonFp8BlockScaledMMKernel")), setting
    assert choices["gfx950 aiter=0"] is None and choices["gfx942 aiter=0"] is None
    rule = release_line(release).aiter_block_fp8
    if rule == "aiter_blockscale":
        # AITER's kernel: CK for every layer with the installed AITER (test_release_linear.py).
        assert "nothing to compile" in choices["gfx950 aiter=1"] and "nothing to compile" in choices["gfx942 aiter=1"]
    elif rule == "vllm_tuned_list":
        # AITER on every arch; its Triton GEMM for vLLM's listed shapes on gfx950 is said, not planned.
        assert all("does not trace those" in choices[f"{arch} aiter=1"] for arch in ("gfx942", "gfx950"))
    else:
        assert choices["gfx950 aiter=1"] is None and "e4m3fnuz" in choices["gfx942 aiter=1"]
    keys = document["keys"]
    # vLLM's eager group quantization on ROCm is its Triton kernel up to 0.15 (`QuantFP8.forward_hip`
    # falls back to `forward_cuda`, whose `per_token_group_quant_fp8` launches Triton off CUDA); from
    # 0.16 `forward_hip` quantizes groups natively (torch) unless asked for Triton or AITER's
    # (input_quant_fp8.py; run: 0.15.1 Triton, 0.17.1 none).
    quantization = [] if since(release, "0.16") else ["_per_token_group_quant_fp8"]
    assert keys["eager quantization"]["kernels"] == [*quantization, "_w8a8_triton_block_scaled_mm"]
    assert keys["eager quantization"]["traced"][:1] == keys["eager quantization"]["launched"]
    for row in ("gemm default config", "gemm MI300X table"):
        assert keys[row]["kernels"] == ["_w8a8_triton_block_scaled_mm"]
        assert keys[row]["traced"] == keys[row]["launched"], row
    coverage = document["coverage"]
    for target in ("gfx942", "gfx950"):
        assert coverage[target]["steps"] == 40 and coverage[target]["kernels"] >= 5, target
        assert coverage[target]["missing"] == 0 and coverage[target]["missing_without_div16"] > 0, target
    assert coverage["gfx942"]["missing_untuned_only"] > 0


def test_a_vllm_family_that_cannot_be_traced_fails_and_the_rest_stands(untraceable):
    """A release whose backend moved (here: its class renamed) fails that family only: a
    failed row (the command exits 1), not a skipped one."""
    document = untraceable
    assert document["planned"] == ["pa_prefill"] and document["kernels"] > 0
    assert document["failed"] == ["rocm_attn"] and document["skip_reason"] is None
    assert document["error"].startswith("tracing rocm_attn failed at forward(")
    assert (
        "NoSuchBackend" in document["error"]
        and f"tested against vLLM {', '.join(TESTED_RELEASES)}" in document["error"]
    )
