"""A `vllm serve` line pasted into kprecompile, on a builder without vLLM: a positional model, every
flag vLLM takes accepted (the table of the supported releases' flags), the ones that change kernels
read as vLLM reads them, the ones kprecompile cannot follow refused, typos refused with the nearest
names. (Inside each tested release, its own parser reads the line: tests/in_vllm/test_release_serve_line.py.)"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from helpers import kprecompile_cli

from kprecompile.errors import InputError
from kprecompile.inputs.serve_line import human_readable_int

ROOT = Path(__file__).parent.parent
PLAN = ("--target", "gfx942", "--engine", "aiter", "--family", "fp8_bmm", "--json")


def plan(*argv: str) -> dict:
    """`plan --json`, its timings left out."""
    result = kprecompile_cli("plan", *argv, *PLAN)
    assert result.returncode == 0, result.stderr
    return untimed(json.loads(result.stdout))


def untimed(document: dict) -> dict:
    return {key: value for key, value in document.items() if not key.endswith("_seconds")}


def refused(*argv: str) -> str:
    result = kprecompile_cli("plan", *argv, *PLAN)
    assert result.returncode == 2 and not result.stdout, (result.returncode, result.stdout)
    [line] = result.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize(
    "text, tokens",
    [("8192", 8192), ("32k", 32_000), ("32K", 32_768), ("25.6k", 25_600), ("1M", 2**20), ("2g", 2 * 10**9)]
    + [("1T", 2**40), (" 128k ", 128_000), ("auto", None), ("-1", None)],
)
def test_model_lengths_read_as_vllm_spells_them(text, tokens):
    assert human_readable_int(text) == tokens


@pytest.mark.parametrize("text", ["32.5K", "32kb", "k", "", "1e3", "thirty"])
def test_a_model_length_vllm_would_refuse_is_refused(text):
    with pytest.raises(InputError, match=r"^--max-model-len: got .*, expected a token count as vllm serve takes it"):
        human_readable_int(text)


def test_a_pasted_line_plans_what_kprecompiles_own_spelling_plans(caplog):
    """Its positional model, vLLM's spellings of the kernel settings, and flags that change no kernel
    kprecompile plans, which are listed once at INFO; the control: the same plan from kprecompile's
    own options, and a different one from a different length."""
    own = plan("--model", "deepseek-v2-lite", "--tp", "1", "--max-num-seqs", "8", "--max-model-len", "32000")
    line = (
        "deepseek-v2-lite --tensor-parallel-size 1 --max-num-seqs 8 --max-model-len 32k --port 8000 "
        "--host 0.0.0.0 --gpu-memory-utilization 0.92 --served-model-name lite lite-2 --enable-prefix-caching "
        "--async-scheduling --pipeline-parallel-size 1 --data-parallel-size 1 --disable-log-requests "
        "--trust-remote-code --seed 0"
    )
    result = kprecompile_cli("-v", "plan", *shlex.split(line), *PLAN)
    assert result.returncode == 0, result.stderr
    assert untimed(json.loads(result.stdout)) == own
    [info] = [entry for entry in result.stderr.splitlines() if "vllm serve flags not read" in entry]
    assert info.endswith(
        "--port --host --gpu-memory-utilization --served-model-name --enable-prefix-caching --async-scheduling "
        "--pipeline-parallel-size --data-parallel-size --disable-log-requests --seed"
    )
    assert plan("deepseek-v2-lite", "--max-num-seqs", "8", "--max-model-len", "32K") != own


def test_capture_sizes_read_from_each_form_vllm_takes():
    """vLLM's compilation config (JSON, dotted key, -O), its older --cuda-graph-sizes, its list
    spelling of --cudagraph-capture-sizes and kprecompile's commas: one plan."""
    forms = [
        ["--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 8]}'],
        ["--compilation-config.cudagraph_capture_sizes=[1,2,8]"],
        ["-O.cudagraph_capture_sizes=[1,2,8]"],
        ["-cc", '{"mode": 3, "cudagraph_capture_sizes": [8, 2, 1]}'],
        ["--cuda-graph-sizes", "1", "2", "8"],
        ["--cudagraph-capture-sizes", "1", "2", "8"],
        ["--cudagraph-capture-sizes", "1,2,8"],
    ]
    plans = [plan("deepseek-v2-lite", "--max-num-seqs", "8", *form) for form in forms]
    assert all(p["serving"]["cudagraph_capture_sizes"] == [1, 2, 8] for p in plans)
    assert all(p == plans[0] for p in plans)
    # The control: vLLM's own rule, without them.
    assert plan("deepseek-v2-lite", "--max-num-seqs", "8")["serving"]["cudagraph_capture_sizes"] != [1, 2, 8]
    # An optimization level alone names no sizes.
    assert plan("deepseek-v2-lite", "--max-num-seqs", "8", "-O3") == plan("deepseek-v2-lite", "--max-num-seqs", "8")


def test_a_flag_neither_takes_is_refused_with_the_nearest_names():
    assert refused("deepseek-v2-lite", "--max-num-seq", "8") == (
        "kprecompile: option: got '--max-num-seq', expected an option of kprecompile's or a flag vllm serve takes "
        "(--max-num-seqs, --max-num-active-seqs, --max-num-queued-reqs?)"
    )
    assert refused("deepseek-v2-lite", "--targte", "gfx950").startswith(
        "kprecompile: option: got '--targte', expected an option of kprecompile's or a flag vllm serve takes (--target"
    )


@pytest.mark.parametrize(
    "argv, said",
    [
        (["deepseek-v2-lite", "--model", "deepseek-r1"], "--model: got 'deepseek-r1', expected the positional model"),
        (["deepseek-v2-lite", "deepseek-r1"], "MODEL: got 'deepseek-r1', expected one positional model"),
        (["--tp", "1"], "--model: got 'nothing', expected a model: positional, as vllm serve takes it, or --model"),
        (["deepseek-v2-lite", "--hf-overrides", '{"num_hidden_layers": 2}'], "--hf-overrides: got "),
        (["deepseek-v2-lite", "--quantization", "fp8"], "--quantization: got 'fp8', expected left out"),
        (["deepseek-r1", "-q", "awq"], "--quantization: got 'awq', expected fp8, the quantization of"),
        (["deepseek-v2-lite", "--port"], "--port: got 'no value', expected a value"),
        (["deepseek-v2-lite", "--max-model-len", "32.5K"], "--max-model-len: got '32.5K', expected a token count"),
        (["deepseek-v2-lite", "--compilation-config.cudagraph_capture_sizes=[1,2"], "--compilation-config: got "),
        (["deepseek-v2-lite", "-cc", '{"cudagraph_capture_sizes": 8}'], "-cc: got "),
        (["deepseek-v2-lite", "-cc", '{"cudagraph_capture_sizes": [1, -2]}'], "-cc: got -2, expected positive"),
        (["deepseek-v2-lite", "--compilation-config", "{not json"], "--compilation-config: got '{not json', expected"),
    ],
)
def test_what_kprecompile_cannot_follow_is_refused_in_one_line(argv, said):
    assert refused(*argv).startswith(f"kprecompile: {said}")


def test_the_checkpoints_own_quantization_is_accepted():
    assert plan("deepseek-r1", "--tp", "8", "--quantization", "fp8") == plan("deepseek-r1", "--tp", "8")


def test_the_readmes_vllm_serve_lines_paste_into_kprecompile(tmp_path):
    """Each `vllm serve` line of the README, as written, with `kprecompile plan` in place of `vllm
    serve` (its Hugging Face ids in a local Hugging Face cache, as `hf download` leaves them)."""
    readme = (ROOT / "README.md").read_text()
    lines = re.findall(r"^(?:\S+=\S+ )*vllm serve (.+)$", readme, re.MULTILINE)
    assert lines
    hub = tmp_path / "hub"
    presets = {"deepseek-ai/DeepSeek-R1": "deepseek-r1"}
    for words in map(shlex.split, lines):
        repo = hub / f"models--{words[0].replace('/', '--')}"
        (repo / "snapshots" / ("0" * 40)).mkdir(parents=True, exist_ok=True)
        config = resources.files("kprecompile.inputs.presets") / f"{presets[words[0]]}.json"
        (repo / "snapshots" / ("0" * 40) / "config.json").write_text(config.read_text())
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text("0" * 40)
        environment = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
        command = [sys.executable, "-m", "kprecompile", "plan", *words, *PLAN]
        result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (words, result.stderr)
        assert json.loads(result.stdout)["model"] == words[0]


def test_click_never_reads_vllms_one_dash_flags_as_its_own():
    """`-O.…` holds an `h`: read as click's one-letter cluster it would print the help."""
    dotted = "-O.cudagraph_capture_sizes=[1,8]"
    result = kprecompile_cli("plan", "deepseek-v2-lite", dotted, "--max-num-seqs", "8", *PLAN)
    assert result.returncode == 0 and not result.stdout.startswith("Usage:"), result.stdout[:200]
    assert kprecompile_cli("plan", "-h").stdout.startswith("Usage: kprecompile plan [OPTIONS] [MODEL]")
