"""Trace tests/guarded_kernels.py's launch through AITER's `torch_compile_guard` wrapper, then, as
the control, with the module imported outside a trace (the wrapper is then the operator).

A script (tests/test_trace.py runs it) so that the torch library AITER registers the operator in
is cleaned up in a process of its own: that clean-up fails at exit on AITER's qualified names, a
traceback that is AITER's, not the test's. Prints the kernels each way as JSON.
"""

import importlib
import json

from kprecompile.inputs.targets import TARGETS
from kprecompile.tracing.libraries import import_library_module
from kprecompile.tracing.trace import trace_calls

GUARDED = "guarded_kernels"


def traced_kernels(fresh: tuple[str, ...]) -> list[str]:
    def call() -> None:
        importlib.import_module(GUARDED).launch(1000)

    traced = trace_calls([("guarded add", call)], TARGETS["sm90"], "sample", fresh)
    return [json.loads(job.specialization)["name"].rpartition(".")[2] for job in traced.jobs]


if __name__ == "__main__":
    import_library_module("aiter.jit.utils.torch_guard")
    through_the_body = traced_kernels((GUARDED,))
    importlib.import_module(GUARDED)
    as_the_operator = traced_kernels(())
    print(json.dumps({"through_the_body": through_the_body, "as_the_operator": as_the_operator}))
