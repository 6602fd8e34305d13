"""The attention layers vLLM's own model classes build, in each release, against kprecompile's
reading of the same config (`inputs/layers.py`): per-layer windows (Gemma-2's alternation, Gemma-3's
five-to-one, gpt-oss's alternate layers), Gemma-2's soft-cap, gpt-oss's sinks, the dtype vLLM
resolves for a float32 checkpoint, uniform windows, explicit head sizes, GQA and MLA, per rank.

And what the plan does with them: the CLI plans with vLLM's layers (the selection asked with the
layers' features, each kind planned), and a layer feature reaches the kernels (a plan without it
misses kernels the plan with it has).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import kprecompile_cli
from release_support import aiter_lacked_by
from vllm_releases import since

from kprecompile.inputs.environment import registered_values
from kprecompile.inputs.layers import config_layers
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import resolve_target
from kprecompile.shapes.aiter_fa_context import BACKEND_MODULE as AITER_FA_MODULE
from kprecompile.vllm.model_layers import vllm_layers
from kprecompile.vllm.releases import installed_release, release_line, serving_capture_sizes

MODELS = Path(__file__).resolve().parent.parent / "models"
GEMMA2, GEMMA3, GPT_OSS = (
    str(MODELS / name) for name in ("gemma-2-2b-it.json", "gemma-3-1b-it.json", "gpt-oss-20b-bf16.json")
)
SERVING = {"max_model_len": 4096, "max_num_seqs": 8}

# (model, target, tensor parallel size, KV-cache dtype): every feature on ROCm, the per-layer ones on NVIDIA too.
CASES = [
    (GEMMA2, "gfx942", 1, "auto"),
    (GEMMA2, "sm90", 2, "fp8"),
    (GEMMA3, "gfx942", 1, "auto"),
    (GPT_OSS, "gfx942", 2, "auto"),
    (GPT_OSS, "sm90", 1, "auto"),
    ("mistral-7b-v0.1", "gfx942", 1, "fp8"),
    ("qwen3-8b", "gfx942", 1, "auto"),
    ("llama-3.1-8b-instruct", "gfx942", 8, "auto"),
    ("deepseek-v2-lite", "gfx942", 2, "auto"),
]


def built(model, serving: ServingParams, target: str):
    flags = registered_values({}, "vllm", installed_release())
    answer = vllm_layers(model, serving, resolve_target(target), installed_release(), None, flags, None)
    assert answer is not None, f"vLLM {installed_release()} could not build {model.name} (see the WARNING)"
    return answer


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.vllm_process("layers")
@pytest.mark.parametrize("spec, target, tp, kv_cache_dtype", CASES)
def test_the_configs_reading_equals_the_layers_vllm_builds(release, spec, target, tp, kv_cache_dtype):
    model = load_model(spec)
    serving = ServingParams(**SERVING, tensor_parallel_size=tp, kv_cache_dtype=kv_cache_dtype)
    answer = built(model, serving, target)
    from_vllm = tuple(replace(layer, backend="") for layer in answer.layers)
    assert from_vllm == config_layers(model, serving), answer.source
    assert all(layer.backend for layer in answer.layers)
    # The serving parameters vLLM resolved for the model (its model class's rules included) are
    # the ones kprecompile's rules give, as they enter the key.
    resolved = ServingParams(
        **{**answer.serving, "cudagraph_capture_sizes": tuple(answer.serving["cudagraph_capture_sizes"])}
    )
    assert resolved.resolved(model, serving_capture_sizes(resolved, release, model)) == serving.resolved(
        model, serving_capture_sizes(serving, release, model)
    )
    # The features are really there (the reading could not be equal to an empty build).
    if spec == GEMMA2:
        assert {(layer.sliding_window, layer.logits_soft_cap, layer.dtype) for layer in from_vllm} == {
            (4096, 50.0, "bfloat16"),
            (0, 50.0, "bfloat16"),
        }
        # Negative control: one window for every layer (what kprecompile read before) differs.
        assert from_vllm != config_layers(replace(model, layer_windows=None), serving)
    if spec == GPT_OSS:
        assert {layer.sinks for layer in from_vllm} == {"bfloat16"}
        assert {layer.sliding_window for layer in from_vllm} == {128, 0}
        assert from_vllm != config_layers(replace(model, sinks=""), serving)
        # Negative control: without gpt-oss's capture ceiling, the rule gives fewer sizes than vLLM captures.
        assert serving_capture_sizes(serving, release) != tuple(answer.serving["cudagraph_capture_sizes"])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.vllm_process("layers")
def test_plan_takes_vllms_layers_and_each_feature_reaches_the_kernels(release, tmp_path):
    """Gemma-2 under TRITON_ATTN on gfx942: the plan says vLLM built the layers, shows both kinds,
    and has kernels that a plan without the soft-cap, or with one window for all layers, lacks."""
    arguments = ["--model", GEMMA2, "--engine", "vllm", "--target", "gfx942", "--max-model-len", "2048"]
    arguments += ["--max-num-seqs", "4", "--attention-backend", "TRITON_ATTN", "--json"]
    if release_line(release).backend_variable:
        arguments = [*arguments[:-3], "--json"]  # TRITON_ATTN is the default up to 0.18, named after
    result = kprecompile_cli("plan", *arguments, env={"KPRECOMPILE_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["layers"]["source"] == f"vLLM {release}'s Gemma2ForCausalLM"
    assert len(document["layers"]["kinds"]) == 2
    assert document["engine"]["selected_by"] == f"vLLM {release}'s own model, per layer"
    [family] = [family for family in document["families"] if family["family"] == "triton_attn"]
    assert family["parameters"]["logits_soft_cap"] == 50.0
    assert family["parameters"]["sliding_window"] == "full,4096"
    assert document["kernels"] > 0


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.vllm_process("layers")
@pytest.mark.parametrize("spec", [GEMMA2, GPT_OSS, "llama-3.1-8b-instruct"])
@pytest.mark.parametrize("engine", ["vllm", "vllm-aiter"])
def test_the_mirrors_selection_is_the_backend_vllm_gives_each_layer(release, spec, engine):
    """Without vLLM, the mirror selects from the config's layer features (sinks skip ROCM_ATTN in
    0.33): the backend it names is the one vLLM's own model gives every layer, on gfx942."""
    from kprecompile.selection.engines import select

    model = load_model(spec)
    serving = ServingParams(**SERVING)
    flags = registered_values({}, engine, installed_release())
    target = resolve_target("gfx942")
    answer = vllm_layers(model, serving, target, installed_release(), None, flags, None)
    if answer is None:
        # vLLM up to 0.22 cannot build gpt-oss with AITER's MHA on: their ROCM_AITER_FA takes no sinks.
        assert (spec, engine) == (GPT_OSS, "vllm-aiter") and not since(release, "0.23"), release
        return
    mirror = select(model, engine, None, environ={}, vllm_release=release, targets=[target])
    backends = {layer.backend for layer in answer.layers}
    if mirror.attention_backend == "ROCM_AITER_FA" and aiter_lacked_by(AITER_FA_MODULE):
        # vLLM here calls ROCM_AITER_FA invalid for an import the installed AITER lacks (0.31.0:
        # AITER's Gluon paged decode) and takes the next backend; a ROCm server's AITER has it.
        assert "ROCM_AITER_FA" not in backends, answer.source
        return
    assert backends == {mirror.attention_backend}, answer.source


