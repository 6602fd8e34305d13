"""The vLLM plugin inside each real vLLM release, in a process of its own (a fresh interpreter:
nothing imported AITER before vLLM loads its plugins): the plugin as vLLM loads it, a VllmConfig
vLLM builds, and the loader sequence the hook wraps.

A model directory holds DeepSeek-V2-Lite's config.json (no weights); the plugin activates the
cache KPRECOMPILE_CACHE_DIR names, as a server's would, with AITER on. Steps, in vLLM's order:

After the plugins load, everything runs under vLLM's ROCm platform for gfx942 (a stand-in of the
GPU's device queries), as a ROCm server's vLLM has it from the start.

1. vLLM's own `load_general_plugins()` loads the `kprecompile` entry point: the cache must be
   active and the loader hooked before any model code.
2. vLLM builds its config for MODEL_DIR; `from_vllm_config` reads it. vLLM's own selector and
   capture-size rule are compared with kprecompile's mirrors.
3. The hook sees the model built (a module whose layer reports ROCM_AITER_MLA, as vLLM's MLA
   layers do), starts the background warm, and vLLM's real `process_weights_after_loading` runs
   on a model whose quant method records, at the moment vLLM calls it (where MLA's FP8 BMM loop
   runs), whether the warm was joined and the cache active; then vLLM's own FP8 BMM entry point
   is called with the loop's tensors for m = 1, and the JIT monitor counts compiles.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from importlib import resources

import pytest
import torch
from release_support import bind_platform, load_plugins_on, skip_where_aiter_lacks
from triton import knobs
from vllm_releases import merges_per_launch

from kprecompile.inputs.models import load_model
from kprecompile.inputs.settings import cache_layout
from kprecompile.inputs.targets import TARGETS
from kprecompile.platforms.triton_driver import active_target
from kprecompile.platforms.vllm_platform import rocm_platform
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.serve.vllm.plugin import _MARK, loader_hook, model_runner_class
from kprecompile.serve.vllm.request import from_vllm_config
from kprecompile.tracing.libraries import aiter_hip_absent, release_attribute
from kprecompile.vllm.engine_config import models_inspected_here
from kprecompile.vllm.releases import release_line, serving_capture_sizes
from kprecompile.warmup.manifest_key import configuration_parts, find_manifest

pytestmark = [pytest.mark.vllm, pytest.mark.compiles, pytest.mark.slow, pytest.mark.vllm_process("plugin")]

GFX942 = TARGETS["gfx942"]
# The probed server's model length and token budget: small, since 0.20 to 0.26 compile one merge
# kernel per token count up to the budget.
PROBE_TOKENS = 512


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """The plugin loaded by vLLM in this process as a server's (its cache named by
    KPRECOMPILE_CACHE_DIR, AITER on, AITER's JIT directory left for the plugin to set), and what
    it does at each step: (the cache, the facts, what vLLM's logging printed to stdout)."""
    # The server imports vLLM's ROCM_AITER_FA with its attention backends.
    skip_where_aiter_lacks("vllm.v1.attention.backends.rocm_aiter_fa")
    model_dir = tmp_path_factory.mktemp("model")
    (model_dir / "config.json").write_text(
        (resources.files("kprecompile.inputs.presets") / "deepseek-v2-lite.json").read_text()
    )
    cache = tmp_path_factory.mktemp("cache")
    # vLLM's logging handler writes to the stdout of the moment vLLM configures it (its import).
    output = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(output):
        patch.setenv("KPRECOMPILE_CACHE_DIR", str(cache))
        patch.setenv("VLLM_ROCM_USE_AITER", "1")
        # The loop these tests drive is AITER's FP8 BMM sweep, which 0.33 and newer run only with
        # its flag on (their default is off: unset, the plugin plans no BMM, as the server runs none).
        patch.setenv("VLLM_ROCM_USE_AITER_FP8BMM", "1")
        # The 0.15 line's FP4 BMM (on by default) takes bf16 kv_b_proj weights on every GPU and
        # replaces the FP8 BMM loop there (asserting on gfx942): off, as such a server must run.
        patch.setenv("VLLM_ROCM_USE_AITER_FP4BMM", "0")
        patch.delenv("AITER_JIT_DIR", raising=False)
        document = run_probe(str(model_dir), str(cache))
    return cache, document, output.getvalue()


def test_the_plugin_acts_before_any_model_code(probes):
    cache, document, _ = probes
    assert document["hook"] and document["monitor"]
    assert document["triton_cache_dir"] == document["triton_knob"] == str(cache / "triton-v1")
    assert document["aiter_jit_dir"] == str(cache / "aiter-jit-v1")
    assert document["hooked"] == {"initialize_model": True, "process_weights_after_loading": True, "load_model": True}
    # AITER reads AITER_JIT_DIR at import: nothing imported it before the plugin ran.
    assert document["aiter_before_plugins"] == []


def test_the_plugin_names_a_layers_backend_as_vllms_registry_does(probes):
    """A layer built with each of vLLM's ROCm backend classes is planned under the registry's name
    for it (what --attention-backend takes), not the name the class gives itself: ROCM_AITER_FA's
    calls itself FLASH_ATTN, which the ROCm rules do not take."""
    _, document, _ = probes
    names = document["layer_backend_names"]
    assert {name: named for name, (named, _) in names.items()} == {name: [name] for name in names}
    assert len(names) == 6 and names["ROCM_AITER_FA"][1] == "FLASH_ATTN"


def test_vllms_resolved_config_gives_the_clis_key(probes):
    _, document, _ = probes
    digest_from_vllm, digest_from_cli = document["digests"]
    assert digest_from_vllm == digest_from_cli and document["same_key_as_cli"]
    serving = document["serving"]
    assert (serving["max_num_seqs"], serving["max_model_len"], serving["dtype"]) == (1, PROBE_TOKENS, "bfloat16")
    assert serving["cudagraph_capture_sizes"] and serving["kv_cache_dtype"] == "auto"
    other = document["other_serving"]
    assert (other["max_num_seqs"], other["max_model_len"], other["kv_cache_dtype"]) == (8, 2048, "fp8")
    assert other["cudagraph_capture_sizes"] == [] and other["block_size"] == 1


def test_the_selection_mirror_agrees_with_the_releases_own_selector(probes):
    """For builders without vLLM: kprecompile's rules give the backend vLLM's ROCm selector gives,
    for every combination of the flags that decide it, with and without a backend named."""
    _, document, _ = probes
    rows = document["selection"]
    assert len(rows) == 2**2 * 3 + 2**4 * 5
    disagreements = [row for row in rows if row["vllm"] != row["mirror"]]
    assert disagreements == []


def test_the_capture_size_rule_is_the_releases(probes):
    _, document, _ = probes
    assert [row for row in document["capture_sizes"] if row["vllm"] != row["mirror"]] == []


def test_a_cold_cache_is_warmed_beside_the_load_and_the_bmm_loop_compiles_nothing(probes, release):
    cache, document, output = probes
    load = document["load"]
    assert load["started_background"], load["events"]
    # vLLM's process_weights_after_loading ran after the warm was joined, with the cache active.
    assert load["at_process_weights_after_loading"] == {"warm_joined": True, "triton_knob": str(cache / "triton-v1")}
    [not_warm, joined, loaded] = load["events"]
    assert "is not warm on gfx942: warming" in not_warm
    # FP8 BMM (both products, m = 1), until 0.19 MLA decode's Triton reduce (batch 1), and up to
    # 0.31 vLLM's merge around the prefill with cached context (one sequence: one context chunk;
    # one kernel per token count where the count is a constexpr).
    line = release_line(release)
    merges = merges_per_launch(release, PROBE_TOKENS) if line.mla_merge == "triton" else 0
    kernels = 2 + line.aiter_mla_triton_reduce + merges
    assert joined.startswith(f"background warm: {kernels} kernels ({kernels} compiled, 0 cached) in ")
    # The load-time loop's calls (W_K and W_V products, m = 1) found their kernels: no compile.
    assert load["loop"] == "reached launch,reached launch" and load["loop_compiles"] == 0
    # After load_model every kernel of the configuration is in the process, the loop's two loaded
    # by the loop's own calls (not again); none compiled in it.
    assert loaded.startswith(f"{kernels} kernels of the configuration in the process ({kernels - 2} loaded from the")
    assert re.search(r"loaded from the cache in [0-9.]+ s, 2 already in memory\)", loaded), loaded
    assert loaded.endswith("; 0 kernels compiled in this process since it started")
    # Operators see the events through vLLM's logging, at WARNING.
    lines = [line for line in output.splitlines() if f"kprecompile: {joined}" in line]
    assert len(lines) == 1 and re.search(r"\bWARNING\b.*\bkprecompile: ", lines[0]), output[-2000:]


def test_a_warm_cache_loads_beside_the_weights_joined_before_they_are_processed(probes, release):
    """The next start warms the batch the last one recorded, and loads its kernels after load_model;
    the one after finds the configuration warm: its kernels load in a thread beside the weights,
    joined before vLLM processes them (its first Triton launch), not loaded again after load_model."""
    cache, document, _ = probes
    line = release_line(release)
    merges = merges_per_launch(release, PROBE_TOKENS) if line.mla_merge == "triton" else 0
    kernels = 2 + line.aiter_mla_triton_reduce + merges + 2  # and the two recorded BMMs of 40
    rewarm, warm = document["warm_load"]["rewarm"], document["warm_load"]["warm"]
    assert not rewarm["started_at_build"], rewarm["events"]
    _, joined, loaded = rewarm["events"]
    # The batch of 40 compiled while the first server served, into the cache: recorded, not compiled again.
    assert joined.startswith(f"background warm: {kernels} kernels (0 compiled, {kernels} cached)")
    assert loaded.startswith(f"{kernels} kernels of the configuration in the process (0 loaded from the cache in ")
    assert warm["started_at_build"] and warm["joined"], warm["events"]
    said, loaded = warm["events"]
    assert said.endswith(f"is warm in {cache} ({kernels} kernels): loading them beside the weights")
    # In this one process the earlier starts' kernels are in Triton's memory already: none is read
    # again (the first start's line is the control that loads them), and the two compiled are its
    # batch of 40.
    assert re.fullmatch(
        rf"{kernels} kernels of the configuration in the process \(0 loaded from the cache in [0-9.]+ s beside "
        rf"the weights, which waited [0-9.]+ s for them, {kernels} already in memory\); 2 kernels compiled in "
        r"this process since it started",
        loaded,
    ), loaded


def test_the_plugin_records_what_compiles_beyond_the_plan_in_the_configurations_journal(probes):
    _, document, _ = probes
    load = document["load"]
    # After load, a batch of 40 through vLLM's FP8 BMM entry point: beyond the plan's one sequence.
    assert load["serving"] == "reached launch,reached launch"
    recorded = load["recorded"]
    assert recorded["journal"] and recorded["replayable"] and recorded["manifests"] == []
    bmm = "_batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant_kernel"
    assert recorded["kernels"] == [bmm, bmm]


def run_probe(model_dir: str, cache_dir: str) -> dict:
    before_plugins = {name for name in sys.modules if name == "aiter" or name.startswith("aiter.")}
    load_plugins_on(GFX942)
    # A ROCm server's vLLM modules hold its ROCm platform from import on; from 0.2x its engine
    # configuration asks AITER's HIP modules what they support, which fail as absent here. The
    # model's class is inspected in this process (0.13 to 0.16's inspection subprocess would import
    # AITER without the builder's stand-ins; a ROCm server's has its own AITER).
    with rocm_platform(GFX942), aiter_hip_absent(), models_inspected_here():
        bind_platform()
        return probe(model_dir, cache_dir, sorted(before_plugins))


def probe(model_dir: str, cache_dir: str, before_plugins: list[str]) -> dict:
    from vllm.model_executor.model_loader import base_loader

    GPUModelRunner = model_runner_class()  # noqa: N806 (vLLM's class)
    hook = loader_hook()
    document = {
        "aiter_before_plugins": before_plugins,
        "hook": hook is not None,
        "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
        "triton_knob": knobs.cache.dir,
        "aiter_jit_dir": os.environ.get("AITER_JIT_DIR"),
        "monitor": hook is not None and hook.monitor._installed,
        "hooked": {
            "initialize_model": getattr(base_loader.initialize_model, _MARK, False),
            "process_weights_after_loading": getattr(base_loader.process_weights_after_loading, _MARK, False),
            "load_model": getattr(GPUModelRunner.load_model, _MARK, False),
        },
    }
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        max_model_len=PROBE_TOKENS,
        max_num_seqs=1,
        max_num_batched_tokens=PROBE_TOKENS,
    ).create_engine_config()
    request = from_vllm_config(config)
    document["serving"] = request.serving.resolved(request.model, serving_capture_sizes(request.serving))
    document["backend_requested"] = request.selection.attention_backend
    # The key the CLI computes for the same config.json and the settings vLLM resolved.
    cli_model = load_model(model_dir)
    layout = cache_layout(cache_dir)
    parts = {
        side: configuration_parts(
            Request(model, request.serving, select(model, "vllm", "ROCM_AITER_MLA")), GFX942, layout, remember=False
        )
        for side, model in (("vllm", request.model), ("cli", cli_model))
    }
    document["same_key_as_cli"] = parts["vllm"] == parts["cli"]
    document["digests"] = [request.model.digest, cli_model.digest]
    # Another server: an FP8 KV cache, no graphs, pages of one token.
    other = EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        max_model_len=2048,
        max_num_seqs=8,
        kv_cache_dtype="fp8",
        enforce_eager=True,
        block_size=1,
    ).create_engine_config()
    other_request = from_vllm_config(other)
    document["other_serving"] = other_request.serving.resolved(
        other_request.model, serving_capture_sizes(other_request.serving)
    )
    document["selection"] = selections(config.model_config, cli_model)
    document["capture_sizes"] = capture_sizes(model_dir)
    document["load"] = load_sequence(config, hook, base_loader)
    document["warm_load"] = warm_load_sequence(config, hook)
    document["layer_backend_names"] = layer_backend_names()
    return document


