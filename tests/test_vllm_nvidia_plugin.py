"""The vLLM plugin in a server on an NVIDIA H200 (sm90), inside each supported vLLM release
(tests/vllm_nvidia_plugin_probe.py): it plans what vLLM resolved for the local GPU under vLLM's
CUDA rules, not its ROCm ones."""

from __future__ import annotations

from importlib import resources

import pytest
from test_vllm import HERE, SUPPORTED_RELEASES, probe_environment, run_probes


@pytest.fixture(scope="module")
def nvidia_servers(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("llama")
    (model_dir / "config.json").write_text(
        (resources.files("kprecompile.inputs.presets") / "llama-3.1-8b-instruct.json").read_text()
    )
    runs = {}
    for version in SUPPORTED_RELEASES:
        cache = tmp_path_factory.mktemp(f"nvidia-plugin-{version}")
        runs[version] = ([HERE / "vllm_nvidia_plugin_probe.py", model_dir, cache], probe_environment(version, cache))
    return run_probes(runs)


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_a_triton_attn_server_on_an_h200_plans_warms_and_preloads_sm90_kernels(nvidia_servers, version):
    """`--attention-backend TRITON_ATTN`: vLLM's own layer resolves TRITON_ATTN; the hook plans it
    for sm90 under vLLM's CUDA rules (one sequence: reshape-and-cache, the 2D and 3D kernel, the
    reduce), warms it beside the load and loads exactly those kernels after it."""
    server = nvidia_servers[version]["triton"]
    assert server["layer_backend"] == server["selected"] == "TRITON_ATTN" and server["targets"] == ["sm90"]
    assert server["families"] == {"triton_attn": None} and server["started_background"]
    not_warm, joined, loaded = server["events"]
    assert "(TRITON_ATTN) is not warm on sm90: warming" in not_warm
    assert joined.startswith("background warm: 4 kernels (4 compiled, 0 cached) in ")
    unified = (
        ["kernel_unified_attention"] * 2
        if version.startswith("0.33")
        else ["kernel_unified_attention_2d", "kernel_unified_attention_3d"]
    )
    assert server["manifest_kernels"] == sorted([*unified, "reduce_segments", "reshape_and_cache_kernel_flash"])
    # Loading a CUDA binary needs the CUDA driver, which this machine lacks: the hook reached all
    # four of the configuration's kernels, and nothing compiled in the process.
    assert "(4 could not be loaded: " in loaded and "libcuda.so cannot found" in loaded
    assert loaded.endswith("; 0 kernels compiled in this process since it started")


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_a_flash_attn_server_on_an_h200_says_nothing_compiles_ahead(nvidia_servers, version):
    """vLLM's CUDA default on sm90 is FLASH_ATTN (prebuilt kernels): the hook plans under vLLM's
    CUDA rules and says why nothing compiles, instead of rejecting a backend ROCm does not have."""
    server = nvidia_servers[version]["default"]
    assert server["selected"] == "FLASH_ATTN" and server["targets"] == ["sm90"]
    assert not server["started_background"] and server["manifest_kernels"] is None
    reason = (
        "FLASH_ATTN runs vLLM's prebuilt flash-attention build (vllm_flash_attn), not Triton: kprecompile plans "
        "Triton kernels (--attention-backend TRITON_ATTN runs vLLM's own)"
    )
    assert server["families"] == {"triton_attn": reason}
    said, loaded = server["events"]
    assert said.endswith(f"(FLASH_ATTN) on sm90: nothing to compile ahead ({reason})")
    assert loaded == "0 kernels compiled in this process since it started"
