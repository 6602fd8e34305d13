"""Block-FP8 linear layers (DeepSeek-R1, TP 8) where each real vLLM release runs them, the ROCm target
and the NVIDIA ones in processes of their own (vLLM binds its platform per process): the plan's rule
is the path vLLM's own linear method chooses, and where that path is vLLM's Triton GEMM on an NVIDIA
GPU (sm89 up to 0.18) the plan's keys are the launch path's, compiled for sm89 for real, and a random
sweep is covered.

1. The engine rule against vLLM's own choice: the reason (or none) kprecompile's selection gives
   the target, and the path vLLM's own linear method (`Fp8LinearMethod`, built as vLLM builds it)
   chooses for every layer; on ROCm targets with AITER off and on (VLLM_ROCM_USE_AITER).
2. Where vLLM takes AITER's path (0.19+ with AITER on gfx950): whether its kernel chose AITER's
   Triton GEMM per layer (`use_triton`), whether AITER's installed tables list that (N, K), and the
   Triton kernels one forward of every layer launches there (eager, so the activation
   quantization runs too).
3. Where vLLM takes its Triton GEMM on an NVIDIA target (sm89 up to 0.18): the plan's keys of a
   GEMM under the default config and under a device's tuned table against Triton's launch path (which
   compiles each for sm89 for real); a random sweep of layers, token counts and devices against
   the plan; plans without the M multiples of 16, or without the tuned devices (negative controls).
"""

from __future__ import annotations

import functools
import random
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import launch_path_keys
from kernel_probes import LINE
from release_support import environment

from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.shapes import FAMILIES
from kprecompile.shapes.block_fp8_linear import DEVICE_NAMES, _tuned_batch_sizes, built_layer, chosen_path
from kprecompile.tracing.trace import trace_calls
from kprecompile.vllm.releases import installed_release, release_line

LINEAR = FAMILIES["block_fp8_linear"]
SERVING = {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "max_model_len": 8192, "tensor_parallel_size": 8}


def shapes_of(target, **serving: object):
    """The family's shapes for one target's arch (the ROCm ones where it is not one of the family's)."""
    shapes = LINEAR.enumerate_shapes(load_model("deepseek-r1"), ServingParams(**{**SERVING, **serving}), LINE)
    arch = target.name if target.name in DEVICE_NAMES else "gfx950" if target.is_rocm else "sm89"
    return [replace(shape, arch=target.name) for shape in shapes if shape.arch == arch]


def one_per_layer(shapes):
    return list({shape.layer: shape for shape in shapes}.values())


def keys_of(shapes, target) -> set[str]:
    return {
        job.key
        for job in trace_calls(
            LINEAR.calls(tuple(shapes), target), target, "block_fp8_linear", LINEAR.traced_modules
        ).jobs
    }


def engine_rule(target) -> dict[str, object]:
    model = load_model("deepseek-r1")
    document: dict[str, object] = {}
    for aiter in ("0", "1") if target.is_rocm else ("0",):
        engine = "vllm-aiter" if aiter == "1" else "vllm"
        [choice] = [
            c
            for c in select(model, engine, None, environ={}, vllm_release=installed_release(), targets=[target]).choices
            if c.family == "block_fp8_linear"
        ]
        chose: dict[str, object] = {}

        def build(chose=chose):
            for shape in one_per_layer(shapes_of(target)):
                with built_layer(shape, target, loaded=False) as (method, _):
                    kernel = getattr(method, "fp8_linear", None)
                    chose[shape.layer] = [chosen_path(method), getattr(kernel, "use_triton", None)]

        with environment(VLLM_ROCM_USE_AITER=aiter):
            trace_calls([("build", build)], target, "block_fp8_linear", LINEAR.traced_modules)
        document[f"aiter={aiter}"] = {
            "reason": choice.skip_reason or choice.skip_reason_on(target.name),
            "vllm_chose": chose,
        }
    return document


