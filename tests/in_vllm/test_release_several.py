"""Several models and targets in one process (bake, the Python API) trace as each alone: vLLM's
modules are imported afresh per trace, and some define torch operators at import (0.33's
DeepSeek classes), which torch refused the second time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.vllm_process("several")]

FIRST, SECOND = "deepseek-v2-lite", "/work/shared/models/deepseek-r1.json"
TARGETS = ("gfx942", "gfx950")

# The planned kernels of each model's request, traced in this process in the order given.
PLAN_SOURCE = """
def planned(models, targets):
    import kprecompile
    from kprecompile.inputs.serving import ServingParams
    from kprecompile.selection.request import resolve_requests

    serving = ServingParams(max_num_seqs=64, max_model_len=8192)
    requests = resolve_requests(models, serving, targets, engine="vllm", attention_backend="TRITON_MLA")
    found = {}
    for request in requests:
        result = kprecompile.plan(request)
        failed = [f"{row.family} on {row.target}: {row.error}" for row in result.families if row.error]
        found[request.model.name] = {"keys": sorted(job.key for job in result.jobs), "failed": failed}
    return found
"""


def planned(models: list[str], targets: tuple[str, ...]) -> dict[str, dict]:
    namespace: dict = {}
    exec(PLAN_SOURCE, namespace)
    return namespace["planned"](models, targets)


def test_a_second_model_plans_the_kernels_it_plans_alone(release):
    if not os.path.exists(SECOND):
        pytest.skip(f"{SECOND} is not on this machine")
    together = planned([FIRST, SECOND], TARGETS)
    alone = subprocess.run(
        [sys.executable, "-c", f"{PLAN_SOURCE}\nimport json\nprint(json.dumps(planned([{SECOND!r}], {TARGETS!r})))"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    [alone_second] = json.loads(alone.stdout.strip().splitlines()[-1]).values()
    assert alone_second["failed"] == [] and len(alone_second["keys"]) > 0
    assert together[FIRST]["failed"] == [] and len(together[FIRST]["keys"]) > 0
    assert together[SECOND]["failed"] == []
    assert together[SECOND]["keys"] == alone_second["keys"]
