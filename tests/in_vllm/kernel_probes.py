"""Inside a real vLLM release (PYTHONPATH=.vllm/<version>): vLLM's own Triton kernels as the plan
traces them from the installed vLLM. Each function returns the facts one section's tests assert
(test_release_kernels.py on ROCm targets, test_release_kernels_nvidia.py on NVIDIA's):

1. Plans of the `rocm_attn` family (vLLM's ROCM_ATTN backend) on gfx942: which of vLLM's kernels
   each model and flag setting gets (vLLM's own rule sends decode to HIP or to Triton); the FP8
   range each ROCm target's platform gives the kernels.
2. Keys: for a step with a prefill and a decode step, the key the plan records equals the key
   Triton's own launch path computes for the same call of vLLM's backend.
3. Coverage: a dense random sweep of engine steps (independent of the plan's enumeration: random
   batches of prefills and decodes, contexts, KV storage classes) is a subset of the plan; a plan
   missing one storage class (where Triton's buffer ops make it a specialization) or the steps
   with a prefill is caught by the same sweep (negative controls).
4. The same for `triton_attn` (vLLM's TRITON_ATTN): kernels per model, keys of reshape-and-cache
   and of the 2D and 3D attention kernels (the launch path stops at a step's first launch: the
   step runs once with reshape-and-cache skipped, in the trace and the launch path alike), a
   random sweep, and a plan for fewer sequences as the negative control; for 0.33 also gfx950's
   plans, a plan under other capture sizes (the builder's 3D threshold), an FP8 step's key,
   sweeps with random layer sizes around 2 GiB, and a plan without the straddling layers as a
   second negative control.
5. The same for `triton_mla` (vLLM's TRITON_MLA decode, up to 0.18): kernels, the stage-1 key,
   a random sweep of decode batches and contexts, a plan without the large KV caches as the
   negative control.
6. `mla_merge` (vLLM's merge_attn_states around ROCM_AITER_MLA's prefill with cached context, up
   to 0.18): kernels, the keys of both steps (context in one chunk, in two), a random sweep of
   prefills, token counts and context chunks, a plan without the two-chunk step as the negative
   control; from 0.19, the release's own merge dispatcher on each target: no Triton kernel on
   CDNA3 and newer (the reason the plan gives), Triton's on gfx90a.
7. `aiter_fa_context` (vLLM's gather and merge around ROCM_AITER_FA's prefill with cached
   context): kernels, the gather's key against the launch path, a random sweep of request mixes
   (extends, new tokens, cached contexts, KV storage classes) through the real metadata builder,
   and a plan without the large KV caches as the negative control; from 0.19 (0.33.0) through
   the engine's attention layer and KV-cache view: the default, FP8 and shuffled layouts' kernels,
   every chunk's gather key against the launch path, random engine steps with decodes and layer
   regions around 2 GiB, and a plan of one-chunk contexts as the negative control; with
   speculative decoding, AITER's Triton unified attention for the verify steps (its key against
   the launch path, random steps, the plan without speculation as the negative control).
8. NVIDIA targets (sm90, a process of its own as an NVIDIA request is planned):
   `triton_attn` and `triton_mla` traced under vLLM's CUDA platform (at TP 1 and, for MLA, TP 2), with
   the same proofs (keys against the launch path, random sweeps, negative controls), the FP8
   range the kernels take there (e4m3fn's), the release's merge dispatcher (its compiled CUDA
   merge, no Triton kernel), and kprecompile's mirror of vLLM's CUDA backend selection against
   the release's own priority list and each backend's compute-capability rule.
9. `block_fp8_linear` (vLLM's Triton block-FP8 GEMM and group quantization of DeepSeek-R1's linear
   layers): the engine rule against the GEMM path vLLM's own linear method chooses per target and
   AITER setting; keys against the launch path; a random sweep of layers, token counts and devices
   against the plan; plans without the M multiples of 16, or without the tuned devices, as negative
   controls.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import random
import tempfile
from dataclasses import replace
from unittest import mock

from helpers import launch_path_keys
from release_support import aiter_lacked_by, environment, kv_storage_classes
from vllm_releases import since

from kprecompile.errors import TracingError
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.shapes import FAMILIES
from kprecompile.tracing.libraries import aiter_module_lacking, import_library_module
from kprecompile.tracing.trace import trace_calls
from kprecompile.vllm.releases import installed_release, release_line
from kprecompile.warmup.planning import plan

GFX942 = TARGETS["gfx942"]
SM90 = TARGETS["sm90"]
FAMILY = FAMILIES["rocm_attn"]
SERVING = {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "max_model_len": 8192}
# The installed release's line, which the families' shapes are planned for (none where these modules
# are only collected, outside a release).
LINE = release_line(installed_release()) if installed_release() else None


def planned(preset: str, backend: str = "ROCM_ATTN", target=GFX942, **serving: object):
    model = load_model(preset)
    selection = select(model, "vllm", backend, environ={}, vllm_release=installed_release(), targets=[target])
    return plan(Request(model, ServingParams(**{**SERVING, **serving}), selection, (target,)))


def kernels(result) -> list[str]:
    return sorted(job.kernel.rpartition(":")[2] for job in result.jobs)


def plans() -> dict[str, object]:
    document: dict[str, object] = {}
    for preset in ("llama-3.1-8b-instruct", "mistral-7b-v0.1"):
        document[preset] = kernels(planned(preset))
        document[f"{preset} fp8"] = kernels(planned(preset, kv_cache_dtype="fp8"))
        with environment(VLLM_ROCM_CUSTOM_PAGED_ATTN="0"):
            document[f"{preset} VLLM_ROCM_CUSTOM_PAGED_ATTN=0"] = kernels(planned(preset))
    [choice] = select(
        load_model("llama-3.1-8b-instruct"), "vllm", "ROCM_ATTN", environ={}, vllm_release=installed_release()
    ).choices
    document["choice"] = [choice.family, choice.skip_reason]
    return document


def fp8_ranges() -> dict[str, list[float]]:
    """The FP8 range vLLM's paged-decode kernel is specialized with, per target: its platform's
    FP8 type (e4m3fnuz on gfx942, e4m3fn on gfx950) read at import, as on that GPU."""
    ranges = {}
    for name in ("gfx942", "gfx950"):
        model = load_model("mistral-7b-v0.1")
        selection = select(model, "vllm", "ROCM_ATTN", environ={}, vllm_release=installed_release())
        result = plan(Request(model, ServingParams(**SERVING, kv_cache_dtype="fp8"), selection, (TARGETS[name],)))
        job = next(job for job in result.jobs if job.kernel.endswith(":kernel_paged_attention_2d"))
        data = json.loads(job.specialization)
        names = list(data["signature"])
        pairs = zip(data["constant_keys"], data["constant_vals"], strict=True)
        constants = {names[index]: value for (index,), value in pairs}
        ranges[name] = [constants["FP8_MIN"], constants["FP8_MAX"]]
    return ranges


def keys() -> list[dict[str, object]]:
    model, serving = load_model("mistral-7b-v0.1"), ServingParams(**SERVING)
    shapes = FAMILY.enumerate_shapes(model, serving, LINE)
    rows = []
    for shape in (next(s for s in shapes if s.max_query_len > 1), next(s for s in shapes if s.max_query_len == 1)):

        def call(shape=shape):
            FAMILY.launch(shape, GFX942)

        traced = trace_calls([("call", call)], GFX942, "rocm_attn", FAMILY.traced_modules)
        with tempfile.TemporaryDirectory() as cache:
            launched = launch_path_keys(cache, GFX942, call, FAMILY.traced_modules)
        rows.append(
            {
                "step": "prefill" if shape.max_query_len > 1 else "decode",
                "traced": [job.key for job in traced.jobs],
                "launched": launched,
                "kernels": [job.kernel.rpartition(":")[2] for job in traced.jobs],
            }
        )
    return rows


def sweep_shapes(model, serving: ServingParams, rng: random.Random, count: int, family=FAMILY):
    """Random engine steps within the serving limits: a mix of decodes and prefills with random
    contexts, on either KV storage class."""
    template = family.enumerate_shapes(model, serving, LINE)[0]
    model_len = serving.model_len(model)
    shapes = []
    for _ in range(count):
        num_seqs = rng.randint(1, serving.max_num_seqs)
        prefills = rng.choice([0, 0, 1, rng.randint(1, num_seqs)])
        query_lens = [1] * (num_seqs - prefills) + [rng.randint(2, 64) for _ in range(prefills)]
        tokens = sum(query_lens)
        if tokens > serving.max_num_batched_tokens:
            continue
        max_query_len = max(query_lens)
        max_seq_len = rng.randint(max_query_len, model_len)
        shapes.append(
            replace(
                template,
                num_seqs=num_seqs,
                tokens=tokens,
                max_query_len=max_query_len,
                max_seq_len=max_seq_len,
                kv_cache_storage=rng.choice(["under_2gib", "over_2gib"]),
            )
        )
    return shapes


def coverage() -> dict[str, object]:
    rng = random.Random(12)
    document = {}
    for preset, kv_cache_dtype in (
        ("mistral-7b-v0.1", "auto"),
        ("mistral-7b-v0.1", "fp8"),
        ("llama-3.1-8b-instruct", "auto"),
    ):
        model, serving = load_model(preset), ServingParams(**SERVING, kv_cache_dtype=kv_cache_dtype)
        plan_keys = {job.key for job in planned(preset, kv_cache_dtype=kv_cache_dtype).jobs}
        shapes = sweep_shapes(model, serving, rng, 60)
        swept = trace_calls(FAMILY.calls(tuple(shapes), GFX942), GFX942, "rocm_attn", FAMILY.traced_modules)
        missing = {job.key for job in swept.jobs} - plan_keys
        document[f"{preset} {kv_cache_dtype}"] = {
            "steps": swept.calls,
            "kernels": len(swept.jobs),
            "missing": len(missing),
        }
    # Negative control: a plan that leaves out the KV caches over 2 GiB misses what the sweep finds.
    # In an engine step Triton reads the size of the whole allocation (every layer's region, 0.31
    # binds no pointer range): the plan's steps on the shortest context alone stay under it.
    model, serving = load_model("mistral-7b-v0.1"), ServingParams(**SERVING)
    shapes = FAMILY.enumerate_shapes(model, serving, LINE)
    shortest = min(shape.max_seq_len for shape in shapes)
    partial = [shape for shape in shapes if shape.kv_cache_storage == "under_2gib" and shape.max_seq_len == shortest]
    partial_keys = {
        job.key
        for job in trace_calls(FAMILY.calls(tuple(partial), GFX942), GFX942, "rocm_attn", FAMILY.traced_modules).jobs
    }
    shapes = sweep_shapes(model, serving, random.Random(5), 30)
    swept = trace_calls(FAMILY.calls(tuple(shapes), GFX942), GFX942, "rocm_attn", FAMILY.traced_modules)
    document["negative control"] = {"missing": len({job.key for job in swept.jobs} - partial_keys)}
    decodes = [shape for shape in FAMILY.enumerate_shapes(model, serving, LINE) if shape.max_query_len == 1]
    decode_keys = {
        job.key
        for job in trace_calls(FAMILY.calls(tuple(decodes), GFX942), GFX942, "rocm_attn", FAMILY.traced_modules).jobs
    }
    document["decodes only"] = {"missing": len({job.key for job in swept.jobs} - decode_keys)}
    return document


TRITON = FAMILIES["triton_attn"]


def _without_reshape_and_cache(shape, target=GFX942):
    """The step with vLLM's reshape-and-cache skipped, so that the attention kernel launches first."""

    def call():
        module = import_library_module("vllm.v1.attention.backends.triton_attn")
        original = module.triton_reshape_and_cache_flash
        module.triton_reshape_and_cache_flash = lambda *args, **kwargs: None
        try:
            TRITON.launch(shape, target)
        finally:
            module.triton_reshape_and_cache_flash = original

    return call


