"""The vLLM plugin inside real vLLM releases (0.11.2, 0.12.0, 0.33.0), each installed for real
beside this environment (scripts/install_vllm.py: the wheel with --no-deps and the light
packages it imports, torch stays this CPU build) and used through PYTHONPATH in a subprocess.

Each release runs tests/vllm_probe.py once (all three at once): vLLM loads the plugin through its
own plugin loader, builds its config for a model directory under its ROCm platform (gfx942), and
runs its `process_weights_after_loading` where the hook must have joined the background warm;
then vLLM's own FP8 BMM entry point is called as its load-time loop calls it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from kprecompile.vllm.releases import TESTED_RELEASES as SUPPORTED_RELEASES

ROOT = Path(__file__).parent.parent
HERE = Path(__file__).parent


def _installer():
    spec = importlib.util.spec_from_file_location("install_vllm", ROOT / "scripts" / "install_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def release_path(version: str) -> Path:
    """The release's directory, installed on first use (CI's .ci/run installs them first)."""
    installer = _installer()
    try:
        return installer.install(version)
    except (subprocess.CalledProcessError, SystemExit) as error:
        pytest.skip(f"vLLM {version} could not be installed here ({error}); run scripts/install_vllm.py")


def vllm_environment(version: str, cache: Path) -> dict[str, str]:
    """A server's environment: the release on the path, no GPU, AITER on, the cache named, and
    AITER's JIT directory left for the plugin to set."""
    environment = {name: value for name, value in os.environ.items() if name != "AITER_JIT_DIR"}
    return {
        **environment,
        "PYTHONPATH": str(release_path(version)),
        "CUDA_VISIBLE_DEVICES": "",
        "KPRECOMPILE_CACHE_DIR": str(cache),
        "VLLM_ROCM_USE_AITER": "1",
    }


def probe_environment(version: str, cache: Path) -> dict[str, str]:
    """A probe's environment: a server's (`vllm_environment`) with AITER's switch unset (each probe
    sets what it compares) and the tests' modules importable."""
    environment = {**vllm_environment(version, cache), "VLLM_ROCM_USE_AITER": ""}
    environment["PYTHONPATH"] += os.pathsep + str(HERE)
    return environment


