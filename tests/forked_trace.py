"""A trace split over forked processes against the same trace in one, in a process of its own
(a fork copies only the calling thread, so the trace forks only where no other thread runs: a
fresh interpreter, not the test session).

Prints one JSON line: for DeepSeek-R1 TP8's FP8 BMM at m = 1..96 on gfx942 (192 steps), the
jobs traced in 1 and in 3 processes, and how many processes each used; then what a trace of
the tests' add kernel over 70 steps raises when the step that breaks falls to the forked process
or to this one, and whether a forked process was left behind.
"""

from __future__ import annotations

import json
import os

import torch
from helpers import fp8_bmm_calls, fp8_bmm_shapes, sample_call

from kprecompile.errors import TracingError
from kprecompile.inputs.targets import TARGETS
from kprecompile.shapes.fp8_bmm import FAMILY as FP8_BMM
from kprecompile.tracing.trace import trace_calls


def traced(processes: int):
    os.environ["KPRECOMPILE_TRACE_WORKERS"] = str(processes)
    gfx942 = TARGETS["gfx942"]
    calls = fp8_bmm_calls(fp8_bmm_shapes(range(1, 97)), gfx942)
    result = trace_calls(calls, gfx942, FP8_BMM.name, FP8_BMM.traced_modules)
    return {"processes": result.processes, "calls": result.calls, "jobs": [job.as_dict() for job in result.jobs]}


def broken() -> None:
    torch.empty(3, device="meta").view(2, 2)


def failure(step: int) -> dict:
    """The 70-step trace with step `step` broken: 2 falls to the forked process, 1 to this one."""
    os.environ["KPRECOMPILE_TRACE_WORKERS"] = "2"
    calls = [sample_call("launch_add", n, 64) for n in range(1000, 1070)]
    calls[step] = ("broken call", broken)
    try:
        trace_calls(calls, TARGETS["sm90"], "sample", ("sample_kernels",))
    except TracingError as error:
        return {"error": str(error), "cause": type(error.__cause__).__name__, "children_left": _children_left()}
    return {"error": None, "cause": None, "children_left": _children_left()}


def _children_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


def fork_refused() -> dict:
    """Three processes asked for, the system refusing the second fork (EAGAIN: a process limit,
    memory): the shares not forked run here, nothing is lost and no process is left."""
    real_fork, forks = os.fork, []

    def fork() -> int:
        forks.append(1)
        if len(forks) > 1:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real_fork()

    os.fork = fork
    try:
        result = traced(3)
    finally:
        os.fork = real_fork
    return {**result, "forks": len(forks), "children_left": _children_left()}


print(
    json.dumps(
        {"one": traced(1), "three": traced(3), "failures": [failure(2), failure(1)], "fork_refused": fork_refused()}
    )
)
