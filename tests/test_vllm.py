"""The vLLM plugin where vLLM is not installed, and where vLLM moved what it hooks. The plugin, the
planning and the kernels inside each real vLLM release are tests/in_vllm's (run there, one pytest per
release and process, by tests/in_vllm/conftest.py)."""

from __future__ import annotations

import importlib.util
import logging
import re
import subprocess
import sys

import pytest
from vllm_releases import vllm_environment


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
# vLLM moved its model runners, V1's and V2's: both imports fail.
RUNNERS = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")
for name in RUNNERS:
    sys.modules[name] = None
plugin.register()
print("moved:", plugin.loader_hook() is None, flush=True)
for name in RUNNERS:
    del sys.modules[name]
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


@pytest.mark.vllm
@pytest.mark.slow
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
