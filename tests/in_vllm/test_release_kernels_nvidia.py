"""vLLM's own Triton kernels as the plan traces them from each installed release for an NVIDIA
target (sm90), in a process of its own, as an NVIDIA request is planned: vLLM's config modules keep
the platform they were first imported under (kernel_probes.py, section 8)."""

from __future__ import annotations

import json
from collections import Counter

import kernel_probes as probes
import pytest
from release_support import empty_context_masks
from vllm_releases import since

from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.vllm.releases import installed_release, release_line
from kprecompile.warmup.planning import plan

pytestmark = [pytest.mark.vllm, pytest.mark.compiles, pytest.mark.slow, pytest.mark.vllm_process("kernels-nvidia")]


@pytest.fixture(scope="module")
def nvidia() -> dict[str, object]:
    """Every NVIDIA section, in this order: TRITON_ATTN and TRITON_MLA under vLLM's CUDA platform,
    the release's merge dispatcher, the CUDA selection, TRITON_MLA's plan at TP 2."""
    model = load_model("deepseek-v2-lite")
    tp2 = ServingParams(**probes.SERVING, tensor_parallel_size=2)
    selection = select(model, "vllm", "TRITON_MLA", environ={}, vllm_release=installed_release(), targets=[probes.SM90])
    return {
        "triton_attn": probes.triton_attn(probes.SM90),
        "triton_mla": probes.triton_mla(probes.SM90),
        "merge": probes.cuda_merge(),
        "selection": probes.cuda_selection(),
        "mla_tp2": probes.kernels(plan(Request(model, tp2, selection, (probes.SM90,)))),
    }


def test_triton_attn_on_nvidia_keys_and_coverage(nvidia, release):
    """TRITON_ATTN named on sm90 (vLLM's CUDA default is FLASH_ATTN), up to 0.18 (0.19+: test below): traced under
    vLLM's CUDA platform (e4m3fn's FP8 range), one kernel per integer class of the sequence count
    and none per KV storage class (NVIDIA's backend does not specialize on it); keys are the launch
    path's, random steps compile nothing outside the plan, and do outside a smaller plan."""
    document = nvidia["triton_attn"]
    assert document["choice"] == ["triton_attn", None]
    if release_line(release).tracing == "engine_step":
        return  # test_triton_attn_from_0_19_on_nvidia
    assert document["fp8_range"] == [-448.0, 448.0]
    # vLLM's CUDA launch of reshape-and-cache (16 warps, 10 stages; 8 and 4 under its ROCm platform).
    assert document["reshape_launch"] == [16, 10]
    expected = {
        "kernel_unified_attention_2d": 3,
        "kernel_unified_attention_3d": 2,
        "reduce_segments": 2,
        "reshape_and_cache_kernel_flash": 1,
    }
    probes.assert_triton_attn_up_to_0_18(document, expected)
    coverage = document["coverage"]
    assert coverage["steps"] >= 60 and coverage["kernels"] == 8 and coverage["missing"] == 0
    assert coverage["missing_from_smaller_plan"] > 0


def test_triton_attn_keys_on_nvidia_are_not_the_rocm_keys(nvidia, shared_dir):
    """The same steps under vLLM's ROCm platform (this release's ROCm process, which runs first)
    give other keys."""
    rocm = set(json.loads((shared_dir / probes.ROCM_TRITON_ATTN_KEYS).read_text()))
    assert rocm
    assert rocm.isdisjoint(key for row in nvidia["triton_attn"]["keys"] for key in row["traced"])


