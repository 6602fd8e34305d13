"""Run inside a real vLLM release (PYTHONPATH=.vllm/<version>), one target per process (vLLM binds
its platform per process): DeepSeek-R1's block-FP8 linear layers (TP 8) where vLLM runs them on
that target. Prints one JSON document.

    python vllm_linear_probe.py TARGET

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
import json
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from test_trace import launch_path_keys
from vllm_kernels_probe import LINE, environment

from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.shapes import FAMILIES
from kprecompile.shapes.block_fp8_linear import DEVICE_NAMES, _tuned_batch_sizes, built_layer, chosen_path
from kprecompile.tracing.trace import trace_calls
from kprecompile.vllm.releases import installed_release

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


if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    document: dict[str, object] = {"release": installed_release(), "engine_rule": engine_rule(target)}
    if target.name == "gfx950" and installed_release().startswith("0.33"):
        document["aiter_path"] = aiter_path(target)
    if target.name == "sm89" and document["engine_rule"]["aiter=0"]["reason"] is None:
        document["triton_gemm"] = triton_gemm(target)
    print(json.dumps(document))