def run_probes(runs: dict, timeout: int = 900) -> dict:
    """Probe scripts side by side, a process each (vLLM binds its platform once per process):
    `runs` maps a key to (the script and its arguments, the environment); each prints its JSON
    document last (vLLM's logging writes to stdout too)."""
    running = {
        key: subprocess.Popen(
            [sys.executable, *map(str, arguments)],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for key, (arguments, environment) in runs.items()
    }
    documents = {}
    for key, process in running.items():
        out, err = process.communicate(timeout=timeout)
        assert process.returncode == 0, f"{key}: {err[-3000:]}"
        documents[key] = json.loads(out.strip().splitlines()[-1])
    return documents


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """Every supported release's probe document, run side by side."""
    model_dir = tmp_path_factory.mktemp("model")
    (model_dir / "config.json").write_text(
        (resources.files("kprecompile.inputs.presets") / "deepseek-v2-lite.json").read_text()
    )
    running = {}
    for version in SUPPORTED_RELEASES:
        cache = tmp_path_factory.mktemp(f"cache-{version}")
        running[version] = (
            cache,
            subprocess.Popen(
                [sys.executable, str(HERE / "vllm_probe.py"), str(model_dir), str(cache)],
                env=vllm_environment(version, cache),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    documents = {}
    for version, (cache, process) in running.items():
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, f"vLLM {version}: {err[-3000:]}"
        # vLLM's logging writes to stdout: the document is the last line.
        documents[version] = (cache, json.loads(out.strip().splitlines()[-1]), out)
    return documents


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_the_plugin_acts_before_any_model_code(probes, version):
    cache, document, _ = probes[version]
    assert document["hook"] and document["monitor"]
    assert document["triton_cache_dir"] == document["triton_knob"] == str(cache / "triton-v1")
    assert document["aiter_jit_dir"] == str(cache / "aiter-jit-v1")
    assert document["hooked"] == {"initialize_model": True, "process_weights_after_loading": True, "load_model": True}
    # AITER reads AITER_JIT_DIR at import: nothing imported it before the plugin ran.
    assert document["aiter_before_plugins"] == []


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_the_plugin_names_a_layers_backend_as_vllms_registry_does(probes, version):
    """A layer built with each of vLLM's ROCm backend classes is planned under the registry's name
    for it (what --attention-backend takes), not the name the class gives itself: ROCM_AITER_FA's
    calls itself FLASH_ATTN, which the ROCm rules do not take."""
    _, document, _ = probes[version]
    names = document["layer_backend_names"]
    assert {name: named for name, (named, _) in names.items()} == {name: [name] for name in names}
    assert len(names) == 6 and names["ROCM_AITER_FA"][1] == "FLASH_ATTN"


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_vllms_resolved_config_gives_the_clis_key(probes, version):
    _, document, _ = probes[version]
    digest_from_vllm, digest_from_cli = document["digests"]
    assert digest_from_vllm == digest_from_cli and document["same_key_as_cli"]
    serving = document["serving"]
    assert (serving["max_num_seqs"], serving["max_model_len"], serving["dtype"]) == (1, 4096, "bfloat16")
    assert serving["cudagraph_capture_sizes"] and serving["kv_cache_dtype"] == "auto"
    other = document["other_serving"]
    assert (other["max_num_seqs"], other["max_model_len"], other["kv_cache_dtype"]) == (8, 2048, "fp8")
    assert other["cudagraph_capture_sizes"] == [] and other["block_size"] == 1


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_the_selection_mirror_agrees_with_the_releases_own_selector(probes, version):
    """For builders without vLLM: kprecompile's rules give the backend vLLM's ROCm selector gives,
    for every combination of the flags that decide it, with and without a backend named."""
    _, document, _ = probes[version]
    rows = document["selection"]
    assert len(rows) == 2**2 * 3 + 2**4 * 5
    disagreements = [row for row in rows if row["vllm"] != row["mirror"]]
    assert disagreements == []


# (model, engine, extra options) planned through the CLI with each release installed.
CLI_CASES = {
    "mla": ("deepseek-v2-lite", "vllm-aiter", ("--family", "fp8_bmm")),
    "gqa-no-aiter": ("llama-3.1-8b-instruct", "vllm", ()),
    # vLLM refuses Triton MLA on pages of one token; the mirror does not know that.
    "refused": ("deepseek-v2-lite", "vllm-aiter", ("--attention-backend", "TRITON_MLA", "--block-size", "1")),
    # Nothing named, AITER off, pages of one token: 0.33 finds no backend; 0.11 and 0.12 take AITER's MLA.
    "none": ("deepseek-v2-lite", "vllm", ("--block-size", "1", "--family", "fp8_bmm")),
}


def _plan_command(case: str, cache: Path) -> list[str]:
    model, engine, extra = CLI_CASES[case]
    return [
        sys.executable,
        "-m",
        "kprecompile",
        "-vv",
        "plan",
        "--model",
        model,
        "--engine",
        engine,
        "--target",
        "gfx942",
        "--cache-dir",
        str(cache),
        "--json",
        *extra,
    ]


@pytest.fixture(scope="module")
def cli_plans(tmp_path_factory):
    """`kprecompile plan` with each release installed, twice per case (the second from memory)."""
    results = {}
    for attempt in ("first", "again"):
        running = {}
        for version in SUPPORTED_RELEASES:
            cache = tmp_path_factory.getbasetemp() / f"plan-cache-{version}"
            environment = {**vllm_environment(version, cache), "VLLM_ROCM_USE_AITER": ""}
            for case in CLI_CASES:
                running[version, case] = subprocess.Popen(
                    _plan_command(case, cache),
                    env=environment,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
        for (version, case), process in running.items():
            out, err = process.communicate(timeout=600)
            results[version, case, attempt] = (process.returncode, out, err)
    return results


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_with_vllm_installed_the_cli_asks_vllms_own_selector(cli_plans, version):
    """Where vLLM is installed, plan (warm, verify, export) take the backend from vLLM's own ROCm
    selector, remembered in the cache; its answer is the mirror's (which builders without vLLM use)."""
    from kprecompile.inputs.models import load_model
    from kprecompile.selection.engines import select

    for case, (model, engine, extra) in CLI_CASES.items():
        if case == "refused" or (case == "none" and version.startswith("0.33")):
            continue
        for attempt in ("first", "again"):
            returncode, out, err = cli_plans[version, case, attempt]
            assert returncode == 0, err[-2000:]
            selection = json.loads(out)["engine"]
            assert selection["selected_by"] == f"vLLM {version}'s own selector"
            assert selection["vllm_release"] == version
            requested = extra[extra.index("--attention-backend") + 1] if "--attention-backend" in extra else None
            block_size = int(extra[extra.index("--block-size") + 1]) if "--block-size" in extra else 16
            mirror = select(
                load_model(model), engine, requested, environ={}, vllm_release=version, block_size=block_size
            )
            assert selection["attention_backend"] == mirror.attention_backend, (case, attempt)
            # The second command found vLLM's answer in the cache and did not import vLLM again.
            assert ("vLLM's selector, remembered at" in err) == (attempt == "again"), (case, attempt)
            # vLLM's warnings about the GPU extensions a builder lacks stay out of kprecompile's output.
            assert not re.findall(r"^[A-Z]+ vllm\S*: ", err, re.MULTILINE), err[-2000:]


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_a_backend_vllm_refuses_is_one_line_naming_vllms_reason(cli_plans, version):
    returncode, out, err = cli_plans[version, "refused", "first"]
    [line] = [line for line in err.splitlines() if line.startswith("kprecompile: ")]
    assert returncode == 2 and out == ""
    assert line.startswith("kprecompile: --attention-backend: got 'TRITON_MLA', expected a backend vLLM")
    reason = "block_size not supported" if version.startswith("0.33") else "does not support block size 1"
    assert reason in line
    if version.startswith("0.33"):
        returncode, out, err = cli_plans[version, "none", "first"]
        [line] = [line for line in err.splitlines() if line.startswith("kprecompile: ")]
        assert returncode == 2 and out == ""
        assert line.startswith("kprecompile: attention backend: got 'none', expected one vLLM 0.33.0 selects for")
        assert "TRITON_MLA: [block_size not supported]" in line


# (release, backend, model, kernels) warmed for real and verified deep: vLLM's ROCM_ATTN kernels
# for a sliding-window model in every release, TRITON_ATTN and TRITON_MLA in 0.12.0, TRITON_ATTN
# through 0.33.0's builder and KV-cache view.
WARM_CASES = [
    *((version, "ROCM_ATTN", "mistral-7b-v0.1", 4) for version in SUPPORTED_RELEASES),
    ("0.12.0", "TRITON_ATTN", "mistral-7b-v0.1", 14),
    ("0.12.0", "TRITON_MLA", "deepseek-v2-lite", 5),
    ("0.33.0", "TRITON_ATTN", "mistral-7b-v0.1", 24),
]


# A process that serves from the cache (KPRECOMPILE_CACHE_DIR) loads the configuration's kernels:
# binaries only, under the cross-compile driver for gfx942 (no GPU here).
PRELOAD = """
import json, kprecompile
from kprecompile.selection.engines import select
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
layout = kprecompile.activate()
model = load_model("{model}")
serving = ServingParams(max_model_len=8192, max_num_seqs=32)
selection = select(model, "vllm", "{backend}", environ={{}})
report = kprecompile.preload(kprecompile.Request(model, serving, selection), layout, target=TARGETS["gfx942"])
print(json.dumps([report.kernels, report.loaded, report.compiled, list(report.failures)]))
"""


@pytest.fixture(scope="module")
def kernel_probes(tmp_path_factory):
    """tests/vllm_kernels_probe.py in every supported release, and `kprecompile warm` then
    `verify --deep` of WARM_CASES."""
    script = HERE / "vllm_kernels_probe.py"
    documents = run_probes(
        {
            version: ([script], probe_environment(version, tmp_path_factory.mktemp(f"kernels-{version}")))
            for version in SUPPORTED_RELEASES
        }
    )
    # NVIDIA targets in processes of their own, as an NVIDIA request is planned.
    nvidia = run_probes(
        {
            (version, "sm90"): (
                [script, "--nvidia"],
                probe_environment(version, tmp_path_factory.mktemp(f"nvidia-{version}")),
            )
            for version in SUPPORTED_RELEASES
        }
    )
    for version in SUPPORTED_RELEASES:
        documents[version]["sm90"] = nvidia[version, "sm90"]
    for version, backend, model, _ in WARM_CASES:
        cache = tmp_path_factory.mktemp(f"warm-{version}")
        environment = {**vllm_environment(version, cache), "VLLM_ROCM_USE_AITER": ""}
        chosen = [
            "--model",
            model,
            "--engine",
            "vllm",
            "--attention-backend",
            backend,
            "--target",
            "gfx942",
            "--max-model-len",
            "8192",
            "--max-num-seqs",
            "32",
            "--json",
        ]
        outcome = []
        for command in (["warm", *chosen], ["verify", *chosen, "--deep"]):
            result = subprocess.run(
                [sys.executable, "-m", "kprecompile", *command],
                env=environment,
                capture_output=True,
                text=True,
                timeout=900,
            )
            outcome.append((result.returncode, result.stdout, result.stderr))
        preload = subprocess.run(
            [sys.executable, "-c", PRELOAD.format(model=model, backend=backend)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=900,
        )
        outcome.append((preload.returncode, preload.stdout, preload.stderr))
        documents[version][f"warm {backend}"] = outcome
    return documents


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_rocm_attn_kernels_are_the_ones_vllms_own_rule_launches(kernel_probes, version):
    """Prefix prefill on every model; the Triton paged decode only where vLLM's rule declines its
    HIP kernel (a sliding window; VLLM_ROCM_CUSTOM_PAGED_ATTN=0, which 0.33 no longer reads)."""
    plans = kernel_probes[version]["plans"]
    prefill, decode = ["_fwd_kernel"] * 2, ["kernel_paged_attention_2d"] * 2  # one per KV storage class
    assert plans["choice"] == ["rocm_attn", None]
    assert plans["llama-3.1-8b-instruct"] == plans["llama-3.1-8b-instruct fp8"] == prefill
    assert plans["mistral-7b-v0.1"] == plans["mistral-7b-v0.1 fp8"] == prefill + decode
    without_hip = plans["llama-3.1-8b-instruct VLLM_ROCM_CUSTOM_PAGED_ATTN=0"]
    assert without_hip == (prefill if version.startswith("0.33") else prefill + decode)


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_vllm_kernels_are_traced_under_the_targets_platform(kernel_probes, version):
    # vLLM reads its platform's FP8 type at import: e4m3fnuz (+-240) on gfx942, e4m3fn (+-448) on gfx950.
    assert kernel_probes[version]["fp8_ranges"] == {"gfx942": [-240.0, 240.0], "gfx950": [-448.0, 448.0]}


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_rocm_attn_traced_keys_equal_the_launch_paths_keys(kernel_probes, version):
    prefill, decode = kernel_probes[version]["keys"]
    # The launch path stops at the first kernel's launch; the trace sees each kernel of the step.
    assert prefill["kernels"] == ["_fwd_kernel", "kernel_paged_attention_2d"]
    assert prefill["traced"][:1] == prefill["launched"] and len(prefill["launched"]) == 1
    assert decode["kernels"] == ["kernel_paged_attention_2d"] and decode["traced"] == decode["launched"]
    assert prefill["traced"][1] == decode["traced"][0]


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_rocm_attn_random_engine_steps_are_covered_by_the_plan(kernel_probes, version):
    coverage = kernel_probes[version]["coverage"]
    for case in ("mistral-7b-v0.1 auto", "mistral-7b-v0.1 fp8", "llama-3.1-8b-instruct auto"):
        assert coverage[case]["steps"] >= 50 and coverage[case]["kernels"] >= 2, case
        assert coverage[case]["missing"] == 0, case
    # The same sweep against a plan without the KV caches over 2 GiB finds what it lacks.
    assert coverage["negative control"]["missing"] == 2


@pytest.mark.parametrize("version, backend, model, kernels", WARM_CASES)
def test_vllm_kernels_warm_for_real_and_verify_deep(kernel_probes, version, backend, model, kernels):
    warm, verify, preload = kernel_probes[version][f"warm {backend}"]
    assert warm[0] == 0, warm[2][-2000:]
    report = json.loads(warm[1])
    assert (report["compiled"], report["failed"]) == (kernels, 0), report
    assert verify[0] == 0, verify[2][-2000:]
    assert json.loads(verify[1])["warm"] is True
    # A serving process loads every kernel from the cache and compiles none.
    assert preload[0] == 0, preload[2][-2000:]
    assert json.loads(preload[1].strip().splitlines()[-1]) == [kernels, kernels, 0, []]


def assert_triton_attn_up_to_0_18(document: dict, expected: dict[str, int]) -> None:
    """A TRITON_ATTN probe up to 0.18 on one target: the kernels each model's plan holds
    (`expected`), and the keys of reshape-and-cache, a 3D decode and a 2D prefill step, each
    the launch path's."""
    for case in ("mistral-7b-v0.1", "llama-3.1-8b-instruct", "llama-3.1-8b-instruct fp8"):
        assert Counter(document[case]) == expected, case
    reshape, decode, prefill = document["keys"]
    assert reshape["kernels"] == ["reshape_and_cache_kernel_flash", "kernel_unified_attention_3d", "reduce_segments"]
    assert decode["kernels"] == ["kernel_unified_attention_3d", "reduce_segments"]
    assert prefill["kernels"] == ["kernel_unified_attention_2d"]
    for row in (reshape, decode, prefill):
        assert row["traced"][:1] == row["launched"] and len(row["launched"]) == 1, row["step"]


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_triton_attn_kernels_keys_and_coverage(kernel_probes, version):
    """TRITON_ATTN up to 0.18: reshape-and-cache, the 2D kernel (steps with a prefill, large
    decode batches) and the 3D kernel with its reduce (small decode batches), one per integer
    class of the sequence count and per KV storage class (0.19+: `test_triton_attn_from_0_19...`)."""
    document = kernel_probes[version]["triton_attn"]
    assert document["choice"] == ["triton_attn", None]
    if version.startswith("0.33"):
        return
    expected = {
        "kernel_unified_attention_2d": 6,
        "kernel_unified_attention_3d": 4,
        "reduce_segments": 2,
        "reshape_and_cache_kernel_flash": 2,
    }
    assert_triton_attn_up_to_0_18(document, expected)
    coverage = document["coverage"]
    assert coverage["steps"] >= 60 and coverage["kernels"] >= 8 and coverage["missing"] == 0
    assert coverage["missing_from_smaller_plan"] > 0


# vLLM 0.33's TRITON_ATTN per ROCm plan (llama-3.1-8b and mistral-7b, 8 KV heads: 3D threshold 16):
# per KV storage class (under 2 GiB, over, keys over and values within) reshape-and-cache and the
# one attention kernel in 3D (1 sequence, 2..15, 16) and 2D (1, other, multiples of 16); the
# reduce after 3D once per integer class (it takes no KV cache).
TRITON_ATTN_0_33_ROCM = {"kernel_unified_attention": 18, "reduce_segments": 3, "reshape_and_cache_kernel_flash": 3}


def test_triton_attn_from_0_19_is_traced_through_the_releases_builder_and_kv_cache_view(kernel_probes):
    """vLLM 0.33.0's TRITON_ATTN through its real metadata builder, KV-cache view and
    `do_kv_cache_update` + `forward`, on gfx942, gfx950 and sm90: keys are the launch path's
    (an FP8 KV cache takes an FP8 query); the 3D threshold follows the capture sizes (capture sizes
    whose nearest to 16 is 8 lose the 3D kernel for 16 sequences); dense random steps (mixed
    prefills, 3D-sized prefills, random layer sizes around 2 GiB, a sliding-window model, an FP8
    KV cache, other capture sizes) compile nothing outside their plan, and do outside a plan for 8
    sequences and (ROCm) one without the layers whose keys cross 2 GiB and values do not."""
    rocm, nvidia = kernel_probes["0.33.0"]["triton_attn"], kernel_probes["0.33.0"]["sm90"]["triton_attn"]
    for case in (
        "mistral-7b-v0.1",
        "llama-3.1-8b-instruct",
        "llama-3.1-8b-instruct fp8",
        "gfx950 llama-3.1-8b-instruct",
        "gfx950 llama-3.1-8b-instruct fp8",
    ):
        assert Counter(rocm[case]) == TRITON_ATTN_0_33_ROCM, case
    # NVIDIA's backend has no 2 GiB pointer classes: one reshape-and-cache, 3 + 3 attention kernels.
    expected = {"kernel_unified_attention": 6, "reduce_segments": 3, "reshape_and_cache_kernel_flash": 1}
    for case in ("mistral-7b-v0.1", "llama-3.1-8b-instruct", "llama-3.1-8b-instruct fp8"):
        assert Counter(nvidia[case]) == expected, case
    # Threshold 8: 3D for 1 and 2..8 sequences only.
    assert Counter(rocm["other_capture_sizes"]) == {
        "kernel_unified_attention": 15,
        "reduce_segments": 2,
        "reshape_and_cache_kernel_flash": 3,
    }
    assert Counter(nvidia["other_capture_sizes"]) == {
        "kernel_unified_attention": 5,
        "reduce_segments": 2,
        "reshape_and_cache_kernel_flash": 1,
    }
    assert rocm["fp8_range"] == [-240.0, 240.0] and nvidia["fp8_range"] == [-448.0, 448.0]
    assert rocm["reshape_launch"] == [8, 4] and nvidia["reshape_launch"] == [16, 10]
    for document in (rocm, nvidia):
        reshape, decode, prefill = document["keys"]
        assert reshape["kernels"] == ["reshape_and_cache_kernel_flash", "kernel_unified_attention", "reduce_segments"]
        assert decode["kernels"] == ["kernel_unified_attention", "reduce_segments"]
        assert prefill["kernels"] == ["kernel_unified_attention"]
        for row in (reshape, decode, prefill, document["fp8_keys"]):
            assert row["traced"][:1] == row["launched"] and len(row["launched"]) == 1, row
        assert document["fp8_keys"]["q_is_fp8"] == [True, None]
        assert document["coverage"]["steps"] >= 60 and document["coverage"]["missing"] == 0
        assert document["coverage"]["missing_from_smaller_plan"] > 0
        for label, row in document["coverage_0_19"].items():
            if label != "missing_without_straddling_layers":
                assert row["steps"] >= 60 and row["kernels"] >= 7 and row["missing"] == 0, label
    assert rocm["coverage_0_19"]["missing_without_straddling_layers"] > 0
    assert nvidia["coverage_0_19"]["missing_without_straddling_layers"] == 0
    rocm_keys = {key for row in rocm["keys"] for key in row["traced"]}
    assert rocm_keys.isdisjoint(key for row in nvidia["keys"] for key in row["traced"])


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_the_capture_size_rule_is_the_releases(probes, version):
    _, document, _ = probes[version]
    assert [row for row in document["capture_sizes"] if row["vllm"] != row["mirror"]] == []


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_a_cold_cache_is_warmed_beside_the_load_and_the_bmm_loop_compiles_nothing(probes, version):
    cache, document, output = probes[version]
    load = document["load"]
    assert load["started_background"], load["events"]
    # vLLM's process_weights_after_loading ran after the warm was joined, with the cache active.
    assert load["at_process_weights_after_loading"] == {"warm_joined": True, "triton_knob": str(cache / "triton-v1")}
    [not_warm, joined, loaded] = load["events"]
    assert "is not warm on gfx942: warming" in not_warm
    # FP8 BMM (both products, m = 1) and, until 0.19, MLA decode's Triton reduce (batch 1) and
    # vLLM's merge around the prefill with cached context (one sequence: one context chunk).
    kernels = 2 if version.startswith("0.33") else 4
    assert joined.startswith(f"background warm: {kernels} kernels ({kernels} compiled, 0 cached) in ")
    # The load-time loop's calls (W_K and W_V products, m = 1) found their kernels: no compile.
    assert load["loop"] == "reached launch,reached launch" and load["loop_compiles"] == 0
    # After load_model every kernel of the configuration is in the process; none compiled in it.
    assert loaded.startswith(f"{kernels} kernels of the configuration in the process ({kernels} loaded from the cache")
    assert loaded.endswith("; 0 kernels compiled in this process since it started")
    # Operators see the events through vLLM's logging, at WARNING.
    lines = [line for line in output.splitlines() if f"kprecompile: {joined}" in line]
    assert len(lines) == 1 and re.search(r"\bWARNING\b.*\bkprecompile: ", lines[0]), output[-2000:]


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_the_plugin_records_what_compiles_beyond_the_plan_in_the_configurations_journal(probes, version):
    _, document, _ = probes[version]
    load = document["load"]
    # After load, a batch of 40 through vLLM's FP8 BMM entry point: beyond the plan's one sequence.
    assert load["serving"] == "reached launch,reached launch"
    recorded = load["recorded"]
    assert recorded["journal"] and recorded["replayable"] and recorded["manifests"] == []
    bmm = "_batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant_kernel"
    assert recorded["kernels"] == [bmm, bmm]


def test_without_vllm_register_does_nothing_and_says_so(caplog):
    from kprecompile.serve.vllm import plugin

    assert importlib.util.find_spec("vllm") is None
    with caplog.at_level(logging.INFO, logger="vllm.kprecompile"):
        plugin.register()
    assert plugin.loader_hook() is None
    assert [record.getMessage() for record in caplog.records] == [
        "kprecompile: vLLM is not installed here; the loader hook does nothing"
    ]


FAILURES = """
import sys, logging
from kprecompile.serve.vllm import plugin
# vLLM moved its model runner: the import fails.
sys.modules["vllm.v1.worker.gpu_model_runner"] = None
plugin.register()
print("moved:", plugin.loader_hook() is None, flush=True)
del sys.modules["vllm.v1.worker.gpu_model_runner"]
plugin.register()
hook = plugin.loader_hook()
# Something kprecompile cannot plan (a config without an attention layout): one line, no raise.
class Config:
    class model_config:
        model = "odd-model"
        class hf_config:
            @staticmethod
            def to_json_string(use_diff=False):
                return '{"architectures": ["OddForCausalLM"]}'
hook._model_built(object(), (), {"vllm_config": Config()})
print("unplannable:", hook.request is None, hook.events, flush=True)
"""


def test_failures_inside_vllm_are_one_warning_and_never_stop_the_server(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", FAILURES],
        env=vllm_environment("0.12.0", tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "moved: True" in result.stdout
    # Through vLLM's own logging (its handler writes to stdout), at WARNING.
    warnings = [line for line in result.stdout.splitlines() if "kprecompile:" in line]
    assert len(warnings) == 2 and all(re.search(r"\bWARNING\b.*\bkprecompile: ", line) for line in warnings), warnings
    assert "kprecompile: hook not installed in vLLM 0.12.0 (" in warnings[0]
    assert "kernels compile on first use" in warnings[0]
    assert "kprecompile: planning skipped (ModelConfigError: " in warnings[1] and "num_attention_heads" in warnings[1]
    assert "unplannable: True" in result.stdout


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_triton_mla_decode_keys_and_coverage(kernel_probes, version):
    """TRITON_MLA's decode (built as vLLM builds it, from a VllmConfig): the grouped stage 1 per KV
    storage class and a stage-2 reduce, for 4 KV splits up to 0.18 (and its prefill merges), for
    each power-of-2 split count vLLM 0.19+ derives from the context (5 up to 8192 tokens; its
    prefill merges with the compiled operator)."""
    document = kernel_probes[version]["triton_mla"]
    assert document["choice"] == ["triton_mla", None]
    if version.startswith("0.33"):
        assert document["kernels"] == ["_fwd_grouped_kernel_stage1"] * 10 + ["_fwd_kernel_stage2"] * 5
    else:
        assert (
            document["kernels"]
            == ["_fwd_grouped_kernel_stage1"] * 2 + ["_fwd_kernel_stage2"] + ["merge_attn_states_kernel"] * 2
        )
    keys = document["keys"]
    assert keys["kernels"] == ["_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2"]
    assert keys["traced"][:1] == keys["launched"] and len(keys["launched"]) == 1
    coverage = document["coverage"]
    assert coverage["steps"] == 20 and coverage["missing"] == 0 and coverage["missing_from_smaller_plan"] >= 1


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_mla_merge_keys_and_coverage(kernel_probes, version):
    """vLLM's merge around ROCM_AITER_MLA's prefill with cached context up to 0.18 (Triton on
    ROCm): with and without the merged log-sum-exp; from 0.19 the release's own dispatcher takes
    its compiled operator on CDNA3 and newer, which is the reason the plan gives."""
    document = kernel_probes[version]["mla_merge"]
    if version.startswith("0.33"):
        assert document["choice"][0] == "mla_merge" and "compiled merge_attn_states" in document["choice"][1]
        assert document["dispatch"] == {"gfx90a": 1, "gfx942": 0, "gfx950": 0}
        return
    assert document["choice"] == ["mla_merge", None]
    assert document["kernels"] == ["merge_attn_states_kernel"] * 2
    one_chunk, two_chunks = document["keys"]
    assert one_chunk["traced"] == one_chunk["launched"] and len(one_chunk["launched"]) == 1
    # Two chunks: the chunk merge (keeping the log-sum-exp) launches first.
    assert two_chunks["traced"][:1] == two_chunks["launched"] and len(two_chunks["traced"]) == 2
    assert one_chunk["traced"][0] in two_chunks["traced"]
    coverage = document["coverage"]
    assert coverage["steps"] == 12 and coverage["kernels"] == 2
    assert coverage["missing"] == 0 and coverage["missing_from_smaller_plan"] == 1


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_aiter_fa_context_keys_and_coverage(kernel_probes, version):
    """vLLM's gather and merge around ROCM_AITER_FA's prefill with cached context: the gather's
    key is the launch path's; random request mixes through vLLM's own metadata builder compile
    nothing outside the plan, and do outside a plan without the large KV caches. From 0.19 the
    step is the engine's (its attention layer, KV-cache view and builder): the merge is compiled,
    the shuffled layout adds its Triton cache write, decodes are mixed in, and with speculative
    decoding the verify steps run AITER's Triton unified attention."""
    document = kernel_probes[version]["aiter_fa_context"]
    assert document["choice"] == ["aiter_fa_context", None]
    keys = document["keys"]
    coverage = document["coverage"]
    assert coverage["missing"] == 0 and coverage["missing_from_smaller_plan"] > 0
    if version.startswith("0.33"):
        kernels = document["kernels"]
        assert set(kernels["default"]) == set(kernels["fp8"]) == {"cp_mha_gather_cache_kernel"}
        assert len(kernels["default"]) == len(kernels["fp8"]) >= 6
        # The shuffled layout's gather reads another layout, and its KV-cache write is Triton.
        assert kernels["shuffle"].count("reshape_and_cache_shuffle_kernel") == 2
        assert kernels["shuffle"].count("cp_mha_gather_cache_kernel") == kernels["default"].count(
            "cp_mha_gather_cache_kernel"
        )
        # One gather per chunk, each with its own slices of the builder's tables.
        assert len(keys["traced"]) == 3 and keys["traced"] == keys["launched"]
        assert coverage["steps"] == 60 and coverage["kernels"] >= 6
        # Speculative decoding's verify steps decode with AITER's Triton unified attention.
        speculative = document["speculative"]
        assert set(speculative["kernels"]) == {
            "cp_mha_gather_cache_kernel",
            "kernel_unified_attention_2d",
            "kernel_unified_attention_3d",
            "reduce_segments",
        }
        launched = speculative["keys"]["launched"]
        assert len(launched) == 1 and speculative["keys"]["traced"][:1] == launched
        assert speculative["coverage"]["missing"] == 0 and speculative["coverage"]["missing_without_speculation"] > 0
        # Every batch size is needed: AITER's 2D/3D choice and segment count move with it.
        assert speculative["coverage"]["missing_from_class_representatives"] > 0
        return
    assert document["kernels"].count("merge_attn_states_kernel") == 2
    assert set(document["kernels"]) == {"cp_mha_gather_cache_kernel", "merge_attn_states_kernel"}
    assert keys["traced"][:1] == keys["launched"] and len(keys["launched"]) == 1
    assert coverage["steps"] == 16 and coverage["kernels"] > 2


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_block_fp8_linear_keys_and_coverage(kernel_probes, version):
    """DeepSeek-R1's block-FP8 linear layers: the engine rule is the GEMM path vLLM's own linear
    method chooses per target and AITER setting; planned keys are the launch path's (the group
    quantization, eager, up to 0.18; the GEMM under the default config and an MI300X table); random
    layers, token counts and devices compile nothing outside the plan, and do outside a plan
    without the M multiples of 16 or (on gfx942) without the tuned devices."""
    document = kernel_probes[version]["block_fp8_linear"]
    choices, chose = document["choices"], document["vllm_chose"]
    for setting, path in chose.items():
        planned = choices[setting] is None
        assert planned == (path in ("_run_triton", "TritonFp8BlockScaledMMKernel")), setting
    assert choices["gfx950 aiter=0"] is None and choices["gfx942 aiter=0"] is None
    if version.startswith("0.33"):
        # AITER's kernel: CK for every layer with the installed AITER (tests/test_vllm_linear.py).
        assert "nothing to compile" in choices["gfx950 aiter=1"] and "nothing to compile" in choices["gfx942 aiter=1"]
    else:
        assert choices["gfx950 aiter=1"] is None and "e4m3fnuz" in choices["gfx942 aiter=1"]
    keys = document["keys"]
    quantization = [] if version.startswith("0.33") else ["_per_token_group_quant_fp8"]
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


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_a_vllm_family_that_cannot_be_traced_is_not_planned_and_the_rest_stands(kernel_probes, version):
    """A release whose backend moved (here: its metadata class renamed) loses that family only."""
    document = kernel_probes[version]["untraceable"]
    assert document["planned"] == ["pa_prefill"] and document["kernels"] > 0
    assert document["reason"].startswith("tracing rocm_attn failed at forward(")
    assert "NoSuchMetadata" in document["reason"] and "tested against vLLM 0.11.2, 0.12.0, 0.33.0" in document["reason"]


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_triton_attn_on_nvidia_keys_and_coverage(kernel_probes, version):
    """TRITON_ATTN named on sm90 (vLLM's CUDA default is FLASH_ATTN), up to 0.18 (0.19+: test above): traced under
    vLLM's CUDA platform (e4m3fn's FP8 range), one kernel per integer class of the sequence count
    and none per KV storage class (NVIDIA's backend does not specialize on it); keys are the launch
    path's, random steps compile nothing outside the plan, and do outside a smaller plan."""
    document = kernel_probes[version]["sm90"]["triton_attn"]
    assert document["choice"] == ["triton_attn", None]
    if version.startswith("0.33"):
        return  # test_triton_attn_from_0_19_is_traced_through_the_releases_builder_and_kv_cache_view
    assert document["fp8_range"] == [-448.0, 448.0]
    # vLLM's CUDA launch of reshape-and-cache (16 warps, 10 stages; 8 and 4 under its ROCm platform).
    assert document["reshape_launch"] == [16, 10] and kernel_probes[version]["triton_attn"]["reshape_launch"] == [8, 4]
    expected = {
        "kernel_unified_attention_2d": 3,
        "kernel_unified_attention_3d": 2,
        "reduce_segments": 2,
        "reshape_and_cache_kernel_flash": 1,
    }
    assert_triton_attn_up_to_0_18(document, expected)
    rocm = {key for row in kernel_probes[version]["triton_attn"]["keys"] for key in row["traced"]}
    assert rocm.isdisjoint(key for row in document["keys"] for key in row["traced"])
    coverage = document["coverage"]
    assert coverage["steps"] >= 60 and coverage["kernels"] == 8 and coverage["missing"] == 0
    assert coverage["missing_from_smaller_plan"] > 0


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_triton_mla_on_nvidia_keys_and_coverage(kernel_probes, version):
    """TRITON_MLA's decode on sm90 under vLLM's CUDA platform: stage 1 and 2 for 4 KV splits up
    to 0.18, for each power-of-2 split count from 0.19; the prefill's merges there take vLLM's
    compiled CUDA merge (the release's own dispatcher launches no Triton kernel), so none is
    planned. Keys are the launch path's; random decode steps compile nothing outside the plan, and
    do outside a plan of the prefill steps alone."""
    document = kernel_probes[version]["sm90"]
    mla = document["triton_mla"]
    assert mla["choice"] == ["triton_mla", None]
    splits = 5 if version.startswith("0.33") else 1
    assert mla["kernels"] == ["_fwd_grouped_kernel_stage1"] * splits + ["_fwd_kernel_stage2"] * splits
    assert document["merge"] == 0
    keys = mla["keys"]
    assert keys["kernels"] == ["_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2"]
    assert keys["traced"][:1] == keys["launched"] and len(keys["launched"]) == 1
    coverage = mla["coverage"]
    assert coverage["steps"] == 20 and coverage["missing"] == 0 and coverage["missing_from_smaller_plan"] >= 2
    # At TP 2 too: vLLM's engine configuration for a serving host whose ranks its builder cannot see.
    assert document["mla_tp2"] == mla["kernels"]


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_the_cuda_selection_mirror_follows_the_releases_priority_list(kernel_probes, version):
    """Without a backend named, kprecompile's mirror takes the backend vLLM's CUDA platform ranks
    first among those whose compute-capability rule takes the target; where vLLM's class for a
    higher-ranked backend cannot be imported on a builder (FlashInfer not installed, CUTLASS MLA
    allocating on the GPU at import), the mirror's choice is that backend."""
    rows = kernel_probes[version]["sm90"]["selection"]
    assert len(rows) == 8
    compared = [row for row in rows if not row["import_errors"]]
    assert all(row["mirror"] == row["vllm"] for row in compared), compared
    assert len(compared) >= 4
    for row in rows:
        assert row["mirror"] == row["vllm"] or row["mirror"] in row["import_errors"], row
    defaults = {(row["target"], row["model"]): row["mirror"] for row in rows}
    assert defaults["sm89", "deepseek-v2-lite"] == defaults["sm80", "deepseek-v2-lite"] == "TRITON_MLA"
    assert defaults["sm90", "llama-3.1-8b-instruct"] == "FLASH_ATTN"