@pytest.mark.vllm_releases("0.33.0")
def test_triton_attn_from_0_19_on_nvidia(nvidia):
    """vLLM 0.33.0's TRITON_ATTN through its real metadata builder, KV-cache view and
    `do_kv_cache_update` + `forward` on sm90 (gfx942 and gfx950: test_release_kernels.py): keys are
    the launch path's; NVIDIA's backend has no 2 GiB pointer classes; random steps compile nothing
    outside their plan, and do outside a plan for 8 sequences; a plan without the layers whose keys
    cross 2 GiB and values do not misses nothing here."""
    document = nvidia["triton_attn"]
    # NVIDIA's backend has no 2 GiB pointer classes: one reshape-and-cache, 3 + 3 attention kernels.
    expected = {"kernel_unified_attention": 6, "reduce_segments": 3, "reshape_and_cache_kernel_flash": 1}
    for case in ("mistral-7b-v0.1", "llama-3.1-8b-instruct", "llama-3.1-8b-instruct fp8"):
        assert Counter(document[case]) == expected, case
    assert Counter(document["other_capture_sizes"]) == {
        "kernel_unified_attention": 5,
        "reduce_segments": 2,
        "reshape_and_cache_kernel_flash": 1,
    }
    assert document["fp8_range"] == [-448.0, 448.0]
    assert document["reshape_launch"] == [16, 10]
    probes.assert_triton_attn_from_0_19(document)
    assert document["coverage_0_19"]["missing_without_straddling_layers"] == 0


def test_triton_mla_on_nvidia_keys_and_coverage(nvidia, release):
    """TRITON_MLA's decode on sm90 under vLLM's CUDA platform: stage 1 and 2 for 4 KV splits up
    to 0.19, for each power-of-2 split count from 0.20; the prefill's merges there take vLLM's
    compiled CUDA merge (the release's own dispatcher launches no Triton kernel), so none is
    planned, but 0.26 and 0.27 mask empty context chunks with Triton on every platform. Keys are
    the launch path's; random decode steps compile nothing outside the plan, and do outside a
    plan of the prefill steps alone."""
    mla = nvidia["triton_mla"]
    assert mla["choice"] == ["triton_mla", None]
    # One split count (4) up to 0.19; from 0.20 one per power of 2 of the context (5 to 8192 tokens).
    splits = 5 if release_line(release).triton_mla_decode == "forward_mqa" and since(release, "0.20") else 1
    masks = empty_context_masks(
        release, probes.SERVING["max_num_seqs"], probes.SERVING["max_num_batched_tokens"], several_chunks=True
    )
    assert (
        mla["kernels"]
        == ["_fwd_grouped_kernel_stage1"] * splits
        + ["_fwd_kernel_stage2"] * splits
        + ["mask_empty_context_kernel"] * masks
    )
    assert nvidia["merge"] == 0
    keys = mla["keys"]
    assert keys["kernels"] == ["_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2"]
    assert keys["traced"][:1] == keys["launched"] and len(keys["launched"]) == 1
    coverage = mla["coverage"]
    assert coverage["steps"] == 20 and coverage["missing"] == 0 and coverage["missing_from_smaller_plan"] >= 2
    # At TP 2 too: vLLM's engine configuration for a serving host whose ranks its builder cannot see.
    assert nvidia["mla_tp2"] == mla["kernels"]


def test_the_cuda_selection_mirror_follows_the_releases_priority_list(nvidia):
    """Without a backend named, kprecompile's mirror takes the backend vLLM's CUDA platform ranks
    first among those whose compute-capability rule takes the target; where vLLM's class for a
    higher-ranked backend cannot be imported on a builder (FlashInfer not installed, CUTLASS MLA
    allocating on the GPU at import), the mirror's choice is that backend."""
    rows = nvidia["selection"]
    assert len(rows) == 8
    compared = [row for row in rows if not row["import_errors"]]
    assert all(row["mirror"] == row["vllm"] for row in compared), compared
    assert len(compared) >= 4
    for row in rows:
        assert row["mirror"] == row["vllm"] or row["mirror"] in row["import_errors"], row
    defaults = {(row["target"], row["model"]): row["mirror"] for row in rows}
    assert defaults["sm89", "deepseek-v2-lite"] == defaults["sm80", "deepseek-v2-lite"] == "TRITON_MLA"
    assert defaults["sm90", "llama-3.1-8b-instruct"] == "FLASH_ATTN"
