"""A stand-in serving process for the runtime tests: activate, monitor, preload, then call.

Run as `python serving_process.py CACHE_DIR M [M ...] [add=N] [background]`: after preloading
DeepSeek-V2-Lite's planned kernels (3 sequences, gfx942: the session's bake), with the monitor
recording into the configuration's journal as the loader hook does, it calls AITER's FP8 BMM
exactly as the engine does for each m, and with `add=N` the tests' own `add_kernel` (a kernel no
family covers) over N elements, under the cross-compile driver (so a call ends at its launch,
which is refused), and prints one JSON line: what preload loaded and what the monitor saw, per
call. With `background`, the kernels load in a thread (`start_preload`), joined before the calls.
"""

from __future__ import annotations

import json
import sys

from kprecompile.errors import LaunchRefusedError, UnplannedCompileError
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.platforms.triton_driver import active_target
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.serve.monitor import JitMonitor
from kprecompile.serve.runtime import activate, journal_sink
from kprecompile.shapes.fp8_bmm import FAMILY as FP8_BMM
from kprecompile.warmup.preload import preload, start_preload


def main() -> None:
    cache_dir, arguments = sys.argv[1], sys.argv[2:]
    background = "background" in arguments
    arguments = [argument for argument in arguments if argument != "background"]
    m_values = [int(m) for m in arguments if not m.startswith("add=")]
    add = [int(m.removeprefix("add=")) for m in arguments if m.startswith("add=")]
    layout = activate(cache_dir)
    from triton.runtime import cache as triton_cache

    triton_key = triton_cache.triton_key
    monitor = JitMonitor().install()
    model, target, serving = load_model("deepseek-v2-lite"), TARGETS["gfx942"], ServingParams(max_num_seqs=3)
    request = Request(model, serving, select(model))
    if background:
        report = start_preload(request, layout, target=target).join()
    else:
        report = preload(request, layout, target=target)
    monitor.record_to(journal_sink(Request(model, serving, select(model)), layout, target))
    after_preload = len(monitor.compiles)
    outcomes, compiles_per_call = [], []
    shapes = FP8_BMM.enumerate_shapes(model, ServingParams(max_num_seqs=max(m_values, default=1)), None)
    for shape in (shape for shape in shapes if shape.m in m_values):
        before = len(monitor.compiles)
        try:
            with active_target(target):
                FP8_BMM.launch(shape, target)
            outcomes.append("returned")
        except LaunchRefusedError:
            outcomes.append("reached launch")
        except UnplannedCompileError as error:
            outcomes.append(f"strict: {error}")
        compiles_per_call.append(len(monitor.compiles) - before)
    for n in add:
        import sample_kernels

        before = len(monitor.compiles)
        try:
            with active_target(target):
                sample_kernels.launch_add(n)
            outcomes.append("returned")
        except LaunchRefusedError:
            outcomes.append("reached launch")
        compiles_per_call.append(len(monitor.compiles) - before)
    print(
        json.dumps(
            {
                "preload": report.as_dict(),
                # Whether preload handed Triton its key from the cache's memo, and whether that is
                # the key Triton computes.
                "triton_key_handed": triton_cache.triton_key is not triton_key,
                "triton_key_equal": triton_cache.triton_key() == triton_key(),
                "compiles_during_preload": after_preload,
                "compiles": [event.kernel for event in monitor.compiles],
                "outcomes": outcomes,
                "compiles_per_call": compiles_per_call,
                "summary": monitor.summary(),
            }
        )
    )


if __name__ == "__main__":
    main()
