"""A stand-in serving process for the runtime tests: activate, monitor, preload, then call.

Run as `python serving_process.py CACHE_DIR M [M ...]`: after preloading DeepSeek-V2-Lite's
planned kernels (3 sequences, gfx942, FP8 BMM only), it calls AITER's FP8 BMM exactly as the
engine does for each m, under the cross-compile driver (so a call ends at its launch, which is
refused), and prints one JSON line: what preload loaded and what the monitor saw.
"""

from __future__ import annotations

import json
import sys

from kprecompile.driver import LaunchRefusedError, active_target
from kprecompile.engines import select
from kprecompile.models import load_model
from kprecompile.monitor import JitMonitor, UnplannedCompileError
from kprecompile.providers import provider_for
from kprecompile.runtime import activate, preload
from kprecompile.serving import ServingParams
from kprecompile.shapes.fp8_bmm import enumerate_fp8_bmm
from kprecompile.targets import TARGETS


def main() -> None:
    cache_dir, m_values = sys.argv[1], [int(m) for m in sys.argv[2:]]
    layout = activate(cache_dir)
    monitor = JitMonitor().install()
    model, target = load_model("deepseek-v2-lite"), TARGETS["gfx942"]
    selection = select(model, environ={}, families=["fp8_bmm"])
    report = preload(model, ServingParams(max_num_seqs=3), layout, target=target, selection=selection)
    after_preload = len(monitor.compiles)
    provider = provider_for("fp8_bmm")
    outcomes = []
    shapes = enumerate_fp8_bmm(model, ServingParams(max_num_seqs=max(m_values, default=1)))
    for shape in (shape for shape in shapes if shape.m in m_values):
        try:
            with active_target(target):
                provider.launch(shape, target)
            outcomes.append("returned")
        except LaunchRefusedError:
            outcomes.append("reached launch")
        except UnplannedCompileError as error:
            outcomes.append(f"strict: {error}")
    print(json.dumps({
        "preload": report.as_dict(),
        "compiles_during_preload": after_preload,
        "compiles": [event.kernel for event in monitor.compiles],
        "outcomes": outcomes,
        "summary": monitor.summary(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