def constants_of(job) -> dict[str, object]:
    data = json.loads(job.specialization)
    names = list(data["signature"])
    return {names[index]: value for (index,), value in zip(data["constant_keys"], data["constant_vals"], strict=True)}


def triton_attn(target=GFX942) -> dict[str, object]:
    [choice] = select(
        load_model("mistral-7b-v0.1"),
        "vllm",
        "TRITON_ATTN",
        environ={},
        vllm_release=installed_release(),
        targets=[target],
    ).choices
    document: dict[str, object] = {"choice": [choice.family, choice.skip_reason]}
    if choice.skip_reason:
        return document
    for preset, serving in (
        ("mistral-7b-v0.1", {}),
        ("llama-3.1-8b-instruct", {}),
        ("llama-3.1-8b-instruct", {"kv_cache_dtype": "fp8"}),
    ):
        label = " ".join([preset, *serving.values()])
        document[label] = sorted(kernels(planned(preset, "TRITON_ATTN", target, **serving)))
    fp8 = planned("llama-3.1-8b-instruct", "TRITON_ATTN", target, kv_cache_dtype="fp8").jobs
    reduce = constants_of(next(job for job in fp8 if job.kernel.endswith(":reduce_segments")))
    document["fp8_range"] = [reduce["FP8_MIN"], reduce["FP8_MAX"]]
    # vLLM launches reshape-and-cache with its platform's warps and stages (ROCm's or CUDA's).
    reshape = next(job for job in fp8 if job.kernel.endswith(":reshape_and_cache_kernel_flash"))
    options = json.loads(reshape.specialization)["options"]
    document["reshape_launch"] = [options["num_warps"], options["num_stages"]]
    model, serving = load_model("mistral-7b-v0.1"), ServingParams(**SERVING)
    shapes = TRITON.enumerate_shapes(model, serving, LINE)
    small_decode = next(shape for shape in shapes if shape.max_query_len == 1 and shape.num_seqs == 3)
    prefill = next(shape for shape in shapes if shape.max_query_len > 1)
    rows = []
    for step, call in (
        ("reshape_and_cache", lambda: TRITON.launch(small_decode, target)),
        ("decode", _without_reshape_and_cache(small_decode, target)),
        ("prefill", _without_reshape_and_cache(prefill, target)),
    ):
        traced = trace_calls([("call", call)], target, "triton_attn", TRITON.traced_modules)
        with tempfile.TemporaryDirectory() as cache:
            launched = launch_path_keys(cache, target, call, TRITON.traced_modules)
        rows.append(
            {
                "step": step,
                "traced": [job.key for job in traced.jobs],
                "launched": launched,
                "kernels": [job.kernel.rpartition(":")[2] for job in traced.jobs],
            }
        )
    document["keys"] = rows
    rng = random.Random(7)
    plan_keys = {job.key for job in planned("mistral-7b-v0.1", "TRITON_ATTN", target).jobs}
    swept_shapes = sweep_shapes(model, serving, rng, 80, TRITON)
    swept = trace_calls(TRITON.calls(tuple(swept_shapes), target), target, "triton_attn", TRITON.traced_modules)
    swept_keys = {job.key for job in swept.jobs}
    # Negative control: the plan for at most 8 sequences lacks the kernels for multiples of 16.
    small_keys = {job.key for job in planned("mistral-7b-v0.1", "TRITON_ATTN", target, max_num_seqs=8).jobs}
    document["coverage"] = {
        "steps": swept.calls,
        "kernels": len(swept_keys),
        "missing": len(swept_keys - plan_keys),
        "missing_from_smaller_plan": len(swept_keys - small_keys),
    }
    if release_line(installed_release()).tracing == "engine_step":
        document.update(triton_attn_0_19(target))
    return document


