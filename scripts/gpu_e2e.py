#!/usr/bin/env python3
"""End to end on a real GPU: bake with no visible GPU, serve with zero JIT compiles.

1. `kprecompile warm` in a process that sees no GPU (CUDA_VISIBLE_DEVICES=""), for the local
   GPU's target: AITER's `pa_prefill` (the AITER attention kernel that also runs on NVIDIA),
   Llama-3.1-8B's shapes, through the `aiter` engine profile.
2. A new process, GPU visible: `activate` + `preload` (launchers included) with the JIT monitor
   on, then real `context_attention_fwd` calls with real tensors over more shapes than the
   plan's representatives (other batch sizes, query and context lengths), each checked against
   a float32 torch reference.
3. The same first call in more fresh processes: cold (empty Triton cache, no kprecompile),
   disk cache only (Triton pointed at the warm cache, no preload), and disk cache warmed on
   this GPU host with the GPU visible (which also builds the launchers), no preload.

It prints, from this one run: compiles while serving, max error, first call after preload
against steady state (goal: at most 2x + 5 ms), and the cold and disk-only first calls.

`--part vllm` (or `all`, the default) also proves vLLM's own Triton kernels (`vllm_e2e.py`):
bake for the local target with no visible GPU through `kprecompile warm --engine vllm` with
vLLM's TRITON_ATTN (Llama-3.1-8B) and TRITON_MLA (DeepSeek-V2-Lite), then a new process with
the GPU calls vLLM's real backend code over steps that are not the plan's representatives;
preloads at scale (64 serving configurations of four models, hundreds of kernels); and bakes,
with no visible GPU, models whose attention layers differ per layer (small gpt-oss and Gemma-2
configs: sinks, soft-cap, alternating windows) from vLLM's own model build, then runs each layer
kind through vLLM's own attention layer, metadata builder and impl `forward` with the GPU
(`--part vllm-layers` runs that alone).

    python scripts/gpu_e2e.py [--cache-dir DIR] [--part aiter|vllm|vllm-layers|all]
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

MODEL = "llama-3.1-8b-instruct"
SERVING = ["--max-num-seqs", "64", "--max-num-batched-tokens", "4096", "--max-model-len", "4096"]
MAX_NUM_SEQS, MODEL_LEN, BLOCK_SIZE = 64, 4096, 16
# (batch, query lengths, context lengths): none of these is a plan representative as such.
CALLS = [
    (1, [37], [0]),
    (1, [200], [613]),
    (3, [5, 64, 17], [100, 0, 900]),
    (5, [1, 128, 33, 7, 250], [48, 3, 1500, 0, 77]),
    (7, [300, 2, 2, 90, 16, 45, 8], [0, 2000, 31, 400, 16, 9, 3000]),
    (12, [9] * 12, [i * 111 for i in range(12)]),
]
FIRST_CALL = (4, [70, 12, 130, 3], [250, 1000, 0, 64])


def run_json(argv: list[str], env: dict[str, str]) -> dict:
    """Run a command (these scripts' parts run as processes of their own) and return its JSON;
    stop with its stderr when it fails."""
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv[:6])} failed:\n{result.stderr[-4000:]}")
    try:
        return json.loads(result.stdout)  # a command's one JSON document
    except json.JSONDecodeError:
        return json.loads(result.stdout.strip().splitlines()[-1])  # a serving process's last line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--part", choices=["aiter", "vllm", "vllm-layers", "all"], default="all")
    parser.add_argument("--serve", choices=["preload", "cold", "disk", "layer"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.cache_dir)
        return

    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_e2e needs a visible GPU")
    failed = False
    if args.part in ("aiter", "all"):
        failed |= aiter_part(args.cache_dir)
    if args.part in ("vllm", "vllm-layers", "all"):
        sys.path.insert(0, str(Path(__file__).parent))
        from vllm_e2e import layers_part, vllm_part

        if args.part != "vllm-layers":
            failed |= vllm_part(args.cache_dir, _local_target_name())
        failed |= layers_part(args.cache_dir, _local_target_name())
    if failed:
        sys.exit(1)


def aiter_part(cache_dir: Path | None) -> bool:
    """AITER's pa_prefill; True when a goal was missed."""
    target = _local_target_name()
    with tempfile.TemporaryDirectory(prefix="gpu-e2e-") as scratch:
        cache = cache_dir or Path(scratch) / "cache"
        hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        started = time.perf_counter()
        warm = run_json(
            [
                sys.executable,
                "-m",
                "kprecompile",
                "warm",
                "--model",
                MODEL,
                "--engine",
                "aiter",
                "--target",
                target,
                *SERVING,
                "--cache-dir",
                str(cache),
                "--json",
            ],
            hidden,
        )
        warm_seconds = time.perf_counter() - started
        results = {}
        for mode in ("preload", "cold", "disk"):
            env = {**os.environ, "TRITON_CACHE_DIR": str(Path(scratch) / f"empty-{mode}")}
            results[mode] = run_json([sys.executable, __file__, "--serve", mode, "--cache-dir", str(cache)], env)
        # The same warm on this GPU host, GPU visible: it also builds the launchers.
        gpu_cache = Path(scratch) / "gpu-cache"
        gpu_warm = run_json(
            [
                sys.executable,
                "-m",
                "kprecompile",
                "warm",
                "--model",
                MODEL,
                "--engine",
                "aiter",
                "--target",
                target,
                *SERVING,
                "--cache-dir",
                str(gpu_cache),
                "--json",
            ],
            dict(os.environ),
        )
        env = {**os.environ, "TRITON_CACHE_DIR": str(Path(scratch) / "empty-launchers")}
        results["launchers"] = run_json(
            [sys.executable, __file__, "--serve", "disk", "--cache-dir", str(gpu_cache)], env
        )
        results["launchers"]["built"] = gpu_warm["launchers"]
        # The bake as a read-only image layer: nothing may be written to it.
        before = _tree(cache)
        results["layer"] = run_json([sys.executable, __file__, "--serve", "layer", "--cache-dir", str(cache)], env)
        results["layer"]["layer_unchanged"] = _tree(cache) == before
        written = (cache.parent / "writable").rglob("*")
        results["layer"]["written"] = sorted(path.name for path in written if path.is_file())
    return report(target, warm, warm_seconds, results)


def report(target: str, warm: dict, warm_seconds: float, results: dict) -> bool:
    served = results["preload"]
    steady = served["steady_ms"]
    first = served["first_ms"]
    goal = 2 * steady + 5
    print(f"GPU end to end: {MODEL}, pa_prefill, target {target}, {served['device']}")
    print(
        f"warm with no visible GPU: {warm['kernels']} kernels ({warm['compiled']} compiled), "
        f"{warm['driver_modules']} of Triton's driver modules built "
        f"{'(' + '; '.join(warm['driver_modules_not_built']) + ') ' if warm['driver_modules_not_built'] else ''}"
        f"in {warm_seconds:.1f} s"
    )
    print(
        f"preload: {served['preload']['loaded']} kernels loaded, {served['preload']['compiled']} compiled, "
        f"launchers {served['preload']['launchers']}, {served['preload']['seconds'] * 1000:.0f} ms"
    )
    print(
        f"serving: {served['calls']} real calls, {served['compiles']} compiles while serving, "
        f"max abs error vs float32 torch {served['max_error']:.2e}"
    )
    print(
        f"first call after preload {first:.2f} ms, steady state {steady:.3f} ms: "
        f"{'within' if first <= goal else 'OVER'} the goal of 2x + 5 ms ({goal:.2f} ms)"
    )
    print(
        f"first call, cold (no kprecompile, empty cache): {results['cold']['first_ms']:.1f} ms "
        f"({results['cold']['compiles']} compiles)"
    )
    print(
        f"first call, disk cache only (no preload): {results['disk']['first_ms']:.1f} ms "
        f"({results['disk']['compiles']} compiles)"
    )
    print(
        f"first call, disk cache warmed on this GPU host ({results['launchers']['built']} launchers built, "
        f"no preload): {results['launchers']['first_ms']:.1f} ms"
    )
    layer = results["layer"]
    print(
        f"served from the bake as a read-only layer: {layer['preload']['loaded']} loaded, {layer['compiles']} "
        f"compiles, first call {layer['first_ms']:.2f} ms, layer unchanged: {layer['layer_unchanged']}, "
        f"written to the user cache: {', '.join(layer['written']) or 'nothing'}"
    )
    # Driver modules the bake built are served from the layer: the server builds none.
    rebuilt = warm["driver_modules"] and any(name.endswith(".so") for name in layer["written"])
    return bool(served["compiles"] or first > goal or layer["compiles"] or not layer["layer_unchanged"] or rebuilt)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def _local_target_name() -> str:
    from kprecompile.inputs.targets import detect_local_target

    return detect_local_target().name


def serve(mode: str, cache_dir: Path) -> None:
    """One serving process: prepare as `mode` says, then run the calls on the GPU."""
    import torch

    from kprecompile.inputs.models import load_model
    from kprecompile.inputs.serving import ServingParams
    from kprecompile.inputs.targets import detect_local_target
    from kprecompile.selection.engines import select
    from kprecompile.selection.request import Request
    from kprecompile.serve.monitor import JitMonitor
    from kprecompile.serve.runtime import activate
    from kprecompile.warmup.preload import preload

    model = load_model(MODEL)
    serving = ServingParams(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=4096, max_model_len=MODEL_LEN)
    preload_report = None
    if mode in ("preload", "layer"):
        # "layer": the warm cache as a read-only baked layer over an empty writable cache.
        if mode == "layer":
            layout = activate(Path(cache_dir).parent / "writable", layers=(cache_dir,))
        else:
            layout = activate(cache_dir)
        monitor = JitMonitor("warn").install()
        preload_report = preload(Request(model, serving, select(model, "aiter")), layout, target=detect_local_target())
    else:
        if mode == "disk":
            from kprecompile.cache.layout import CacheLayout

            os.environ["TRITON_CACHE_DIR"] = str(CacheLayout.of(cache_dir).triton_dir)
        monitor = JitMonitor("off").install()
    from kprecompile.tracing.libraries import import_library_module

    context_attention_fwd = import_library_module("aiter.ops.triton.pa_prefill").context_attention_fwd
    generator = torch.Generator(device="cuda").manual_seed(0)
    case = PagedCase(model, serving, generator)

    hits_before = monitor.cache_hits
    if os.environ.get("GPU_E2E_PROFILE"):
        import cProfile
        import io
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
    first_ms = case.timed(context_attention_fwd, *FIRST_CALL)
    if os.environ.get("GPU_E2E_PROFILE"):
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
        print(text.getvalue()[-6000:], file=sys.stderr)
    disk_hits_on_first_call = monitor.cache_hits - hits_before
    steady = [case.timed(context_attention_fwd, *FIRST_CALL) for _ in range(30)]
    max_error = 0.0
    for call in [FIRST_CALL, *CALLS]:
        max_error = max(max_error, case.error(context_attention_fwd, *call))
    print(
        json.dumps(
            {
                "mode": mode,
                "device": torch.cuda.get_device_name(0),
                "preload": preload_report.as_dict() if preload_report else None,
                "first_ms": first_ms,
                "steady_ms": statistics.median(steady),
                "calls": len(CALLS) + 32,
                "compiles": len(monitor.compiles),
                "disk_hits_on_first_call": disk_hits_on_first_call,
                "max_error": max_error,
            }
        )
    )
    monitor.uninstall()


class PagedCase:
    """Real tensors in vLLM's paged layout, and a float32 reference for the same attention."""

    def __init__(self, model, serving, generator):
        import torch

        self.torch = torch
        self.generator = generator
        self.q_heads = serving.heads_per_rank(model)
        self.kv_heads = serving.kv_heads_per_rank(model)
        self.head = model.head_dim
        self.x = 16 // torch.empty((), dtype=torch.bfloat16).element_size()
        blocks = MAX_NUM_SEQS * MODEL_LEN // BLOCK_SIZE
        per_block = self.kv_heads * self.head * BLOCK_SIZE
        self.storage = torch.empty((2, blocks * per_block), dtype=torch.bfloat16, device="cuda")
        self.key_cache = self.storage[0].view(blocks, self.kv_heads, self.head // self.x, BLOCK_SIZE, self.x)
        self.value_cache = self.storage[1].view(blocks, self.kv_heads, self.head, BLOCK_SIZE)
        self.table = torch.zeros((MAX_NUM_SEQS, MODEL_LEN // BLOCK_SIZE), dtype=torch.int32, device="cuda")
        self.scale = torch.tensor(1.0, dtype=torch.float32, device="cuda")

    def randn(self, *shape):
        return self.torch.randn(*shape, generator=self.generator, device="cuda", dtype=self.torch.float32)

    def inputs(self, batch, query_lens, context_lens):
        torch = self.torch
        tokens = sum(query_lens)
        q = self.randn(tokens, self.q_heads, self.head).bfloat16()
        k = self.randn(tokens, self.kv_heads, self.head).bfloat16()
        v = self.randn(tokens, self.kv_heads, self.head).bfloat16()
        contexts = []
        next_block = 0
        for s, context in enumerate(context_lens):
            blocks = -(-(context + query_lens[s]) // BLOCK_SIZE)
            ids = torch.arange(next_block, next_block + blocks, dtype=torch.int32, device="cuda")
            self.table[s, :blocks] = ids
            next_block += blocks
            ck = self.randn(context, self.kv_heads, self.head).bfloat16()
            cv = self.randn(context, self.kv_heads, self.head).bfloat16()
            for t in range(context):
                block, offset = int(ids[t // BLOCK_SIZE]), t % BLOCK_SIZE
                self.key_cache[block, :, :, offset, :] = ck[t].view(self.kv_heads, self.head // self.x, self.x)
                self.value_cache[block, :, :, offset] = cv[t]
            contexts.append((ck, cv))
        starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        seq_lens = torch.tensor(
            [c + q for c, q in zip(context_lens, query_lens, strict=True)], dtype=torch.int32, device="cuda"
        )
        out = torch.empty_like(q)
        return q, k, v, out, starts, seq_lens, contexts

    def call(self, fn, batch, query_lens, context_lens, prepared=None):
        q, k, v, out, starts, seq_lens, contexts = prepared or self.inputs(batch, query_lens, context_lens)
        fn(
            q,
            k,
            v,
            out,
            "auto",
            self.key_cache,
            self.value_cache,
            self.table[:batch],
            starts,
            seq_lens,
            max(query_lens),
            self.scale,
            self.scale,
        )
        return q, k, v, out, contexts

    def timed(self, fn, batch, query_lens, context_lens):
        prepared = self.inputs(batch, query_lens, context_lens)
        self.torch.cuda.synchronize()
        started = time.perf_counter()
        self.call(fn, batch, query_lens, context_lens, prepared)
        self.torch.cuda.synchronize()
        return (time.perf_counter() - started) * 1000

    def error(self, fn, batch, query_lens, context_lens):
        torch = self.torch
        q, k, v, out, contexts = self.call(fn, batch, query_lens, context_lens)
        torch.cuda.synchronize()
        worst, start = 0.0, 0
        group = self.q_heads // self.kv_heads
        for s, (query_len, (ck, cv)) in enumerate(zip(query_lens, contexts, strict=True)):
            context = context_lens[s]
            keys = torch.cat([ck, k[start : start + query_len]]).float().repeat_interleave(group, dim=1)
            values = torch.cat([cv, v[start : start + query_len]]).float().repeat_interleave(group, dim=1)
            query = q[start : start + query_len].float()
            scores = torch.einsum("qhd,khd->hqk", query, keys) / self.head**0.5
            position = torch.arange(query_len, device="cuda")[:, None] + context
            mask = torch.arange(context + query_len, device="cuda")[None, :] > position
            scores.masked_fill_(mask, float("-inf"))
            reference = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
            worst = max(worst, (out[start : start + query_len].float() - reference).abs().max().item())
            start += query_len
        return worst


if __name__ == "__main__":
    main()
