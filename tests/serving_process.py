"""A stand-in serving process for the runtime tests: activate, monitor, preload, then call.

Run as `python serving_process.py CACHE_DIR M [M ...]`: after preloading DeepSeek-V2-Lite's
planned kernels (3 sequences, gfx942: the session's bake), it calls AITER's FP8 BMM exactly as
the engine does for each m, under the cross-compile driver (so a call ends at its launch, which
is refused), and prints one JSON line: what preload loaded and what the monitor saw, per call.
"""

from __future__ import annotations

import json
import sys

from kprecompile.driver import active_target
from kprecompile.engines import select
from kprecompile.errors import LaunchRefusedError, UnplannedCompileError
from kprecompile.models import load_model
from kprecompile.monitor import JitMonitor
from kprecompile.runtime import activate, preload
from kprecompile.serving import ServingParams
from kprecompile.shapes.fp8_bmm import FAMILY as FP8_BMM
from kprecompile.targets import TARGETS


def main() -> None:
    cache_dir, m_values = sys.argv[1], [int(m) for m in sys.argv[2:]]
    layout = activate(cache_dir)
    monitor = JitMonitor().install()
    model, target = load_model("deepseek-v2-lite"), TARGETS["gfx942"]
    report = preload(model, ServingParams(max_num_seqs=3), layout, target=target, selection=select(model))
    after_preload = len(monitor.compiles)
    outcomes, compiles_per_call = [], []
    shapes = FP8_BMM.enumerate_shapes(model, ServingParams(max_num_seqs=max(m_values, default=1)))
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
    print(json.dumps({
        "preload": report.as_dict(),
        "compiles_during_preload": after_preload,
        "compiles": [event.kernel for event in monitor.compiles],
        "outcomes": outcomes,
        "compiles_per_call": compiles_per_call,
        "summary": monitor.summary(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
