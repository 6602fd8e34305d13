"""The defaults each release gives the selection flags, as vLLM itself imports them: the table a
plan reads (`inputs/flag_defaults.json`) and the reader that runs a release's `envs.py` alone agree
with the release's own `vllm.envs`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kprecompile.inputs.flag_defaults import defaults_table, flag_names, read_envs_defaults, release_defaults
from kprecompile.tracing.libraries import import_library_module

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.vllm_process("capture-rocm")]


def _vllms_own_defaults() -> dict[str, str]:
    envs = import_library_module("vllm.envs")
    defaults = {}
    for name in flag_names():
        if name not in envs.environment_variables:
            continue
        saved = os.environ.pop(name, None)
        try:
            defaults[name] = "1" if envs.environment_variables[name]() else "0"
        finally:
            if saved is not None:
                os.environ[name] = saved
    return defaults


def test_the_flag_defaults_table_reads_as_this_release_does(release):
    own = _vllms_own_defaults()
    assert "VLLM_ROCM_USE_AITER_FP8BMM" in own and "VLLM_ROCM_USE_AITER" in own
    assert defaults_table()[release] == own
    assert release_defaults(release) == own
    envs_file = Path(import_library_module("vllm.envs").__file__)
    assert read_envs_defaults(envs_file) == own