def aiter_path(target) -> dict[str, object]:
    """One eager forward of every layer through vLLM's AITER path: the Triton kernels it launches."""
    import torch

    layers = {}
    for shape in one_per_layer(shapes_of(target, enforce_eager=True)):
        shape = replace(shape, m=17)

        def forward(shape=shape):
            with built_layer(shape, target) as (method, layer):
                method.apply(layer, torch.empty((shape.m, shape.k), dtype=getattr(torch, shape.dtype)))

        with environment(VLLM_ROCM_USE_AITER="1"):
            traced = trace_calls([("forward", forward)], target, "block_fp8_linear", LINEAR.traced_modules)
        layers[shape.layer] = {
            "n": shape.n,
            "k": shape.k,
            "kernels": len(traced.jobs),
            "aiter_table": aiter_table(shape.n, shape.k),
        }
        if len(layers) == 1:
            # The same forward with AITER off launches vLLM's Triton kernels: the trace sees them.
            with environment(VLLM_ROCM_USE_AITER="0"):
                traced = trace_calls([("forward", forward)], target, "block_fp8_linear", LINEAR.traced_modules)
            layers["control: AITER off"] = {"kernels": len(traced.jobs)}
    return layers


def aiter_table(n: int, k: int) -> bool:
    """Whether the installed AITER ships an MI350X tuned table for its Triton block-scale GEMM at (N, K)."""
    import importlib.util

    directory = Path(next(iter(importlib.util.find_spec("aiter").submodule_search_locations)))
    return (directory / "ops/triton/configs/gemm" / f"MI350X-GEMM-A8W8_BLOCKSCALE-N={n}-K={k}.json").is_file()


def triton_gemm(target, seed: int = 12) -> dict[str, object]:
    graph = shapes_of(target)
    # A layer and device with a tuned table in the release (DeepSeek-R1's have L20 tables, not L40S
    # ones), and one without, both at an M of the same integer class: only the table differs.
    tuned = next(
        s for s in graph if s.m > 1 and s.m % 16 and _tuned_batch_sizes(s.n, s.k, s.device_name, s.block) is not None
    )
    rng = random.Random(seed)
    plan_keys = keys_of(graph, target)
    swept = []
    for _ in range(40):
        m = rng.choice(
            [1, rng.randint(1, 64), 16 * rng.randint(1, 64), rng.randint(1, SERVING["max_num_batched_tokens"])]
        )
        swept.append(replace(rng.choice(graph), m=m, device_name=rng.choice(DEVICE_NAMES["sm89"])))
    swept_keys = keys_of(swept, target)
    tuned_devices = ("NVIDIA_L40S", "NVIDIA_L20", "NVIDIA_L20Y")
    untuned_only = [s for s in graph if s.device_name not in tuned_devices]
    coverage = {
        "steps": len(swept),
        "kernels": len(swept_keys),
        "plan": len(plan_keys),
        "missing": len(swept_keys - plan_keys),
        "missing_without_div16": len(swept_keys - keys_of([s for s in graph if s.m % 16], target)),
        "missing_untuned_only": len(swept_keys - keys_of(untuned_only, target)),
    }
    untuned = next(
        s for s in graph if s.m > 1 and s.m % 16 and _tuned_batch_sizes(s.n, s.k, s.device_name, s.block) is None
    )
    calls = {"gemm default config": untuned, "gemm tuned table": tuned}
    rows = {}
    for label, shape in calls.items():
        traced = trace_calls(
            [("call", functools.partial(LINEAR.launch, shape, target))],
            target,
            "block_fp8_linear",
            LINEAR.traced_modules,
        )
        rows[label] = {
            "traced": [job.key for job in traced.jobs],
            "kernels": [job.kernel.rpartition(":")[2] for job in traced.jobs],
        }
    # Traced first, then compiled for real: a kernel compiled in this process is launched, not traced.
    for label, shape in calls.items():
        with tempfile.TemporaryDirectory() as cache:
            rows[label]["launched"] = launch_path_keys(
                cache, target, functools.partial(LINEAR.launch, shape, target), LINEAR.traced_modules
            )
            rows[label]["compiled_files"] = sorted(path.suffix for path in Path(cache).rglob("*") if path.is_file())
    return {"coverage": coverage, "keys": rows}


pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def target_process(name: str):
    """The targets of one vendor share a process: vLLM's config checks its platform's GPUs."""
    vendor = "rocm" if TARGETS[name].is_rocm else "nvidia"
    return pytest.param(name, marks=pytest.mark.vllm_process(f"linear-{vendor}"))


UP_TO_0_18 = pytest.mark.vllm_releases("0.11.2", "0.12.0")