# Capture sizes whose nearest to 128 / 8 KV heads = 16 is 8: the builder's 3D threshold moves there.
OTHER_CAPTURE_SIZES = (1, 2, 4, 8, 24, 32)


def _random_layer_blocks(shape, rng: random.Random) -> int:
    """A layer region's blocks as free memory makes them: small, large, or a few blocks either side
    of 2 GiB (the sweep's own arithmetic: 2 x block x KV heads x head size x element bytes)."""
    page = 2 * shape.block_size * shape.kv_heads * shape.head_size * (1 if shape.kv_cache_fp8 else 2)
    boundary = 2**31 // page
    return rng.choice([rng.randint(1, 4096), boundary + rng.randint(-2, 2), rng.randint(boundary, 4 * boundary)])


def _sweep_keys_0_19(preset: str, target, seed: int, count: int, **serving: object) -> tuple[int, set[str]]:
    """Random engine steps of vLLM 0.19 and newer (independent of the plan's enumeration): random
    mixes of decodes and prefills (queries of 2 to 64 tokens, so also steps the 3D kernel takes),
    contexts, and layer regions of random size, traced through the family's real call."""
    model, params = load_model(preset), ServingParams(**{**SERVING, **serving})
    rng = random.Random(seed)
    shapes = [
        replace(shape, kv_cache_blocks=_random_layer_blocks(shape, rng))
        for shape in sweep_shapes(model, params, rng, count, TRITON)
    ]
    swept = trace_calls(TRITON.calls(tuple(shapes), target), target, "triton_attn", TRITON.traced_modules)
    return swept.calls, {job.key for job in swept.jobs}


def triton_attn_0_19(target) -> dict[str, object]:
    """vLLM 0.19 and newer: the builder's 3D threshold follows the capture sizes; an FP8 step's key
    (FP8 query) against the launch path; random sweeps (a sliding-window model, an FP8 KV cache,
    other capture sizes) against their plans; a plan without the layers whose keys cross 2 GiB and
    values do not (ROCm: vLLM bounds each view by its layer) as a negative control."""
    document: dict[str, object] = {}
    if target.is_rocm:
        for serving in ({}, {"kv_cache_dtype": "fp8"}):
            label = " ".join(["gfx950 llama-3.1-8b-instruct", *serving.values()])
            document[label] = kernels(planned("llama-3.1-8b-instruct", "TRITON_ATTN", GFX950, **serving))
    document["other_capture_sizes"] = kernels(
        planned("llama-3.1-8b-instruct", "TRITON_ATTN", target, cudagraph_capture_sizes=OTHER_CAPTURE_SIZES)
    )
    fp8_serving = ServingParams(**SERVING, kv_cache_dtype="fp8")
    fp8_decode = next(
        shape
        for shape in TRITON.enumerate_shapes(load_model("llama-3.1-8b-instruct"), fp8_serving, LINE)
        if shape.max_query_len == 1 and shape.num_seqs == 3
    )
    call = _without_reshape_and_cache(fp8_decode, target)
    traced = trace_calls([("call", call)], target, "triton_attn", TRITON.traced_modules)
    with tempfile.TemporaryDirectory() as cache:
        launched = launch_path_keys(cache, target, call, TRITON.traced_modules)
    document["fp8_keys"] = {
        "traced": [job.key for job in traced.jobs],
        "launched": launched,
        "q_is_fp8": [constants_of(job).get("Q_IS_FP8") for job in traced.jobs],
    }
    coverage = {}
    llama, other = "llama-3.1-8b-instruct", {"cudagraph_capture_sizes": OTHER_CAPTURE_SIZES}
    cases = {
        "mistral-7b-v0.1 auto": ("mistral-7b-v0.1", {}),
        "llama-3.1-8b-instruct fp8": (llama, {"kv_cache_dtype": "fp8"}),
        "llama-3.1-8b-instruct other capture sizes": (llama, other),
    }
    for seed, (label, (preset, serving)) in enumerate(cases.items()):
        plan_keys = {job.key for job in planned(preset, "TRITON_ATTN", target, **serving).jobs}
        steps, swept_keys = _sweep_keys_0_19(preset, target, seed, 80, **serving)
        coverage[label] = {
            "steps": steps,
            "kernels": len(swept_keys),
            "plan": len(plan_keys),
            "missing": len(swept_keys - plan_keys),
        }
    # Negative control: the plan's own steps without the straddling layers miss what the sweep finds.
    model, serving = load_model(llama), ServingParams(**SERVING)
    kept = tuple(
        shape for shape in TRITON.enumerate_shapes(model, serving, LINE) if shape.kv_cache_storage != "straddles_2gib"
    )
    kept_keys = {
        job.key for job in trace_calls(TRITON.calls(kept, target), target, "triton_attn", TRITON.traced_modules).jobs
    }
    _, swept_keys = _sweep_keys_0_19(llama, target, 21, 80)
    coverage["missing_without_straddling_layers"] = len(swept_keys - kept_keys)
    document["coverage_0_19"] = coverage
    return document


