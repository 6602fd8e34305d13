"""Block-FP8 linear layers (DeepSeek-R1, TP 8) where each real vLLM release runs them, one target
per process (tests/vllm_linear_probe.py): the plan's rule is the path vLLM's own linear method
chooses, and where that path is vLLM's Triton GEMM on an NVIDIA GPU (sm89 up to 0.18) the plan's
keys are the launch path's, compiled for sm89 for real, and a random sweep is covered."""

from __future__ import annotations

import pytest
from test_vllm import HERE, SUPPORTED_RELEASES, probe_environment, run_probes

TARGETS = ("gfx950", "sm80", "sm89", "sm90")


@pytest.fixture(scope="module")
def linear_probes(tmp_path_factory):
    documents = {}
    for version in SUPPORTED_RELEASES:
        runs = {
            (version, target): (
                [HERE / "vllm_linear_probe.py", target],
                probe_environment(version, tmp_path_factory.mktemp(f"linear-{version}-{target}")),
            )
            for target in TARGETS
        }
        documents.update(run_probes(runs))
    return documents


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_on_nvidia_the_plan_follows_the_path_vllms_linear_method_chooses(linear_probes, version):
    """sm80: Marlin's weight-only FP8; sm89: vLLM's Triton GEMM up to 0.18, Marlin from 0.19; sm90:
    CUTLASS. Planned exactly where vLLM chose its Triton GEMM for every layer. The Marlin and Triton
    choices are vLLM's own Python; whether CUTLASS takes block FP8 is vLLM's compiled query
    (`cutlass_scaled_mm_supports_block_fp8`, capability 90 and up in its C++), which a builder
    cannot load: there kprecompile's stand-in answers it, from the threshold its rule uses."""
    triton = {"_run_triton", "TritonFp8BlockScaledMMKernel"}
    expected = {"sm80": "marlin", "sm89": "marlin" if version.startswith("0.33") else "triton", "sm90": "cutlass"}
    for target, path in expected.items():
        rule = linear_probes[version, target]["engine_rule"]["aiter=0"]
        chose = {chosen for chosen, _ in rule["vllm_chose"].values()}
        assert len(rule["vllm_chose"]) == 8 and len(chose) == 1, (target, chose)
        assert (rule["reason"] is None) == (chose <= triton), (target, rule)
        assert path in next(iter(chose)).lower(), (target, chose)
        if rule["reason"] is not None:
            assert path in rule["reason"].lower() and "nothing to compile" in rule["reason"], (target, rule)


@pytest.mark.parametrize("version", [v for v in SUPPORTED_RELEASES if not v.startswith("0.33")])
def test_sm89_triton_gemm_keys_coverage_and_a_real_compile(linear_probes, version):
    document = linear_probes[version, "sm89"]["triton_gemm"]
    for row in document["keys"].values():
        assert row["kernels"] == ["_w8a8_triton_block_scaled_mm"]
        assert row["traced"] == row["launched"]
        assert ".cubin" in row["compiled_files"]
    # A tuned table picks another config than the default: another kernel.
    assert document["keys"]["gemm default config"]["traced"] != document["keys"]["gemm tuned table"]["traced"]
    coverage = document["coverage"]
    assert coverage["steps"] == 40 and coverage["kernels"] >= 5
    assert coverage["missing"] == 0
    assert coverage["missing_without_div16"] > 0 and coverage["missing_untuned_only"] > 0


def test_vllm_0_33_with_aiter_on_gfx950_runs_no_triton_kernel_for_any_layer(linear_probes):
    """vLLM 0.33's AiterFp8BlockScaledMMKernel asks AITER's gemm_config_utils which (N, K) its Triton
    GEMM is tuned for; the installed amd-aiter has no such module (it ships MI350X tables for six
    of the eight layers all the same), so vLLM chose CK for every layer, and one eager forward of
    each (AITER's group quantization, CK GEMM) launches no Triton kernel, where the same forward
    with AITER off does. The plan says so."""
    document = linear_probes["0.33.0", "gfx950"]
    rule = document["engine_rule"]
    assert rule["aiter=0"]["reason"] is None
    assert set(map(tuple, rule["aiter=1"]["vllm_chose"].values())) == {("AiterFp8BlockScaledMMKernel", False)}
    assert "has no such module, so every layer runs CK: nothing to compile" in rule["aiter=1"]["reason"]
    layers = document["aiter_path"]
    control = layers.pop("control: AITER off")
    assert control["kernels"] > 0
    assert len(layers) == 8 and all(layer["kernels"] == 0 for layer in layers.values())
    assert sum(layer["aiter_table"] for layer in layers.values()) == 6


@pytest.mark.parametrize("version", [v for v in SUPPORTED_RELEASES if not v.startswith("0.33")])
def test_up_to_0_18_gfx950_takes_vllms_triton_gemm_with_aiter_on_and_off(linear_probes, version):
    rule = linear_probes[version, "gfx950"]["engine_rule"]
    for setting in ("aiter=0", "aiter=1"):
        assert rule[setting]["reason"] is None
        assert {chosen for chosen, _ in rule[setting]["vllm_chose"].values()} == {"_run_triton"}