def _refresh_aiter_flags() -> None:
    """vLLM's AITER switches are class attributes read at import: read them again, as vLLM's own
    refresh_env_variables does where it exists."""
    import inspect
    import re

    import vllm.envs as envs
    from vllm._aiter_ops import rocm_aiter_ops

    for attribute, variable in re.findall(r"(_\w+) = envs\.(\w+)", inspect.getsource(rocm_aiter_ops)):
        setattr(rocm_aiter_ops, attribute, getattr(envs, variable))


GQA_FLAGS = (
    "VLLM_ROCM_USE_AITER",
    "VLLM_ROCM_USE_AITER_MHA",
    "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION",
    "VLLM_V1_USE_PREFILL_DECODE_ATTENTION",
)
MLA_FLAGS = ("VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MLA")


def selections(model_config, mla_model) -> list[dict]:
    """vLLM's own ROCm selector against kprecompile's mirror, for every combination of the flags
    that decide it, with and without a backend named, for MLA and for GQA."""
    import itertools

    import vllm
    from vllm.platforms import current_platform

    from kprecompile.inputs.models import load_model

    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError:
        from vllm.attention.backends.registry import AttentionBackendEnum
    names = {}
    for member in AttentionBackendEnum:
        try:
            names[member.get_path()] = member.name
        except Exception:
            continue
    gqa_model = load_model("llama-3.1-8b-instruct")
    rows = []
    saved = dict(os.environ)
    cases = [
        (mla_model, True, MLA_FLAGS, (None, "ROCM_AITER_MLA", "TRITON_MLA")),
        (gqa_model, False, GQA_FLAGS, (None, "ROCM_AITER_FA", "ROCM_AITER_UNIFIED_ATTN", "ROCM_ATTN", "TRITON_ATTN")),
    ]
    try:
        for model, use_mla, flags, requested_backends in cases:
            for values in itertools.product("01", repeat=len(flags)):
                environ = dict(zip(flags, values, strict=True))
                os.environ.update(environ)
                _refresh_aiter_flags()
                for requested in requested_backends:
                    head = 576 if use_mla else 128
                    selected = AttentionBackendEnum[requested] if requested else None
                    try:
                        if vllm.__version__.startswith(("0.11", "0.12")):
                            path = current_platform.get_attn_backend_cls(
                                selected, head, torch.bfloat16, "auto", 16, use_mla, False, False
                            )
                        else:
                            # In vllm.attention.selector up to 0.18.
                            selector = release_attribute(
                                "AttentionSelectorConfig", ("vllm.v1.attention.selector", "vllm.attention.selector")
                            )(
                                head_size=head,
                                dtype=torch.bfloat16,
                                kv_cache_dtype="auto",
                                block_size=16,
                                use_mla=use_mla,
                            )
                            path = current_platform.get_attn_backend_cls(selected, selector)
                        real = names.get(path, path)
                    except Exception as error:
                        real = f"refused: {type(error).__name__}"
                    try:
                        mirror = select(
                            model, "vllm", requested, environ=environ, vllm_release=vllm.__version__
                        ).attention_backend
                    except Exception as error:
                        mirror = f"refused: {type(error).__name__}"
                    rows.append(
                        {
                            "model": "mla" if use_mla else "gqa",
                            "flags": environ,
                            "requested": requested,
                            "vllm": real,
                            "mirror": mirror,
                        }
                    )
    finally:
        os.environ.clear()
        os.environ.update(saved)
        _refresh_aiter_flags()
    return rows