MLA = FAMILIES["triton_mla"]


def triton_mla(target=GFX942) -> dict[str, object]:
    model = load_model("deepseek-v2-lite")
    release = installed_release()
    choices = select(model, "vllm", "TRITON_MLA", environ={}, vllm_release=release, targets=[target]).choices
    [choice] = [choice for choice in choices if choice.family == "triton_mla"]
    document: dict[str, object] = {"choice": [choice.family, choice.skip_reason]}
    if choice.skip_reason:
        return document
    plan_jobs = planned("deepseek-v2-lite", "TRITON_MLA", target).jobs
    document["kernels"] = sorted(job.kernel.rpartition(":")[2] for job in plan_jobs if job.family == "triton_mla")
    serving = ServingParams(**SERVING)
    shapes = MLA.enumerate_shapes(model, serving, LINE)

    def call():
        MLA.launch(shapes[1], target)

    traced = trace_calls([("call", call)], target, "triton_mla", MLA.traced_modules)
    with tempfile.TemporaryDirectory() as cache:
        launched = launch_path_keys(cache, target, call, MLA.traced_modules)
    document["keys"] = {
        "traced": [job.key for job in traced.jobs],
        "launched": launched,
        "kernels": [job.kernel.rpartition(":")[2] for job in traced.jobs],
    }
    rng = random.Random(3)
    swept_shapes = [
        replace(
            shapes[0],
            batch=rng.randint(1, serving.max_num_seqs),
            max_seq_len=rng.randint(1, serving.model_len(model)),
            kv_cache_storage=rng.choice(["under_2gib", "over_2gib"]),
        )
        for _ in range(20)
    ]
    swept = trace_calls(MLA.calls(tuple(swept_shapes), target), target, "triton_mla", MLA.traced_modules)
    swept_keys = {job.key for job in swept.jobs}
    plan_keys = {job.key for job in plan_jobs}
    # Negative control: on ROCm a plan without the KV caches over 2 GiB (a pointer specialization
    # where Triton emits buffer ops, which NVIDIA's backend does not make); elsewhere one without
    # the decode steps.
    if target.is_rocm and kv_storage_classes() == 2:
        small = [shape for shape in shapes if shape.kv_cache_storage == "under_2gib"]
    else:
        small = [shape for shape in shapes if shape.context_chunks]
    small_keys = {
        job.key for job in trace_calls(MLA.calls(tuple(small), target), target, "triton_mla", MLA.traced_modules).jobs
    }
    document["coverage"] = {
        "steps": swept.calls,
        "kernels": len(swept_keys),
        "missing": len(swept_keys - plan_keys),
        "missing_from_smaller_plan": len(swept_keys - small_keys),
    }
    return document


