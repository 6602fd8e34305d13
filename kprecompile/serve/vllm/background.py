"""The warm that runs beside vLLM's weight loading, in a process of its own.

A serving process must not trace in a thread: tracing swaps Triton's active driver, torch's
device queries and library modules process-wide, under the engine's feet. So the hook writes
the request to a file and starts `python -m kprecompile.serve.vllm.background REQUEST`
with no GPU visible (it cross-compiles; a CUDA context there would take memory vLLM has
profiled), and joins it before the first kernel that needs the cache. The report comes back as
one JSON line on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ...selection.request import Request

_HIDE_GPUS = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}


@dataclass(frozen=True)
class BackgroundWarm:
    process: subprocess.Popen
    request_file: str

    def join(self) -> tuple[dict[str, Any] | None, str, float]:
        """Wait for the warm: (its WarmReport as a dict or None, its stderr tail, seconds waited)."""
        waited = time.perf_counter()
        out, err = self.process.communicate()
        os.unlink(self.request_file)
        lines = out.strip().splitlines()
        try:
            report = json.loads(lines[-1]) if self.process.returncode in (0, 1) and lines else None
        except ValueError:
            report = None
        return report, "\n".join(err.strip().splitlines()[-3:]), time.perf_counter() - waited


def start(
    request: Request,
    hf_config: dict[str, Any],
    cache_dir: str,
    layers: tuple[str, ...],
    *,
    workers: int,
    rank: int,
    ranks: int,
) -> BackgroundWarm:
    """Start warming `request` (one target) in the background; returns at once."""
    [target] = request.targets
    document = {
        "config": hf_config,
        "name": request.model.name,
        "directory": request.model.directory,
        "serving": asdict(request.serving),
        "engine": request.selection.engine,
        "attention_backend": request.selection.attention_backend,
        # The layers vLLM built in the serving process: they decide the backend and the kinds.
        "attention_layers": [layer.as_dict() for layer in request.model.attention_layers],
        "layers_source": request.model.layers_source,
        "target": target.name,
        "cache_dir": cache_dir,
        "layers": list(layers),
        "workers": workers,
        "rank": rank,
        "ranks": ranks,
    }
    descriptor, request_file = tempfile.mkstemp(prefix="kprecompile-warm-", suffix=".json")
    with os.fdopen(descriptor, "w") as file:
        json.dump(document, file)
    process = subprocess.Popen(
        [sys.executable, "-m", __name__, request_file],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **_HIDE_GPUS},
    )
    return BackgroundWarm(process, request_file)


def main(request_file: str) -> None:
    from ...inputs.layers import AttentionLayer
    from ...inputs.models import model_from_dict
    from ...inputs.serving import ServingParams
    from ...inputs.settings import cache_layout
    from ...inputs.targets import TARGETS
    from ...selection.engines import select
    from ...warmup.warming import warm

    document = json.loads(Path(request_file).read_text())
    model = model_from_dict(
        document["config"],
        name=document["name"],
        source=f"vLLM's config of {document['name']}",
        directory=document["directory"],
    )
    layers = tuple(AttentionLayer(**layer) for layer in document["attention_layers"])
    if layers:
        model = replace(model, attention_layers=layers, layers_source=document["layers_source"])
    serving = document["serving"]
    if serving["cudagraph_capture_sizes"] is not None:
        serving["cudagraph_capture_sizes"] = tuple(serving["cudagraph_capture_sizes"])
    # The same environment as the serving process: the flags select the same families.
    target = TARGETS[document["target"]]
    backend = None if layers else document["attention_backend"]
    served = ServingParams(**serving)
    selection = select(
        model,
        document["engine"],
        backend,
        block_size=served.block_size,
        targets=[target],
        dtype=served.activation_dtype(model),
    )
    report = warm(
        Request(model, served, selection, (target,)),
        cache_layout(document["cache_dir"], tuple(document["layers"])),
        max_workers=document["workers"],
        rank=document["rank"],
        ranks=document["ranks"],
    )
    print(json.dumps(report.as_dict()))
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main(sys.argv[1])
