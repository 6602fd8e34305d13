#!/usr/bin/env python3
"""On a real GPU: what compiles while serving is recorded, the next warm compiles it, and the next
serving process compiles nothing (issue 15's proof; vLLM's TRITON_ATTN on NVIDIA).

1. `kprecompile warm` with no visible GPU: Llama-3.1-8B under vLLM's TRITON_ATTN, 8 sequences.
2. A serving process (GPU visible) prepared by `kprecompile.serve.hook.prepare` (verify, preload, the
   JIT monitor recording into the configuration's journal) runs real steps through the
   backend's `forward`: 5 decoding sequences (planned), 16 decoding sequences (beyond
   `--max-num-seqs 8`: a batch the kernels specialize on, a multiple of 16), and a Triton kernel
   no family covers (`unplanned_kernel.py`). Each is checked against a float32 reference.
3. As a builder would: `kprecompile export` from that cache (the manifest, its kernels and the
   journal, signed with a key made for the run), `kprecompile import` into a fresh cache trusting
   that key; there `verify` says the configuration is not warm (kernels recorded), `misses` lists
   them, and `kprecompile warm` with no visible GPU compiles vLLM's (the serving process's own
   binaries stayed in the first cache). The kernel of `unplanned_kernel.py` is not compiled again:
   an imported record is replayed only for the libraries kprecompile traces (docs/serving.md).
4. A new serving process on the builder's cache makes the same calls: 0 compiles but that kernel's.

It also times one journal append against the compiles it records.

    python scripts/gpu_record_replay.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from gpu_e2e import run_json  # noqa: E402

MODEL, BACKEND = "llama-3.1-8b-instruct", "TRITON_ATTN"
MAX_NUM_SEQS = 8
SERVING = ["--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", "4096", "--max-model-len", "4096"]
# (query lengths, context lengths): a planned decode batch, and one beyond --max-num-seqs.
PLANNED = ([1] * 5, [37, 1000, 3, 2500, 129])
BEYOND = ([1] * 16, [61 * i + 5 for i in range(16)])


def command(*words: str) -> list[str]:
    return [sys.executable, "-m", "kprecompile", *words]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    from kprecompile.inputs.targets import detect_local_target

    target = detect_local_target().name
    selectors = ["--model", MODEL, "--engine", "vllm", "--attention-backend", BACKEND, "--target", target, *SERVING]
    # The warm imports recorded kernels by module name: this directory's is on its path.
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    gpu = {**os.environ, "PYTHONPATH": path}
    hidden = {**gpu, "CUDA_VISIBLE_DEVICES": ""}
    with tempfile.TemporaryDirectory(prefix="record-replay-") as scratch:
        host, builder, archive, key = (str(Path(scratch) / name) for name in ("host", "builder", "host.tgz", "key"))
        run_json(command("key", "generate", key, "--json"), hidden)
        first_warm = run_json(command("warm", *selectors, "--cache-dir", host, "--json"), hidden)
        first = run_json([sys.executable, __file__, "--serve", host], gpu)
        signed = ["--archive", archive, "--signing-key", key]
        run_json(command("export", *selectors, "--cache-dir", host, *signed, "--json"), hidden)
        trusting = ["--cache-dir", builder, "--trusted-key", f"{key}.pub"]
        imported = run_json(command("import", archive, *trusting, "--json"), hidden)
        # Not warm, by design: its exit status and first line are part of the proof.
        verified = subprocess.run(
            command("verify", *selectors, "--cache-dir", builder),
            env=hidden,
            capture_output=True,
            text=True,
            check=False,
        )
        status, verified = verified.returncode, verified.stdout
        misses = run_json(command("misses", "--cache-dir", builder, "--json"), hidden)
        started = time.perf_counter()
        second_warm = run_json(command("warm", *selectors, "--cache-dir", builder, "--json"), hidden)
        second_warm_seconds = time.perf_counter() - started
        second = run_json([sys.executable, __file__, "--serve", builder], gpu)
    failed = report(
        target, first_warm, first, imported, status, verified, misses, second_warm, second_warm_seconds, second
    )
    sys.exit(1 if failed else 0)


def report(
    target, first_warm, first, imported, status, verified, misses, second_warm, second_warm_seconds, second
) -> bool:
    print(f"GPU record and replay: {MODEL}, vLLM {first['vllm']} {BACKEND}, target {target}, {first['device']}")
    print(f"warm with no visible GPU: {first_warm['kernels']} kernels ({first_warm['compiled']} compiled)")
    for label, served in (("first serving process", first), ("after the second warm", second)):
        calls = ", ".join(f"{name} {count}" for name, count in served["compiles_per_call"].items())
        print(
            f"{label}: preload {served['preload']['loaded']} kernels; compiles per call: {calls}; "
            f"max abs error vs float32: {served['max_error']:.2e}"
        )
    print(f"recorded in the journal: {', '.join(first['recorded'])}")
    print(
        f"journal append: {first['append_ms']:.2f} ms per record (median of 20), against "
        f"{first['compile_ms']:.0f} ms of compiling per recorded kernel"
    )
    print(f"export from the serving host's cache, import on the builder: {imported['journal_records']} records merged")
    print(f"verify on the builder: exit {status}: {verified.strip().splitlines()[0]}")
    [journal] = misses["journals"]
    print(
        f"misses: {len(journal['misses'])} kernels: "
        + "; ".join(
            f"{m['kernel'].rpartition(':')[2]} ({m['library']}, {m['family'] or 'no family'})"
            for m in journal["misses"]
        )
    )
    [row] = [family for family in second_warm["families"] if family["family"] == "recorded"]
    print(
        f"second warm with no visible GPU: recorded {row['calls']}, replayed {row['parameters']['replayed']}, "
        f"skipped {row['parameters']['skipped']}; {second_warm['compiled']} compiled in "
        f"{second_warm_seconds:.1f} s"
    )
    recorded, outside = len(first["recorded"]), first["recorded_outside_libraries"]
    second_compiles = dict(second["compiles_per_call"])
    # Imported, the unplanned kernel's record is not replayed: the builder's server compiles it again.
    unplanned = second_compiles.pop("rms_norm_rows (no family)")
    return bool(
        sum(second_compiles.values())
        or unplanned != outside
        or first["compiles_per_call"]["planned decode (5 sequences)"]
        or not recorded
        or not outside
        or second_warm["compiled"] != recorded - outside
        or status != 1
        or max(first["max_error"], second["max_error"]) > 0.05
    )


def serve(cache_dir: Path) -> None:
    import torch
    import vllm
    from unplanned_kernel import reference, rms_norm_rows
    from vllm_e2e import TritonAttnCase, selection_for, vllm_platform

    from kprecompile.cache import journal
    from kprecompile.inputs.models import load_model
    from kprecompile.inputs.serving import ServingParams
    from kprecompile.inputs.targets import detect_local_target
    from kprecompile.serve.hook import jit_monitor, prepare

    vllm_platform()
    target = detect_local_target()
    model = load_model(MODEL)
    serving = ServingParams(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=4096, max_model_len=4096)
    prepared = prepare(
        model, serving, cache_dir=cache_dir, target=target, selection=selection_for(model, BACKEND, target)
    )
    monitor = jit_monitor()
    case = TritonAttnCase(model, serving, target)
    generator = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(300, 4096, generator=generator, device="cuda").bfloat16()

    def norm_error() -> float:
        return (rms_norm_rows(x).float() - reference(x)).abs().max().item()

    calls = {
        "planned decode (5 sequences)": lambda: case.error(PLANNED),
        f"decode beyond --max-num-seqs ({len(BEYOND[0])} sequences)": lambda: case.error(BEYOND),
        "rms_norm_rows (no family)": norm_error,
    }
    compiles, errors = {}, []
    for name, call in calls.items():
        before = len(monitor.compiles)
        errors.append(call())
        torch.cuda.synchronize()
        compiles[name] = len(monitor.compiles) - before
    sink = monitor.sink
    records = journal.read_records(sink.layout, sink.key)
    new = [event for event in monitor.compiles]
    sample = next(iter(records.values()), None)
    append_ms = []
    if sample is not None:
        for n in range(20):
            copy = journal.Record(**{**sample.__dict__, "triton_key": f"{n:064x}"})
            started = time.perf_counter()
            journal.append(sink.layout, "f" * 64, [copy])
            append_ms.append((time.perf_counter() - started) * 1000)
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(0),
                "vllm": vllm.__version__,
                "preload": prepared.preload.as_dict() if prepared.preload else {"loaded": 0},
                "compiles_per_call": compiles,
                "max_error": max(errors),
                "recorded": sorted(record.kernel.rpartition(":")[2] for record in records.values()),
                "recorded_outside_libraries": sum(
                    record.kernel.partition(":")[0] == "unplanned_kernel" for record in records.values()
                ),
                "append_ms": statistics.median(append_ms) if append_ms else 0.0,
                "compile_ms": 1000 * sum(event.seconds for event in new) / max(len(new), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