# What the plugin does in a server's process once vLLM built the model: read its layers there.
PLUGIN_SIDE = """
import json, sys
from dataclasses import asdict
from kprecompile.inputs.settings import cache_layout
from kprecompile.inputs.targets import TARGETS
from kprecompile.serve.vllm.request import from_vllm_config
from kprecompile.vllm.model_layers import Question, build_model
from kprecompile.warmup.manifest_key import configuration_parts

question = Question(**json.loads(sys.stdin.read()))
config, model = build_model(question)
request = from_vllm_config(config, model, TARGETS[question.target])
print(json.dumps({
    "layers": [layer.as_dict() for layer in request.model.attention_layers],
    "source": request.model.layers_source,
    "selection": request.selection.key_part(),
    "selected_by": request.selection.selected_by,
    "parts": configuration_parts(request, request.targets[0], cache_layout(sys.argv[1]), remember=False),
}, default=str))
"""


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.vllm_process("layers")
@pytest.mark.parametrize("spec, target", [(GEMMA2, "gfx942"), (GPT_OSS, "sm90")])
def test_the_plugin_reads_the_layers_of_the_model_vllm_built_as_the_cli_does(release, spec, target, tmp_path):
    """In the server's process the plugin reads the built model's layers (its forward context):
    the same kinds, backend and manifest key as the CLI's plan for the same flags, which reads
    them from vLLM's build in a subprocess."""
    import subprocess
    import sys
    from dataclasses import asdict

    from kprecompile.inputs.settings import cache_layout
    from kprecompile.selection.request import resolve_requests
    from kprecompile.vllm.model_layers import Question, build_environment
    from kprecompile.warmup.manifest_key import configuration_parts

    model = load_model(spec)
    # vLLM's own defaults for what the CLI leaves unset (graphs captured, its batch limits).
    serving = ServingParams(**SERVING, dtype="bfloat16")
    layout = cache_layout(str(tmp_path / "cache"))
    [cli] = resolve_requests([spec], serving, [target], engine="vllm", layout=layout)
    # The flags as the CLI reads them for this release (its defaults where unset): the plugin's
    # process is started with them set.
    flags = registered_values({}, "vllm", release)
    question = Question.of(model, serving, resolve_target(target), release, None, flags)
    result = subprocess.run(
        [sys.executable, "-c", PLUGIN_SIDE, str(tmp_path / "cache")],
        input=json.dumps(asdict(question)),
        capture_output=True,
        text=True,
        env=build_environment(question),
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plugin = json.loads(result.stdout.strip().splitlines()[-1])
    assert plugin["layers"] == [layer.as_dict() for layer in cli.model.attention_layers]
    assert len(plugin["layers"]) == 2, plugin["layers"]  # windowed and full layers: really read
    assert plugin["source"] == cli.model.layers_source
    assert plugin["selected_by"] == cli.selection.selected_by == f"vLLM {release}'s own model, per layer"
    cli_parts = configuration_parts(cli, cli.targets[0], layout, remember=False)
    cli_parts = json.loads(json.dumps(cli_parts, default=str))
    assert plugin["parts"]["serving"] == cli_parts["serving"]
    assert plugin["parts"] == cli_parts


BUILT_HERE = """
import json, sys
from kprecompile.vllm import model_layers
question = model_layers.Question(**json.loads(sys.stdin.read()))
answer = model_layers._built_here(question)
built = "vllm.model_executor.model_loader.utils" in sys.modules
# vLLM is imported now: a second question goes to a process of its own.
print(json.dumps({"answer": answer, "built": built, "again": model_layers._built_here(question)}))
"""


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.vllm_process("layers")
@pytest.mark.parametrize("spec, target", [(GEMMA2, "gfx942"), (GPT_OSS, "sm90")])
def test_a_first_plan_builds_the_layers_in_its_own_process_as_the_subprocess_does(release, spec, target):
    """Where nothing of vLLM's is imported yet (a first plan), the layers are built in the
    command's own process, so its trace does not import vLLM a second time: the same answer as the
    process of its own gives. Control: once vLLM is imported there, nothing more is built there
    (the subprocess answers)."""
    import os
    import subprocess
    import sys
    from dataclasses import asdict

    from kprecompile.vllm import model_layers

    model = load_model(spec)
    question = model_layers.Question.of(
        model, ServingParams(**SERVING), resolve_target(target), release, None, registered_values({}, "vllm", release)
    )
    result = subprocess.run(
        [sys.executable, "-c", BUILT_HERE],
        input=json.dumps(asdict(question)),
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""},
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    here = json.loads(result.stdout.strip().splitlines()[-1])
    assert here["built"] and here["answer"] is not None, result.stderr[-3000:]
    assert here["answer"] == model_layers._ask(question, model.name)
    assert len(here["answer"]["layers"]) == 2  # windowed and full layers: really read
    assert here["again"] is None
