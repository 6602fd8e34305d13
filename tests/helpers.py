"""Helpers shared by the tests."""

import importlib
import json

import pytest

from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.shapes import fp8_bmm
from kprecompile.warmup.manifest_key import find_manifest

SAMPLE_MODULE = "sample_kernels"
FP8_BMM = fp8_bmm.FAMILY
# The session's baked configuration (conftest.baked): DeepSeek-V2-Lite, 3 sequences.
BAKED_MODEL = load_model("deepseek-v2-lite")
BAKED_SERVING = ServingParams(max_num_seqs=3)


def sample_call(launcher: str, *args, **kwargs):
    """A (label, call) pair that imports the sample kernels at call time, so a trace that
    re-imports them fresh sees its own copy."""

    def call():
        return getattr(importlib.import_module(SAMPLE_MODULE), launcher)(*args, **kwargs)

    return f"{launcher}{args}", call


def fp8_bmm_shapes(m_values, model="deepseek-r1", tp=8):
    """FP8 BMM shapes of a preset, both products, for the given m values only."""
    serving = ServingParams(tensor_parallel_size=tp, max_num_seqs=max(m_values))
    return tuple(
        shape for shape in FP8_BMM.enumerate_shapes(load_model(model), serving, None) if shape.m in set(m_values)
    )


def fp8_bmm_calls(shapes, target):
    return FP8_BMM.calls(shapes, target)


def baked_manifest(layout, target):
    """The manifest of the session's baked configuration for `target` in `layout`."""
    lookup = find_manifest(
        Request(BAKED_MODEL, BAKED_SERVING, select(BAKED_MODEL, environ={})), target, layout, remember=False
    )
    assert lookup.manifest is not None, f"no baked manifest for {target.name} in {layout.root}"
    return lookup


def run_cli(capsys, *argv):
    """`kprecompile ARGV` in this process: (exit status, stdout, stderr)."""
    from kprecompile.cli import main

    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def run_cli_json(capsys, *argv):
    """`kprecompile ARGV --json`, which must succeed: its document."""
    status, out, err = run_cli(capsys, *argv, "--json")
    assert status == 0, err
    return json.loads(out)
