"""AITER's FP4 BMM as vLLM calls it on gfx950: the plan's keys are the keys of the real operator
path. AITER's package on the index has no `batched_gemm_a16wfp4`: these run where the AITER a
release's ROCm image builds is importable (`kprecompile engine install vllm==0.25.1 --aiter-source
CLONE`, then that release's directory first on PYTHONPATH), and are skipped elsewhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from helpers import launch_path_keys

from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.shapes.fp4_bmm import FAMILY, WRAPPER_MODULE
from kprecompile.tracing.libraries import import_library_module
from kprecompile.tracing.trace import trace_calls


def _has_fp4_bmm() -> bool:
    """Whether the installed AITER ships the FP4 BMM (where, it moved in v0.1.10), found without
    importing AITER."""
    spec = importlib.util.find_spec("aiter")
    if spec is None or not spec.submodule_search_locations:
        return False
    package = Path(next(iter(spec.submodule_search_locations)))
    return any((package / "ops" / "triton").rglob("batched_gemm_a16wfp4.py"))


pytestmark = [
    pytest.mark.slow,
    pytest.mark.compiles,
    pytest.mark.skipif(
        not _has_fp4_bmm(),
        reason="the installed AITER has no batched_gemm_a16wfp4 (AITER's own source has it: --aiter-source)",
    ),
]
COUNTS = (1, 7, 16, 33, 64)


def _operator_call(shape):
    """The call through AITER's torch operator, on CPU tensors laid out as vLLM lays them out."""

    def call():
        bmm = import_library_module(WRAPPER_MODULE).batched_gemm_a16wfp4
        heads, m, k, n = shape.heads, shape.m, shape.k, shape.n
        if shape.product == "q_nope_w_uk":
            weight = torch.empty((n, heads, k // 2), dtype=torch.uint8).transpose(0, 1)
            scale = torch.empty((n, heads, k // 32), dtype=torch.uint8).transpose(0, 1)
            q = torch.empty((m, heads, shape.source_head_width), dtype=torch.bfloat16)
            bmm(q[..., :k].transpose(0, 1), weight, scale, transpose_bm=True, prequant=True, y_scale=None)
        else:
            weight = torch.empty((heads, n, k // 2), dtype=torch.uint8)
            scale = torch.empty((heads, n, k // 32), dtype=torch.uint8)
            x = torch.empty((m, heads * k), dtype=torch.bfloat16).view(-1, heads, k).transpose(0, 1)
            out = torch.empty((m, heads * n), dtype=torch.bfloat16).view(-1, heads, n)
            bmm(x, weight, scale, y=out, transpose_bm=True, prequant=True, y_scale=None)

    return call


def test_the_planned_fp4_bmm_keys_are_the_operator_paths(tmp_path, gfx950):
    shapes = FAMILY.enumerate_shapes(load_model("deepseek-v2-lite"), ServingParams(max_num_seqs=64), None)
    products = [shape for shape in shapes if shape.m in COUNTS]
    launched = set()
    for index, shape in enumerate(products):
        launched.update(launch_path_keys(tmp_path / str(index), gfx950, _operator_call(shape), FAMILY.traced_modules))
    planned = trace_calls(FAMILY.calls(tuple(products), gfx950), gfx950, FAMILY.name, FAMILY.traced_modules)
    assert len(launched) >= 4 and {job.key for job in planned.jobs} == launched
    # The control: a plan without the largest count misses what it launches.
    fewer = tuple(shape for shape in products if shape.m != COUNTS[-1])
    partial = trace_calls(FAMILY.calls(fewer, gfx950), gfx950, FAMILY.name, FAMILY.traced_modules)
    assert launched - {job.key for job in partial.jobs}