def capture_sizes(model_dir: str) -> list[dict]:
    """The capture sizes vLLM builds into its config against kprecompile's rule for the release."""
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    from kprecompile.vllm import releases

    rows = []
    for max_num_seqs, tokens in ((1, 2048), (3, 2048), (8, 2048), (64, 2048), (300, 400), (1024, 8192)):
        config = EngineArgs(
            model=model_dir,
            skip_tokenizer_init=True,
            max_model_len=4096,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=tokens,
        ).create_engine_config()
        rows.append(
            {
                "max_num_seqs": max_num_seqs,
                "max_num_batched_tokens": tokens,
                "vllm": list(config.compilation_config.cudagraph_capture_sizes),
                "mirror": list(releases.capture_sizes(vllm.__version__, max_num_seqs, tokens, 1)),
            }
        )
    return rows


def layer_backend_names() -> dict[str, list]:
    """What the hook names the backend of a layer built with each of vLLM's ROCm backend classes
    (the real classes from vLLM's registry), beside the name each class gives itself."""
    from kprecompile.platforms.vllm_platform import target_imports
    from kprecompile.serve.vllm.request import attention_backends
    from kprecompile.tracing.libraries import AITER_PACKAGE, aiter_hip_absent, import_library_module

    # AITER's Triton side, as a builder without ROCm has it (ROCM_AITER_FA's module imports `aiter`).
    import_library_module(AITER_PACKAGE)
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError:
        from vllm.attention.backends.registry import AttentionBackendEnum
    names = {}
    for name in (
        "ROCM_AITER_FA",
        "ROCM_AITER_UNIFIED_ATTN",
        "ROCM_ATTN",
        "TRITON_ATTN",
        "ROCM_AITER_MLA",
        "TRITON_MLA",
    ):
        # Imported as on the GPU host (ROCm's flash-attn build, AITER's HIP side: absent here).
        with target_imports(GFX942), aiter_hip_absent():
            backend = AttentionBackendEnum[name].get_class()
        model = torch.nn.Module()
        model.attn = torch.nn.Module()
        model.attn.attn_backend = backend
        names[name] = [attention_backends(model), backend.get_name()]
    return names


