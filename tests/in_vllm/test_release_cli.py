"""The CLI with each real vLLM release installed, called in this process (one vLLM import for all of
them): `plan` asks vLLM's own selector and remembers its answer; vLLM's kernels warm for real, verify
deep, and a serving process (a fresh one) loads them all and compiles none."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from helpers import kprecompile_cli
from release_support import kv_storage_classes
from vllm_releases import SUPPORTED_RELEASES

from kprecompile.vllm.releases import release_line

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.vllm_process("cli")]

# (model, engine, extra options) planned through the CLI with each release installed.
CLI_CASES = {
    "mla": ("deepseek-v2-lite", "vllm-aiter", ("--family", "fp8_bmm")),
    "gqa-no-aiter": ("llama-3.1-8b-instruct", "vllm", ()),
    # vLLM refuses Triton MLA on pages of one token; the mirror does not know that.
    "refused": ("deepseek-v2-lite", "vllm-aiter", ("--attention-backend", "TRITON_MLA", "--block-size", "1")),
    # Nothing named, AITER off, pages of one token: 0.33 finds no backend; 0.11 and 0.12 take AITER's MLA.
    "none": ("deepseek-v2-lite", "vllm", ("--block-size", "1", "--family", "fp8_bmm")),
}


@pytest.fixture(scope="module")
def cli_plans(tmp_path_factory):
    """`kprecompile -vv plan` of every case, twice (the second from the cache's memory of vLLM's
    answer): (exit status, stdout, stderr) per (case, attempt)."""
    cache = tmp_path_factory.mktemp("plan-cache")
    results = {}
    for attempt in ("first", "again"):
        for case, (model, engine, extra) in CLI_CASES.items():
            result = kprecompile_cli(
                "-vv",
                "plan",
                "--model",
                model,
                "--engine",
                engine,
                "--target",
                "gfx942",
                "--cache-dir",
                cache,
                "--json",
                *extra,
            )
            results[case, attempt] = (result.returncode, result.stdout, result.stderr)
    return results


def test_with_vllm_installed_the_cli_asks_vllms_own_selector(cli_plans, release):
    """Where vLLM is installed, plan (warm, verify, export) take the backend from vLLM's own model
    (each layer asks vLLM's selector), remembered in the cache; its answer is the mirror's (which
    builders without vLLM use)."""
    from kprecompile.inputs.models import load_model
    from kprecompile.selection.engines import select

    for case, (model, engine, extra) in CLI_CASES.items():
        if case == "refused" or (case == "none" and release_line(release).gqa_rule == "priority_list"):
            continue
        for attempt in ("first", "again"):
            returncode, out, err = cli_plans[case, attempt]
            assert returncode == 0, err[-2000:]
            selection = json.loads(out)["engine"]
            # vLLM's own model chose each layer's backend (its selector, asked with the layer's features).
            assert selection["selected_by"] == f"vLLM {release}'s own model, per layer"
            assert selection["vllm_release"] == release
            requested = extra[extra.index("--attention-backend") + 1] if "--attention-backend" in extra else None
            block_size = int(extra[extra.index("--block-size") + 1]) if "--block-size" in extra else 16
            mirror = select(
                load_model(model), engine, requested, environ={}, vllm_release=release, block_size=block_size
            )
            assert selection["attention_backend"] == mirror.attention_backend, (case, attempt)
            # The second command found vLLM's answer in the cache and did not ask vLLM again.
            assert ("vLLM's layers, remembered at" in err) == (attempt == "again"), (case, attempt)
            # vLLM's warnings about the GPU extensions a builder lacks stay out of kprecompile's output.
            assert not re.findall(r"^[A-Z]+ vllm\S*: ", err, re.MULTILINE), err[-2000:]


def test_a_backend_vllm_refuses_is_one_line_naming_vllms_reason(cli_plans, release):
    returncode, out, err = cli_plans["refused", "first"]
    [line] = [line for line in err.splitlines() if line.startswith("kprecompile: ")]
    assert returncode == 2 and out == ""
    if release_line(release).gqa_rule == "aiter_flags_list":
        # 0.18's selector takes a backend whatever the block size; its KV-cache setup refuses it.
        assert line == (
            "kprecompile: --block-size: got 1, expected a block size vLLM's TRITON_MLA takes; it says: "
            "No common block size for 1."
        )
        return
    assert line.startswith("kprecompile: --attention-backend: got 'TRITON_MLA', expected a backend vLLM")
    priority_list = release_line(release).gqa_rule == "priority_list"  # vLLM's selector from 0.19
    reason = "block_size not supported" if priority_list else "does not support block size 1"
    assert reason in line
    if priority_list:
        returncode, out, err = cli_plans["none", "first"]
        [line] = [line for line in err.splitlines() if line.startswith("kprecompile: ")]
        assert returncode == 2 and out == ""
        assert line.startswith(f"kprecompile: attention backend: got 'none', expected one vLLM {release} selects for")
        assert "TRITON_MLA: [block_size not supported]" in line


# (release, backend, model, kernels) warmed for real and verified deep: vLLM's ROCM_ATTN kernels
# for a sliding-window model in every release, TRITON_ATTN and TRITON_MLA in 0.12.0, TRITON_ATTN
# through 0.33.0's builder and KV-cache view (each where its release is one the run tests). The
# kernels with Triton's AMD buffer ops and without (Triton 3.5: one KV storage class, measured with
# `kprecompile plan` of each case on 0.12.0 under Triton 3.6.0 and 3.5.0).
WARM_CASES = [
    case
    for case in (
        *((version, "ROCM_ATTN", "mistral-7b-v0.1", (4, 2)) for version in SUPPORTED_RELEASES),
        ("0.12.0", "TRITON_ATTN", "mistral-7b-v0.1", (14, 8)),
        ("0.12.0", "TRITON_MLA", "deepseek-v2-lite", (5, 4)),
        ("0.33.0", "TRITON_ATTN", "mistral-7b-v0.1", (24, None)),
    )
    if case[0] in SUPPORTED_RELEASES
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


@pytest.mark.compiles
@pytest.mark.parametrize("release, backend, model, kernels", WARM_CASES)
def test_vllm_kernels_warm_for_real_and_verify_deep(tmp_path, release, backend, model, kernels):
    kernels = kernels[0] if kv_storage_classes() == 2 else kernels[1]
    assert kernels is not None, f"no count measured for {backend} of vLLM {release} without buffer ops"
    cache = tmp_path / "cache"
    # The cache named as a server's environment names it; AITER's switch left to the engine's profile.
    environment = {"KPRECOMPILE_CACHE_DIR": str(cache), "VLLM_ROCM_USE_AITER": ""}
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
    warm = kprecompile_cli("warm", *chosen, env=environment)
    assert warm.returncode == 0, warm.stderr[-2000:]
    report = json.loads(warm.stdout)
    assert (report["compiled"], report["failed"]) == (kernels, 0), report
    verify = kprecompile_cli("verify", *chosen, "--deep", env=environment)
    assert verify.returncode == 0, verify.stderr[-2000:]
    assert json.loads(verify.stdout)["warm"] is True
    # A serving process loads every kernel from the cache and compiles none.
    served = {name: value for name, value in os.environ.items() if name != "AITER_JIT_DIR"}
    preload = subprocess.run(
        [sys.executable, "-c", PRELOAD.format(model=model, backend=backend)],
        env={**served, **environment},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert preload.returncode == 0, preload.stderr[-2000:]
    assert json.loads(preload.stdout.strip().splitlines()[-1]) == [kernels, kernels, 0, []]


# Kimi-K2's case: a model type the release's transformers does not know, its config class its own
# code (auto_map); the architecture is one vLLM has. vLLM takes a model for MLA by its type's name:
# pangu_ultra_moe is one in every release from 0.11.2 to 0.34.0, and neither transformers nor
# vLLM's config registry knows it (kimi_k2, the real case, is in vLLM's registry from 0.18).
REMOTE_CONFIG_CODE = """
from transformers import DeepseekV2Config


class KprecompileTestConfig(DeepseekV2Config):
    model_type = "{model_type}"
"""


def test_trust_remote_code_reaches_vllms_config(tmp_path, release):
    """Without the flag vLLM refuses the model's own code: one line, exit 2. With it the plan is the
    one of the same config under a type transformers knows (the control: more than 0 kernels)."""
    from importlib import resources

    preset = json.loads((resources.files("kprecompile.inputs.presets") / "deepseek-v2-lite.json").read_text())
    remote = tmp_path / "remote"
    remote.mkdir()
    model_type = "pangu_ultra_moe"
    (remote / "configuration_kprecompile_test.py").write_text(REMOTE_CONFIG_CODE.format(model_type=model_type))
    auto_map = {"AutoConfig": "configuration_kprecompile_test.KprecompileTestConfig"}
    (remote / "config.json").write_text(json.dumps({**preset, "model_type": model_type, "auto_map": auto_map}))
    chosen = ["--engine", "vllm", "--attention-backend", "TRITON_MLA", "--family", "triton_mla", "--target", "gfx942"]
    chosen += ["--max-num-seqs", "4", "--max-model-len", "4096", "--cache-dir", tmp_path / "cache", "--json"]
    refused = kprecompile_cli("plan", "--model", remote, *chosen)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.splitlines()[-1] == (
        "kprecompile: --trust-remote-code: got 'not given', expected the flag: the model's config names its own "
        "code (auto_map), which vLLM runs only with --trust-remote-code"
    )
    trusted = kprecompile_cli("plan", "--model", remote, "--trust-remote-code", *chosen)
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    known = kprecompile_cli("plan", "--model", "deepseek-v2-lite", *chosen)
    assert known.returncode == 0, known.stderr[-2000:]
    [trusted_row] = json.loads(trusted.stdout)["families"]
    [known_row] = json.loads(known.stdout)["families"]
    assert trusted_row["error"] is None and known_row["kernels"] > 0
    assert (trusted_row["calls"], trusted_row["kernels"]) == (known_row["calls"], known_row["kernels"])


def test_the_absorbed_bmm_follows_the_kv_b_proj_vllm_builds(tmp_path, release):
    """An FP8 checkpoint that leaves kv_b_proj unquantized (`ignored_layers`) has bf16 absorbed
    weights in vLLM's build, which takes AITER's FP4 BMM on gfx950 where the release has it; the
    same checkpoint quantizing kv_b_proj (the control) keeps the FP8 BMM."""
    from importlib import resources

    from kprecompile.inputs.flag_defaults import release_defaults
    from kprecompile.selection.engines import FP4_BMM_FLAG

    preset = json.loads((resources.files("kprecompile.inputs.presets") / "deepseek-v2-lite.json").read_text())
    kv_b_proj = [f"model.layers.{index}.self_attn.kv_b_proj" for index in range(preset["num_hidden_layers"])]
    environment = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_FP8BMM": "1", FP4_BMM_FLAG: "1"}
    quantization = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    plans = {}
    for name, ignored in (("kv_b_proj left bf16", kv_b_proj), ("all quantized", [])):
        model = tmp_path / name.replace(" ", "-")
        model.mkdir()
        # Blocks of 128 (AITER's FP8 MoE takes no other from 0.30): the dense MLP widened from
        # V2-Lite's 10,944 to a multiple of them, which vLLM requires.
        config = {
            **preset,
            "intermediate_size": 11008,
            "quantization_config": {**quantization, "ignored_layers": ignored},
        }
        (model / "config.json").write_text(json.dumps(config))
        result = kprecompile_cli(
            "plan", "--model", model, "--target", "gfx950", "--max-num-seqs", "4", "--max-model-len", "1024",
            "--family", "fp8_bmm", "--family", "fp4_bmm", "--cache-dir", tmp_path / "cache", "--json",
            env=environment,
        )  # fmt: skip
        assert result.returncode in (0, 1), result.stderr[-2000:]
        document = json.loads(result.stdout)
        if not document["layers"]["source"].startswith(f"vLLM {release}'s"):
            [why] = [line for line in result.stderr.splitlines() if "could not build" in line]
            if "aiter" not in why:
                pytest.fail(why)
            pytest.skip(f"vLLM {release}'s FP8 layers need more of AITER than the registry's: {why}")
        plans[name] = (
            {kind["kv_b_proj_dtype"] for kind in document["layers"]["kinds"]},
            {row["family"]: row for row in document["families"]},
        )
    (left_dtypes, left), (quantized_dtypes, quantized) = plans["kv_b_proj left bf16"], plans["all quantized"]
    assert (left_dtypes, quantized_dtypes) == ({"bfloat16"}, {"float8_e4m3fn"})
    assert quantized["fp8_bmm"]["kernels"] > 0 and quantized["fp8_bmm"]["skip_reason"] is None
    if FP4_BMM_FLAG not in release_defaults(release):
        assert left["fp8_bmm"]["kernels"] > 0 and "no FP4 BMM" in left["fp4_bmm"]["skip_reason"]
        return
    assert "vLLM builds it float8_e4m3fn" in quantized["fp4_bmm"]["skip_reason"]
    # vLLM runs the FP4 BMM for the bf16 weights: no FP8 BMM; the FP4 one is planned, or the plan
    # says which AITER it needs (the registry's lacks its wrapper before 0.33's).
    assert left["fp8_bmm"]["kernels"] == 0 and "FP4 BMM" in left["fp8_bmm"]["skip_reason"]
    fp4 = left["fp4_bmm"]
    assert fp4["kernels"] > 0 or "lacks" in (fp4["error"] or fp4["skip_reason"] or ""), fp4
