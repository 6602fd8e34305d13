"""Helpers shared by the tests."""

import importlib
from functools import partial

from kprecompile.models import load_model
from kprecompile.providers import provider_for
from kprecompile.serving import ServingParams
from kprecompile.shapes.fp8_bmm import FAMILY, enumerate_fp8_bmm

SAMPLE_MODULE = "sample_kernels"


def sample_call(launcher: str, *args, **kwargs):
    """A (label, call) pair that imports the sample kernels at call time, so a trace that
    re-imports them fresh sees its own copy."""

    def call():
        return getattr(importlib.import_module(SAMPLE_MODULE), launcher)(*args, **kwargs)

    return f"{launcher}{args}", call


def fp8_bmm_shapes(m_values, model="deepseek-r1", tp=8):
    """FP8 BMM shapes of a preset, both products, for the given m values only."""
    serving = ServingParams(tensor_parallel_size=tp, max_num_seqs=max(m_values))
    return tuple(shape for shape in enumerate_fp8_bmm(load_model(model), serving) if shape.m in set(m_values))


def fp8_bmm_calls(shapes, target):
    provider = provider_for(FAMILY)
    return [(provider.describe(shape), partial(provider.launch, shape, target)) for shape in shapes]