class _Layer(torch.nn.Module):
    """What the hook reads from vLLM's attention layers: the backend they were built with."""

    class attn_backend:  # noqa: N801 - mirrors vLLM's attribute
        @staticmethod
        def get_name() -> str:
            return "ROCM_AITER_MLA"


def load_sequence(config, hook, base_loader) -> dict:
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    seen: dict = {}

    class Recorder(QuantizeMethodBase):
        """Called by vLLM's process_weights_after_loading where MLA's FP8 BMM loop runs."""

        def create_weights(self, *args, **kwargs):
            pass

        def apply(self, *args, **kwargs):
            pass

        def process_weights_after_loading(self, layer):
            seen["warm_joined"] = hook.background is None and any(e.startswith("background warm") for e in hook.events)
            seen["triton_knob"] = knobs.cache.dir

    model = torch.nn.Module()
    model.attn = _Layer()
    model.quantized = torch.nn.Linear(2, 2)
    model.quantized.quant_method = Recorder()
    hook.target = GFX942  # no GPU here: the target a gfx942 worker would detect
    hook._model_built(model, (), {"vllm_config": config})
    started_background = hook.background is not None
    base_loader.process_weights_after_loading(model, config.model_config, torch.device("cpu"))
    compiles_before = len(hook.monitor.compiles)
    loop = fp8_bmm_loop_call(m=1)
    loop_compiles = len(hook.monitor.compiles) - compiles_before
    hook._model_loaded(None, (), {})  # after the runner's load_model: the configuration's kernels are loaded
    # Serving: a batch of 40 through the same entry point, beyond the plan's one sequence. The
    # plugin's monitor records it in the configuration's journal.
    from kprecompile.cache.journal import read_records

    serving = fp8_bmm_loop_call(m=40)
    records = read_records(hook.layout, hook.monitor.sink.key) if hook.monitor.sink else {}
    lookup = find_manifest(hook.request, GFX942, hook.layout, remember=False)
    return {
        "serving": serving,
        "recorded": {
            "journal": lookup.journal_key == (hook.monitor.sink.key if hook.monitor.sink else None),
            "kernels": sorted(record.kernel.rpartition(":")[2] for record in records.values()),
            "replayable": all(record.replayable for record in records.values()),
            "manifests": sorted({record.manifest for record in records.values()} - {lookup.key}),
        },
        "events": list(hook.events),
        "started_background": started_background,
        "at_process_weights_after_loading": seen,
        "loop": loop,
        "loop_compiles": loop_compiles,
    }