@pytest.fixture(scope="module")
def linear_probe(target):
    """The engine rule on `target`, and where vLLM takes AITER's path (0.33 on gfx950) or its Triton
    GEMM on an NVIDIA target (sm89 up to 0.18), what runs there."""
    target = TARGETS[target]
    document: dict[str, object] = {"release": installed_release(), "engine_rule": engine_rule(target)}
    if target.name == "gfx950" and installed_release().startswith("0.33"):
        document["aiter_path"] = aiter_path(target)
    if target.name == "sm89" and document["engine_rule"]["aiter=0"]["reason"] is None:
        document["triton_gemm"] = triton_gemm(target)
    return document


@pytest.mark.parametrize("target", [target_process(name) for name in ("sm80", "sm89", "sm90")], scope="module")
def test_on_nvidia_the_plan_follows_the_path_vllms_linear_method_chooses(linear_probe, target, release):
    """sm80: Marlin's weight-only FP8; sm89: vLLM's Triton GEMM up to 0.18, Marlin from 0.19; sm90:
    CUTLASS. Planned exactly where vLLM chose its Triton GEMM for every layer. The Marlin and Triton
    choices are vLLM's own Python; whether CUTLASS takes block FP8 is vLLM's compiled query
    (`cutlass_scaled_mm_supports_block_fp8`, capability 90 and up in its C++), which a builder
    cannot load: there kprecompile's stand-in answers it, from the threshold its rule uses."""
    triton = {"_run_triton", "TritonFp8BlockScaledMMKernel"}
    expected = {
        "sm80": "marlin",
        "sm89": "marlin" if release_line(release).cuda_sm89_block_fp8 == "marlin" else "triton",
        "sm90": "cutlass",
    }
    path = expected[target]
    rule = linear_probe["engine_rule"]["aiter=0"]
    chose = {chosen for chosen, _ in rule["vllm_chose"].values()}
    assert len(rule["vllm_chose"]) == 8 and len(chose) == 1, (target, chose)
    assert (rule["reason"] is None) == (chose <= triton), (target, rule)
    assert path in next(iter(chose)).lower(), (target, chose)
    if rule["reason"] is not None:
        assert path in rule["reason"].lower() and "nothing to compile" in rule["reason"], (target, rule)


@UP_TO_0_18
@pytest.mark.compiles
@pytest.mark.parametrize("target", [target_process("sm89")], scope="module")
def test_sm89_triton_gemm_keys_coverage_and_a_real_compile(linear_probe):
    document = linear_probe["triton_gemm"]
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


@pytest.mark.vllm_releases("0.33.0")
@pytest.mark.parametrize("target", [target_process("gfx950")], scope="module")
def test_vllm_0_33_with_aiter_on_gfx950_runs_no_triton_kernel_for_any_layer(linear_probe):
    """vLLM 0.33's AiterFp8BlockScaledMMKernel asks AITER's gemm_config_utils which (N, K) its Triton
    GEMM is tuned for; the installed amd-aiter has no such module (it ships MI350X tables for six
    of the eight layers all the same), so vLLM chose CK for every layer, and one eager forward of
    each (AITER's group quantization, CK GEMM) launches no Triton kernel, where the same forward
    with AITER off does. The plan says so."""
    rule = linear_probe["engine_rule"]
    assert rule["aiter=0"]["reason"] is None
    assert set(map(tuple, rule["aiter=1"]["vllm_chose"].values())) == {("AiterFp8BlockScaledMMKernel", False)}
    assert "has no such module, so every layer runs CK: nothing to compile" in rule["aiter=1"]["reason"]
    layers = dict(linear_probe["aiter_path"])
    control = layers.pop("control: AITER off")
    assert control["kernels"] > 0
    assert len(layers) == 8 and all(layer["kernels"] == 0 for layer in layers.values())
    assert sum(layer["aiter_table"] for layer in layers.values()) == 6


@UP_TO_0_18
@pytest.mark.parametrize("target", [target_process("gfx950")], scope="module")
def test_up_to_0_18_gfx950_takes_vllms_triton_gemm_with_aiter_on_and_off(linear_probe):
    rule = linear_probe["engine_rule"]
    for setting in ("aiter=0", "aiter=1"):
        assert rule[setting]["reason"] is None
        assert {chosen for chosen, _ in rule[setting]["vllm_chose"].values()} == {"_run_triton"}