def cuda_merge() -> int:
    """Triton kernels the release's own `merge_attn_states` dispatcher launches on sm90 for an MLA
    prefill's merge (bfloat16, V head size 128): none, it takes vLLM's compiled CUDA merge."""
    import importlib.util

    def exists(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its parent package is not in this release
            return False

    module = next(
        name
        for name in ("vllm.v1.attention.ops.merge_attn_states", "vllm.attention.ops.merge_attn_states")
        if exists(name)
    )
    return merge_kernels(module, SM90)


def merge_kernels(module: str, target) -> int:
    """Triton kernels `module`'s `merge_attn_states` launches on `target` for an MLA prefill's
    merge (bfloat16, V head size 128); its compiled operator is prebuilt (skipped)."""
    import torch

    from kprecompile.shapes._vllm_backend import prebuilt_ops_skipped

    def call():
        meta = torch.device("meta")
        out = torch.empty((64, 16, 128), dtype=torch.bfloat16, device=meta)
        lse = torch.empty((16, 64), dtype=torch.float32, device=meta)
        with prebuilt_ops_skipped(("merge_attn_states",)):
            import_library_module(module).merge_attn_states(out, out, lse, torch.empty_like(out), lse)

    return len(trace_calls([("merge", call)], target, "merge", (module,)).jobs)


def cuda_selection() -> list[dict[str, object]]:
    """For each NVIDIA target and attention kind: the backend kprecompile's mirror selects, and
    the first of the release's own priority list (`_get_backend_priorities`) whose class's
    compute-capability rule takes the target (each class as vLLM imports it on that target; the
    classes that cannot be imported without the GPU are named, and skipped)."""
    import vllm.platforms as platforms

    from kprecompile.platforms.triton_driver import active_target
    from kprecompile.platforms.vllm_platform import target_imports
    from kprecompile.selection.engines import select as select_backend

    rows = []
    for name in ("sm80", "sm89", "sm90", "sm100"):
        target = TARGETS[name]
        for preset in ("llama-3.1-8b-instruct", "deepseek-v2-lite"):
            model = load_model(preset)
            mirror = select_backend(
                model, "vllm", None, environ={}, vllm_release=installed_release(), targets=[target]
            ).attention_backend
            with active_target(target), target_imports(target):
                cuda = import_library_module("vllm.platforms.cuda")
                capability = platforms.current_platform.get_device_capability()
                first, refused = None, {}
                for backend in cuda._get_backend_priorities(model.attention == "mla", capability):
                    try:
                        takes = backend.get_class().supports_compute_capability(capability)
                    except Exception as error:  # modules that need the GPU or its libraries at import
                        refused[backend.name] = f"{type(error).__name__}: {error}"
                        continue
                    if takes:
                        first = backend.name
                        break
            rows.append({"target": name, "model": preset, "mirror": mirror, "vllm": first, "import_errors": refused})
    return rows


MERGE = FAMILIES["mla_merge"]
# The MLA prefill step the family runs (the package's name of the same spelling is not it).
_vllm_mla_module = importlib.import_module("kprecompile.shapes._vllm_mla")
_vllm_backend_module = importlib.import_module("kprecompile.shapes._vllm_backend")


def mla_merge() -> dict[str, object]:
    model = load_model("deepseek-v2-lite")
    choices = select(model, "vllm-aiter", "ROCM_AITER_MLA", environ={}, vllm_release=installed_release()).choices
    [choice] = [choice for choice in choices if choice.family == "mla_merge"]
    document: dict[str, object] = {"choice": [choice.family, choice.skip_reason]}
    if choice.skip_reason:
        document["dispatch"] = merge_dispatch()
        return document
    result = planned("deepseek-v2-lite", "ROCM_AITER_MLA")
    [row] = [row for row in result.families if row.family == "mla_merge"]
    if row.error:
        return {**document, "error": row.error}
    plan_jobs = result.jobs
    document["kernels"] = sorted(job.kernel.rpartition(":")[2] for job in plan_jobs if job.family == "mla_merge")
    serving = ServingParams(**SERVING)
    shapes = MERGE.enumerate_shapes(model, serving, LINE)
    document["keys"] = []
    for shape in shapes:
        call = functools.partial(MERGE.launch, shape, GFX942)
        traced = trace_calls([("call", call)], GFX942, "mla_merge", MERGE.traced_modules)
        launched = []
        if traced.jobs:  # nothing where the engine's workspace never makes that many chunks
            with tempfile.TemporaryDirectory() as cache:
                launched = launch_path_keys(cache, GFX942, call, MERGE.traced_modules)
        document["keys"].append({"traced": [job.key for job in traced.jobs], "launched": launched})
    rng = random.Random(5)
    swept_shapes = []
    for _ in range(12):
        prefills = rng.randint(1, serving.max_num_seqs)
        swept_shapes.append(
            replace(
                shapes[0],
                prefills=prefills,
                context_chunks=rng.randint(1, 4),
                tokens=rng.randint(prefills, serving.max_num_batched_tokens),
            )
        )
    swept_keys = _merge_keys(swept_shapes, as_served=True)
    document["coverage"] = {
        "steps": len(swept_shapes),
        "kernels": len(swept_keys),
        "missing": len(swept_keys - {job.key for job in plan_jobs}),
        # Negative controls: the one-chunk step alone, and the plan's steps as a server launches
        # them (without the merges for the token counts and classes it can meet).
        "missing_from_smaller_plan": len(swept_keys - _merge_keys(shapes[:1])),
        "missing_from_plan_as_served": len(swept_keys - _merge_keys(shapes, as_served=True)),
        # And the plan without vLLM 0.26 and 0.27's mask of empty context chunks.
        "missing_from_plan_without_masks": len(
            swept_keys - {job.key for job in plan_jobs if job.kernel.rpartition(":")[2] != "mask_empty_context_kernel"}
        ),
    }
    return document


def _merge_keys(shapes, as_served: bool = False) -> set[str]:
    """The keys of these MLA prefill steps: as a plan traces them, or `as_served`."""
    return _family_keys(MERGE, _vllm_mla_module, shapes, GFX942, as_served)


def _family_keys(family, module, shapes, target, as_served: bool) -> set[str]:
    """The keys of `family`'s steps: as a plan traces them, or `as_served`, as a server launches
    them (each merge for its own token counts only, not for every count or class as a plan does:
    `merges_for_every_token_count` off in `module`, the family's step; and 0.26 and 0.27's mask
    of empty context chunks for its own counts and row, `empty_context_masks_for_every_class`)."""
    with contextlib.ExitStack() as stack:
        if as_served:
            stack.enter_context(
                mock.patch.object(module, "merges_for_every_token_count", lambda budget: contextlib.nullcontext())
            )
            if hasattr(module, "empty_context_masks_for_every_class"):
                stack.enter_context(
                    mock.patch.object(
                        module, "empty_context_masks_for_every_class", lambda serving: contextlib.nullcontext()
                    )
                )
        traced = trace_calls(family.calls(tuple(shapes), target), target, family.name, family.traced_modules)
        return {job.key for job in traced.jobs}


def merge_dispatch() -> dict[str, int]:
    """Triton kernels the release's own `merge_attn_states` dispatcher launches for an MLA
    prefill's merge (bfloat16, V head size 128), per ROCm target; its compiled operator is
    prebuilt (skipped)."""
    module = "vllm.v1.attention.ops.merge_attn_states"
    return {name: merge_kernels(module, TARGETS[name]) for name in ("gfx90a", "gfx942", "gfx950")}


CONTEXT = FAMILIES["aiter_fa_context"]
# The family's module (the package's name of the same spelling is its family function).
aiter_fa_context_module = importlib.import_module("kprecompile.shapes.aiter_fa_context")


def aiter_fa_context(seed: int = 11) -> dict[str, object]:
    model = load_model("llama-3.1-8b-instruct")
    choices = select(model, "vllm-aiter", "ROCM_AITER_FA", environ={}, vllm_release=installed_release()).choices
    [choice] = [choice for choice in choices if choice.family == "aiter_fa_context"]
    document: dict[str, object] = {"choice": [choice.family, choice.skip_reason]}
    if choice.skip_reason:
        return document
    if release_line(installed_release()).tracing == "engine_step":
        try:
            return {**document, **aiter_fa_context_0_19(model, seed)}
        except TracingError as error:
            # The release's backend imports an AITER module the installed AITER lacks (0.31's
            # Gluon paged decode): what the plan says of it instead.
            lacking = aiter_module_lacking(error.__cause__)
            if lacking is None:
                raise
            result = planned("llama-3.1-8b-instruct", "ROCM_AITER_FA")
            [row] = [row for row in result.families if row.family == "aiter_fa_context"]
            return {**document, "aiter_lacks": lacking, "plan_error": row.error, "kernels_planned": len(result.jobs)}
    plan_jobs = planned("llama-3.1-8b-instruct", "ROCM_AITER_FA").jobs
    document["kernels"] = sorted(job.kernel.rpartition(":")[2] for job in plan_jobs if job.family == "aiter_fa_context")
    serving = ServingParams(**SERVING)
    shapes = CONTEXT.enumerate_shapes(model, serving, LINE)
    call = functools.partial(CONTEXT.launch, shapes[2], GFX942)
    traced = trace_calls([("call", call)], GFX942, "aiter_fa_context", CONTEXT.traced_modules)
    with tempfile.TemporaryDirectory() as cache:
        launched = launch_path_keys(cache, GFX942, call, CONTEXT.traced_modules)
    document["keys"] = {"traced": [job.key for job in traced.jobs], "launched": launched}
    rng = random.Random(seed)
    model_len = serving.model_len(model)
    swept_shapes = []
    for _ in range(16):
        extends = rng.choice([1, 2, 3, rng.randint(1, serving.max_num_seqs)])
        queries = tuple(rng.randint(2, 64) for _ in range(extends))
        contexts = tuple(rng.choice([1, rng.randint(1, 64), rng.randint(1, model_len - query)]) for query in queries)
        swept_shapes.append(
            replace(
                shapes[0],
                query_lens=queries,
                context_lens=contexts,
                kv_cache_storage=rng.choice(["under_2gib", "over_2gib"]),
            )
        )
    swept_keys = _context_keys(swept_shapes, as_served=True)
    # Negative control: a plan without the KV caches over 2 GiB where that class specializes the
    # kernels (Triton's buffer ops), else one of the plan's steps alone.
    if kv_storage_classes() == 2:
        small = tuple(shape for shape in shapes if shape.kv_cache_storage == "under_2gib")
    else:
        small = shapes[:1]
    document["coverage"] = {
        "steps": len(swept_shapes),
        "kernels": len(swept_keys),
        "missing": len(swept_keys - {job.key for job in plan_jobs}),
        "missing_from_smaller_plan": len(swept_keys - _context_keys(small)),
    }
    return document


def merge_widening(budget: int = 48) -> dict[str, int]:
    """A plan at a small step budget whose merges are widened to every token count (or class)
    once per trace, as plans do, against the same steps each widened on its own (what a plan did
    before: no launch found captured), and as served (not widened). ROCM_AITER_FA's plan for
    Llama where the installed AITER has what the release's backend imports, else ROCM_AITER_MLA's
    prefill for DeepSeek-V2-Lite."""
    if aiter_lacked_by(aiter_fa_context_module.BACKEND_MODULE) is None:
        family, module, preset = CONTEXT, aiter_fa_context_module, "llama-3.1-8b-instruct"
    else:
        family, module, preset = MERGE, _vllm_mla_module, "deepseek-v2-lite"
    serving = ServingParams(**{**SERVING, "max_num_batched_tokens": budget})
    shapes = family.enumerate_shapes(load_model(preset), serving, LINE)
    once = _family_keys(family, module, shapes, GFX942, as_served=False)
    with mock.patch.object(_vllm_backend_module, "active_capture", lambda: None):
        per_step = _family_keys(family, module, shapes, GFX942, as_served=False)
    served = _family_keys(family, module, shapes, GFX942, as_served=True)
    return {
        "family": family.name,
        "steps": len(shapes),
        "kernels": len(once),
        "missing_from_once": len(per_step - once),
        "missing_from_per_step": len(once - per_step),
        "widened": len(once - served),
    }


def _context_keys(shapes, target=GFX942, as_served: bool = False) -> set[str]:
    """The keys of these ROCM_AITER_FA steps: as a plan traces them, or `as_served`."""
    return _family_keys(CONTEXT, aiter_fa_context_module, shapes, target, as_served)


def _random_engine_steps(shapes, model_len: int, rng: random.Random, count: int) -> list:
    """Engine steps as vLLM 0.19's runner orders them, independent of the plan's enumeration:
    random decodes, then random extends (new tokens; cached contexts short, random, or near the
    model length, so that several extends fill several context chunks), random layer regions."""
    steps = []
    for _ in range(count):
        decodes = rng.choice([0, 0, 1, 2, 3, rng.randint(0, 12)])
        extends = rng.choice([1, 2, 3, rng.randint(1, 16), rng.randint(5, 24)])
        queries = tuple(rng.randint(2, 30) for _ in range(extends))
        near_end = rng.random() < 0.5
        contexts = tuple(
            rng.choice(
                [1, rng.randint(1, 64), rng.randint(1, model_len - query)]
                + [model_len - query - rng.randint(0, 40)] * (3 if near_end else 0)
            )
            for query in queries
        )
        shape = rng.choice(shapes)
        steps.append(
            replace(
                shape,
                query_lens=(1,) * decodes + queries,
                context_lens=tuple(rng.randint(1, model_len - 1) for _ in range(decodes)) + contexts,
                kv_cache_storage=rng.choice(["under_2gib", "over_2gib"]),
                kv_cache_blocks=rng.choice([0, _random_layer_blocks(shape, rng)]),
            )
        )
    return steps


def _every_gather_launched(step) -> None:
    """The step, going on past each gather and merge the launch path refuses (it stops at a step's
    first launch), so that every chunk's gather reaches Triton's launch path; a refusal is raised
    at the end (tracing launches nothing and raises nothing)."""
    from kprecompile.errors import LaunchRefusedError

    module = import_library_module(CONTEXT.traced_modules[0])
    saved = {name: getattr(module, name) for name in ("cp_mha_gather_cache", "merge_attn_states")}
    refused = []

    def going_on(function):
        def call(*args, **kwargs):
            try:
                function(*args, **kwargs)
            except LaunchRefusedError as error:
                refused.append(error)

        return call

    for name, function in saved.items():
        setattr(module, name, going_on(function))
    try:
        CONTEXT.launch(step, GFX942)
    finally:
        for name, function in saved.items():
            setattr(module, name, function)
    if refused:
        raise refused[-1]


def aiter_fa_context_0_19(model, seed: int) -> dict[str, object]:
    """ROCM_AITER_FA from vLLM 0.19 (0.33.0): the kernels of the plan in the default layout and in
    the shuffled one (VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1), and with an FP8 KV cache; the keys of a
    three-chunk step with decodes against the launch path; random engine steps (decodes, extends,
    long and short contexts, layer regions around 2 GiB) against the plan, and against a plan
    whose contexts fit one chunk (negative control); speculative decoding's verify steps."""
    serving = ServingParams(**SERVING)
    document: dict[str, object] = {"kernels": {}}
    shuffled = {"VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"}
    labels = [("default", {}, "auto"), ("fp8", {}, "fp8"), ("shuffle", shuffled, "auto")]
    if since(installed_release(), "0.15") and not since(installed_release(), "0.16"):
        # 0.15 takes the shuffled layout only with AITER's master switch on (its
        # `is_shuffle_kv_cache_enabled`); the probe's engine leaves it off.
        labels.append(("shuffle_aiter", {**shuffled, "VLLM_ROCM_USE_AITER": "1"}, "auto"))
    for label, variables, kv_cache in labels:
        with environment(**variables):
            jobs = planned("llama-3.1-8b-instruct", "ROCM_AITER_FA", kv_cache_dtype=kv_cache).jobs
            document["kernels"][label] = sorted(
                job.kernel.rpartition(":")[2] for job in jobs if job.family == "aiter_fa_context"
            )
            if label == "default":
                plan_keys = {job.key for job in jobs}
    shapes = CONTEXT.enumerate_shapes(model, serving, LINE)
    model_len = serving.model_len(model)
    # Two decodes, then ten extends: one with three chunks of cached context (a chunk holds
    # 32768 / extends tokens), the others short.
    chunk = 32 * 1024 // 10
    step = replace(shapes[0], query_lens=(1, 1, 5) + (2,) * 9, context_lens=(100, 7, 2 * chunk + 9) + (3,) * 9)
    call = functools.partial(_every_gather_launched, step)
    traced = trace_calls([("call", call)], GFX942, "aiter_fa_context", CONTEXT.traced_modules)
    with tempfile.TemporaryDirectory() as cache:
        launched = launch_path_keys(cache, GFX942, call, CONTEXT.traced_modules)
    document["keys"] = {
        "traced": [job.key for job in traced.jobs],
        "traced_kernels": [job.kernel.rpartition(":")[2] for job in traced.jobs],
        "launched": launched,
    }
    swept = _random_engine_steps(shapes, model_len, random.Random(seed), 60)
    swept_keys = _context_keys(swept, as_served=True)
    # The negative control: a plan whose extends' cached context always fits one chunk.
    one_chunk = [shape for shape in shapes if max(shape.context_lens) <= 32 * 1024 // len(shape.context_lens)]
    document["coverage"] = {
        "steps": len(swept),
        "kernels": len(swept_keys),
        "missing": len(swept_keys - plan_keys),
        "missing_from_smaller_plan": len(swept_keys - _context_keys(one_chunk)),
    }
    document["speculative"] = _aiter_fa_speculative(model, seed)
    return document


def _aiter_fa_speculative(model, seed: int) -> dict[str, object]:
    """With two draft tokens: the plan's kernels (AITER's Triton unified attention for the verify
    steps' decodes beside the gathers), a decode step's first key against the launch path, random
    steps of decodes of 1 to 3 tokens (contexts short, around the 2D bound, long; random
    allocations) with random extends against the plan, and against the plan without speculative
    decoding and one whose verify steps take one batch size per integer class (negative controls)."""
    serving = ServingParams(**SERVING, num_speculative_tokens=2)
    shapes = CONTEXT.enumerate_shapes(model, serving, LINE)
    planned_jobs = trace_calls(CONTEXT.calls(shapes, GFX942), GFX942, "aiter_fa_context", CONTEXT.traced_modules).jobs
    plan_keys = {job.key for job in planned_jobs}
    kernels = sorted(job.kernel.rpartition(":")[2] for job in planned_jobs)
    step = replace(shapes[0], query_lens=(3, 2, 3), context_lens=(4000, 700, 9))
    call = functools.partial(CONTEXT.launch, step, GFX942)
    traced = trace_calls([("call", call)], GFX942, "aiter_fa_context", CONTEXT.traced_modules)
    with tempfile.TemporaryDirectory() as cache:
        launched = launch_path_keys(cache, GFX942, call, CONTEXT.traced_modules)
    rng = random.Random(seed)
    model_len = serving.model_len(model)
    swept = []
    for _ in range(80):
        decodes = rng.randint(1, serving.max_num_seqs)
        queries = tuple(rng.choice([1, 2, 3]) for _ in range(decodes))
        contexts = tuple(
            rng.choice([rng.randint(1, 600), rng.randint(1, 3000), rng.randint(1, model_len - 3)])
            for _ in range(decodes)
        )
        extends = rng.choice([0, 0, 1, rng.randint(2, 8)])
        queries += tuple(rng.randint(4, 20) for _ in range(extends))
        contexts += tuple(rng.choice([1, rng.randint(1, 64), model_len - 30]) for _ in range(extends))
        swept.append(
            replace(
                shapes[0],
                query_lens=queries,
                context_lens=contexts,
                kv_cache_storage=rng.choice(["under_2gib", "over_2gib"]),
                kv_cache_blocks=rng.choice([0, 0, rng.randint(1, 9000)]),
            )
        )
    swept_keys = _context_keys(swept, as_served=True)
    without = _context_keys(CONTEXT.enumerate_shapes(model, ServingParams(**SERVING), LINE))
    # The negative control: verify steps at one batch size per integer class (1, 2, 16), not every one.
    per_class = [
        shape
        for shape in shapes
        if max(shape.query_lens) > serving.decode_query_len or len(shape.query_lens) in (1, 2, 16)
    ]
    return {
        "kernels": kernels,
        "keys": {"traced": [job.key for job in traced.jobs], "launched": launched},
        "coverage": {
            "steps": len(swept),
            "kernels": len(swept_keys),
            "missing": len(swept_keys - plan_keys),
            "missing_without_speculation": len(swept_keys - without),
            "missing_from_class_representatives": len(swept_keys - _context_keys(per_class)),
        },
    }


LINEAR = FAMILIES["block_fp8_linear"]
GFX950 = TARGETS["gfx950"]
LINEAR_SERVING = {**SERVING, "tensor_parallel_size": 8}


def _linear_shapes(**serving: object):
    return LINEAR.enumerate_shapes(load_model("deepseek-r1"), ServingParams(**{**LINEAR_SERVING, **serving}), LINE)


def _linear_keys(shapes, target) -> set[str]:
    return {
        job.key
        for job in trace_calls(
            LINEAR.calls(tuple(shapes), target), target, "block_fp8_linear", LINEAR.traced_modules
        ).jobs
    }


def block_fp8_linear(seed: int = 12) -> dict[str, object]:
    """DeepSeek-R1 (block FP8) at TP 8: the engine rule against vLLM's own choice of GEMM path per
    target and AITER setting; the keys of a quantization (eager) and of GEMMs (graph mode, tuned and
    default configs) against Triton's launch path; a random sweep of layers, token counts and
    devices against the plan, and plans missing one M class or the tuned devices (negative controls)."""
    from kprecompile.shapes.block_fp8_linear import DEVICE_NAMES, built_layer, chosen_path

    model = load_model("deepseek-r1")
    document: dict[str, object] = {"choices": {}, "vllm_chose": {}}
    for engine, aiter in (("vllm", "0"), ("vllm-aiter", "1")):
        [choice] = [
            c
            for c in select(model, engine, None, environ={}, vllm_release=installed_release()).choices
            if c.family == "block_fp8_linear"
        ]
        for target in (GFX942, GFX950):
            document["choices"][f"{target.name} aiter={aiter}"] = choice.skip_reason or choice.skip_reason_on(
                target.name
            )
            shape = next(s for s in _linear_shapes() if s.arch == target.name)
            chose = []

            def build(shape=shape, target=target, chose=chose):
                with built_layer(shape, target) as (method, _):
                    chose.append(chosen_path(method))

            with environment(VLLM_ROCM_USE_AITER=aiter):
                trace_calls([("build", build)], target, "block_fp8_linear", LINEAR.traced_modules)
            document["vllm_chose"][f"{target.name} aiter={aiter}"] = chose[0]
    if document["choices"]["gfx950 aiter=0"] is not None:
        return document
    eager = [s for s in _linear_shapes(enforce_eager=True) if s.arch == "gfx950" and s.m > 1 and s.m % 16]
    graph = _linear_shapes()
    tuned = next(s for s in graph if s.device_name == "AMD_Instinct_MI300X" and s.layer == "q_b_proj" and s.m > 1)
    rng = random.Random(seed)
    coverage = {}
    for target in (GFX942, GFX950):
        shapes = [s for s in graph if s.arch == target.name]
        plan_keys = _linear_keys(shapes, target)
        swept = []
        for _ in range(40):
            m = rng.choice([1, rng.randint(1, 64), rng.randint(1, LINEAR_SERVING["max_num_batched_tokens"])])
            swept.append(replace(rng.choice(shapes), m=m, device_name=rng.choice(DEVICE_NAMES[target.name])))
        swept_keys = _linear_keys(swept, target)
        without_div16 = _linear_keys([s for s in shapes if s.m % 16], target)
        untuned_only = _linear_keys(
            [
                s
                for s in shapes
                if s.device_name not in ("AMD_Instinct_MI300X", "AMD_Instinct_MI325X", "AMD_Instinct_MI325_OAM")
            ],
            target,
        )
        coverage[target.name] = {
            "steps": len(swept),
            "kernels": len(swept_keys),
            "plan": len(plan_keys),
            "missing": len(swept_keys - plan_keys),
            "missing_without_div16": len(swept_keys - without_div16),
            "missing_untuned_only": len(swept_keys - untuned_only),
        }
    document["coverage"] = coverage
    # Traced first, then compiled for real: a kernel compiled in this process is launched, not traced.
    calls = {
        "eager quantization": (eager[0], GFX950),
        "gemm default config": (next(s for s in graph if s.arch == "gfx950" and s.m == 1), GFX950),
        "gemm MI300X table": (tuned, GFX942),
    }
    rows = {}
    for label, (shape, target) in calls.items():
        traced = trace_calls(
            [("call", functools.partial(LINEAR.launch, shape, target))],
            target,
            "block_fp8_linear",
            LINEAR.traced_modules,
        )
        rows[label] = {
            "traced": [job.key for job in traced.jobs],
            "kernels": [job.kernel.rpartition(":")[2] for job in traced.jobs],
        }
    for label, (shape, target) in calls.items():
        with tempfile.TemporaryDirectory() as cache:
            rows[label]["launched"] = launch_path_keys(
                cache, target, functools.partial(LINEAR.launch, shape, target), LINEAR.traced_modules
            )
    document["keys"] = rows
    return document


def untraceable() -> dict[str, object]:
    """A release whose ROCM_ATTN backend class moved: planning that family is a failed
    row with its error instead of raising, and the other family of the same plan (AITER's
    pa_prefill, put in one selection with it here) is traced as before."""
    from kprecompile.selection.engines import FamilyChoice, Selection
    from kprecompile.shapes import rocm_attn
    from kprecompile.shapes._vllm_backend import launch_step

    moved = replace(rocm_attn.BACKEND, backend_class="NoSuchBackend")
    saved = FAMILIES["rocm_attn"]
    FAMILIES["rocm_attn"] = replace(saved, launch=functools.partial(launch_step, moved))
    model = load_model("mistral-7b-v0.1")
    choices = (FamilyChoice("rocm_attn", "ROCM_ATTN"), FamilyChoice("pa_prefill", "aiter"))
    selection = Selection("vllm", "ROCM_ATTN", {}, choices, installed_release())
    try:
        result = plan(Request(model, ServingParams(**SERVING), selection, (GFX942,)))
    finally:
        FAMILIES["rocm_attn"] = saved
    rows = {family.family: family for family in result.families}
    return {
        "error": rows["rocm_attn"].error,
        "skip_reason": rows["rocm_attn"].skip_reason,
        "failed": [row.family for row in result.failed],
        "planned": [name for name, row in rows.items() if row.skip_reason is None and row.error is None],
        "kernels": len(result.jobs),
    }


# What the ROCm process leaves for the NVIDIA one (shared directory): TRITON_ATTN's traced keys.
ROCM_TRITON_ATTN_KEYS = "triton_attn_rocm_keys.json"


def assert_triton_attn_up_to_0_18(document: dict, expected: dict[str, int]) -> None:
    """A TRITON_ATTN section up to 0.18 on one target: the kernels each model's plan holds
    (`expected`), and the keys of reshape-and-cache, a 3D decode and a 2D prefill step, each
    the launch path's."""
    from collections import Counter

    for case in ("mistral-7b-v0.1", "llama-3.1-8b-instruct", "llama-3.1-8b-instruct fp8"):
        assert Counter(document[case]) == expected, case
    reshape, decode, prefill = document["keys"]
    assert reshape["kernels"] == ["reshape_and_cache_kernel_flash", "kernel_unified_attention_3d", "reduce_segments"]
    assert decode["kernels"] == ["kernel_unified_attention_3d", "reduce_segments"]
    assert prefill["kernels"] == ["kernel_unified_attention_2d"]
    for row in (reshape, decode, prefill):
        assert row["traced"][:1] == row["launched"] and len(row["launched"]) == 1, row["step"]


def assert_triton_attn_from_0_19(document: dict) -> None:
    """A TRITON_ATTN section from 0.19 on one target: the keys of reshape-and-cache, a 3D decode,
    a 2D prefill and an FP8 step, each the launch path's (an FP8 KV cache takes an FP8 query); the
    random sweeps covered by their plans and not by a plan for 8 sequences."""
    reshape, decode, prefill = document["keys"]
    assert reshape["kernels"] == ["reshape_and_cache_kernel_flash", "kernel_unified_attention", "reduce_segments"]
    assert decode["kernels"] == ["kernel_unified_attention", "reduce_segments"]
    assert prefill["kernels"] == ["kernel_unified_attention"]
    for row in (reshape, decode, prefill, document["fp8_keys"]):
        assert row["traced"][:1] == row["launched"] and len(row["launched"]) == 1, row
    assert document["fp8_keys"]["q_is_fp8"] == [True, None]
    assert document["coverage"]["steps"] >= 60 and document["coverage"]["missing"] == 0
    assert document["coverage"]["missing_from_smaller_plan"] > 0
    for label, row in document["coverage_0_19"].items():
        if label != "missing_without_straddling_layers":
            assert row["steps"] >= 60 and row["kernels"] >= 7 and row["missing"] == 0, label