def warm_load_sequence(config, hook) -> dict:
    """The next two servers' starts on the cache the first one warmed. The first warms what the
    last one recorded while serving (its journal: the batch of 40); the second finds the
    configuration warm, so its kernels load in a thread from when the model is built, joined
    before vLLM processes the weights (before the engine's first Triton launch)."""
    starts = []
    for _ in range(2):
        hook.request, hook.background, hook.events = None, None, []
        model = torch.nn.Module()
        model.attn = _Layer()
        hook._model_built(model, (), {"vllm_config": config})
        started = hook.preloading is not None
        hook._before_weights_processed((), {})
        joined = hook.preloading is None
        hook._model_loaded(None, (), {})
        starts.append({"started_at_build": started, "joined": joined, "events": list(hook.events)})
    return {"rewarm": starts[0], "warm": starts[1]}


def fp8_bmm_loop_call(m: int) -> str:
    """vLLM's own entry point, with the tensors of its load-time loop (W_K and W_V products)."""
    from vllm._aiter_ops import rocm_aiter_ops

    from kprecompile.errors import LaunchRefusedError
    from kprecompile.tracing.libraries import import_library_module

    heads, nope, lora, v_dim = 16, 128, 512, 128  # DeepSeek-V2-Lite, tp 1
    scale = torch.empty((), dtype=torch.float32, device="meta")
    outcomes = []
    for k, n in ((nope, lora), (lora, v_dim)):
        weight = torch.empty((heads, n, k), dtype=GFX942.fp8_dtype, device="meta")
        x = torch.empty((heads, m, k), dtype=torch.bfloat16, device="meta")
        try:
            with active_target(GFX942):
                import_library_module("aiter.ops.triton")  # AITER's Triton kernels without ROCm (libraries.py)
                rocm_aiter_ops.triton_fp8_bmm(x, weight, scale, group_size=128, transpose_bm=True)
            outcomes.append("returned")
        except LaunchRefusedError:
            outcomes.append("reached launch")
    return ",".join(outcomes)
