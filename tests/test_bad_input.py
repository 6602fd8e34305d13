"""Bad input: malformed configs and serving parameters exit 2 with one line and write nothing.

Each row gives a config (a preset name, or a dict written to config.json, or raw bytes), extra
command-line options and environment, and the exact start of the one stderr line expected:
the field, the value as given and what was expected.
"""

from __future__ import annotations

import json

import pytest

from kprecompile.cli import main

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
MLA = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "num_attention_heads": 16,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 8192,
}


def edited(base: dict, **changes) -> dict:
    config = dict(base)
    for field, value in changes.items():
        if value is _DELETE:
            del config[field]
        else:
            config[field] = value
    return config


_DELETE = object()
CONFIG = "{path}/config.json"

CASES = [
    # Model configs: missing, negative, zero, non-integer and non-numeric fields.
    (
        "missing-heads",
        edited(LLAMA, num_attention_heads=_DELETE),
        [],
        {},
        "kprecompile: num_attention_heads in {config}: got None, expected an attention layout kprecompile derives for "
        "LlamaForCausalLM: multi-head latent attention",
    ),
    (
        "negative-heads",
        edited(LLAMA, num_attention_heads=-32),
        [],
        {},
        "kprecompile: num_attention_heads in {config}: got -32, expected a positive integer",
    ),
    (
        "zero-heads",
        edited(LLAMA, num_attention_heads=0),
        [],
        {},
        "kprecompile: num_attention_heads in {config}: got 0, expected a positive integer",
    ),
    (
        "fractional-heads",
        edited(LLAMA, num_attention_heads=32.5),
        [],
        {},
        "kprecompile: num_attention_heads in {config}: got 32.5, expected a positive integer",
    ),
    (
        "text-heads",
        edited(LLAMA, num_attention_heads="many"),
        [],
        {},
        "kprecompile: num_attention_heads in {config}: got 'many', expected a positive integer",
    ),
    (
        "more-kv-heads",
        edited(LLAMA, num_key_value_heads=64),
        [],
        {},
        "kprecompile: num_key_value_heads in {config}: got 64, expected a divisor of num_attention_heads = 32",
    ),
    (
        "kv-heads-not-divisor",
        edited(LLAMA, num_key_value_heads=5),
        [],
        {},
        "kprecompile: num_key_value_heads in {config}: got 5, expected a divisor of num_attention_heads = 32",
    ),
    (
        "hidden-not-multiple",
        edited(LLAMA, hidden_size=4097),
        [],
        {},
        "kprecompile: hidden_size in {config}: got 4097, expected a multiple of num_attention_heads = 32",
    ),
    (
        "no-head-size",
        edited(LLAMA, hidden_size=_DELETE),
        [],
        {},
        "kprecompile: hidden_size in {config}: got None, expected the field to be present",
    ),
    (
        "unknown-dtype",
        edited(LLAMA, torch_dtype="float8"),
        [],
        {},
        "kprecompile: torch_dtype in {config}: got 'float8', expected one of bfloat16, float16, float32",
    ),
    (
        "mla-missing-rope",
        edited(MLA, qk_rope_head_dim=_DELETE),
        [],
        {},
        "kprecompile: qk_rope_head_dim in {config}: got None, expected the field to be present",
    ),
    (
        "mla-zero-v",
        edited(MLA, v_head_dim=0),
        [],
        {},
        "kprecompile: v_head_dim in {config}: got 0, expected a positive integer",
    ),
    (
        "text-context",
        edited(LLAMA, max_position_embeddings="long"),
        [],
        {},
        "kprecompile: max_position_embeddings in {config}: got 'long', expected a positive integer",
    ),
    (
        "negative-window",
        edited(LLAMA, sliding_window=-1),
        [],
        {},
        "kprecompile: sliding_window in {config}: got -1, expected a positive integer",
    ),
    ("not-json", b"{nope: ", [], {}, "kprecompile: config.json in {config}: got '<7 bytes>', expected valid JSON"),
    ("json-array", b"[1, 2]", [], {}, "kprecompile: config.json in {config}: got 'list', expected a JSON object"),
    (
        "huge-heads",
        edited(LLAMA, num_attention_heads=2**40, hidden_size=2**41),
        [],
        {},
        "kprecompile: num_attention_heads in {config}: got 1099511627776, expected at most 4,096",
    ),
    (
        "huge-context",
        edited(LLAMA, max_position_embeddings=2**40),
        [],
        {},
        "kprecompile: max_position_embeddings in {config}: got 1099511627776, expected at most 2,147,483,647",
    ),
    (
        "long-integer",
        b'{"num_attention_heads": ' + b"9" * 5000 + b"}",
        [],
        {},
        "kprecompile: config.json in {config}: got '<5025 bytes>', expected valid JSON (a number too long to read)",
    ),
    (
        "deep-nesting",
        b"[" * 100000 + b"]" * 100000,
        [],
        {},
        "kprecompile: config.json in {config}: got '<200000 bytes>', expected valid JSON (nested too deeply)",
    ),
    (
        "no-context-length",
        edited(LLAMA, max_position_embeddings=_DELETE),
        [],
        {},
        "kprecompile: --max-model-len: got None, expected a value: {config} has no max_position_embeddings",
    ),
    # Model locations.
    ("unknown-preset", "no-such-model", [], {}, "kprecompile: --model: got 'no-such-model', expected a preset name ("),
    (
        "dir-without-config",
        "{path}",
        [],
        {},
        "kprecompile: --model: got '{path}', expected a directory holding config.json; it has none",
    ),
    (
        "unreadable",
        "/proc/self/mem",
        [],
        {},
        "kprecompile: --model: got '/proc/self/mem', expected a readable file (Input/output error)",
    ),
    # Serving parameters against the model.
    (
        "heads-not-divisible-by-tp",
        "deepseek-r1",
        ["--tp", "3"],
        {},
        "kprecompile: --tp: got 3, expected a divisor of num_attention_heads = 128 of deepseek-r1",
    ),
    (
        "kv-heads-vs-tp",
        edited(LLAMA, num_attention_heads=12, num_key_value_heads=6, hidden_size=1536),
        ["--tp", "4"],
        {},
        "kprecompile: --tp: got 4, expected a divisor or multiple of num_key_value_heads = 6",
    ),
    (
        "model-len-too-long",
        "llama-3.1-8b-instruct",
        ["--max-model-len", "200000"],
        {},
        "kprecompile: --max-model-len: got 200000, expected at most max_position_embeddings = 131072 of "
        "llama-3.1-8b-instruct",
    ),
    ("zero-tp", "deepseek-r1", ["--tp", "0"], {}, "kprecompile: --tp: got 0, expected a positive integer"),
    (
        "text-tp",
        "deepseek-r1",
        ["--tp", "abc"],
        {},
        "kprecompile: Invalid value for '-tp' / '--tp' / '--tensor-parallel-size': 'abc' is not a valid integer.",
    ),
    (
        "negative-batched-tokens",
        "deepseek-r1",
        ["--max-num-batched-tokens", "-1"],
        {},
        "kprecompile: --max-num-batched-tokens: got -1, expected a positive integer",
    ),
    (
        "zero-seqs",
        "deepseek-r1",
        ["--max-num-seqs", "0"],
        {},
        "kprecompile: --max-num-seqs: got 0, expected a positive integer",
    ),
    (
        "odd-block-size",
        "deepseek-r1",
        ["--block-size", "7"],
        {},
        "kprecompile: --block-size: got 7, expected one of 1, 8, 16, 32, 64, 128",
    ),
    (
        "unknown-kv-dtype",
        "deepseek-r1",
        ["--kv-cache-dtype", "fp4"],
        {},
        "kprecompile: --kv-cache-dtype: got 'fp4', expected one of auto, fp8, fp8_e4m3",
    ),
    (
        "unknown-dtype-option",
        "deepseek-r1",
        ["--dtype", "float64"],
        {},
        "kprecompile: --dtype: got 'float64', expected auto, bfloat16, float16 or half (serving in float32 is not "
        "planned)",
    ),
    (
        "text-capture-size",
        "deepseek-r1",
        ["--cudagraph-capture-sizes", "1,x"],
        {},
        "kprecompile: --cudagraph-capture-sizes: got '1,x', expected a comma-separated list of positive integers",
    ),
    (
        "zero-capture-size",
        "deepseek-r1",
        ["--cudagraph-capture-sizes", "0,8"],
        {},
        "kprecompile: --cudagraph-capture-sizes: got 0, expected a positive integer",
    ),
    (
        "negative-spec-tokens",
        "deepseek-r1",
        ["--num-speculative-tokens", "-1"],
        {},
        "kprecompile: --num-speculative-tokens: got -1, expected a non-negative integer",
    ),
    (
        "huge-spec-tokens",
        "deepseek-r1",
        ["--num-speculative-tokens", "10000000"],
        {},
        "kprecompile: --num-speculative-tokens: got 10000000, expected a non-negative integer up to 32",
    ),
    (
        "huge-seqs",
        "deepseek-r1",
        ["--max-num-seqs", "100000000"],
        {},
        "kprecompile: --max-num-seqs: got 100000000, expected at most 16,384",
    ),
    (
        "huge-model-len",
        "deepseek-r1",
        ["--max-model-len", str(2**30)],
        {},
        "kprecompile: --max-model-len: got 1073741824, expected at most 16,777,216",
    ),
    (
        "fewer-tokens-than-seqs",
        "deepseek-r1",
        ["--max-num-seqs", "256", "--max-num-batched-tokens", "128"],
        {},
        "kprecompile: --max-num-batched-tokens: got 128, expected at least --max-num-seqs = 256 (vLLM refuses fewer)",
    ),
    ("huge-tp", "deepseek-r1", ["--tp", "4096"], {}, "kprecompile: --tp: got 4096, expected at most 1,024"),
    # vLLM's spellings, and what they cannot say.
    (
        "float32-dtype",
        "deepseek-r1",
        ["--dtype", "float32"],
        {},
        "kprecompile: --dtype: got 'float32', expected auto, bfloat16, float16 or half (serving in float32 is not "
        "planned)",
    ),
    (
        "speculative-config-not-json",
        "deepseek-r1",
        ["--speculative-config", "{mtp"],
        {},
        "kprecompile: --speculative-config: got '{{mtp', expected a JSON object such as "
        '\'{{"method": "mtp", "num_speculative_tokens": 1}}\'',
    ),
    (
        "speculative-config-without-tokens",
        "deepseek-r1",
        ["--speculative-config", '{"method": "mtp"}'],
        {},
        'kprecompile: --speculative-config: got \'{{"method": "mtp"}}\', expected a JSON object with an integer '
        "num_speculative_tokens",
    ),
    (
        "speculative-tokens-disagree",
        "deepseek-r1",
        ["--speculative-config", '{"num_speculative_tokens": 2}', "--num_speculative_tokens", "3"],
        {},
        "kprecompile: --num-speculative-tokens: got 3, expected the same as --speculative-config's "
        "num_speculative_tokens (2), or left out",
    ),
    # Engine selection.
    (
        "unknown-engine",
        "deepseek-r1",
        ["--engine", "sglang"],
        {},
        "kprecompile: --engine: got 'sglang', expected one of vllm-aiter, vllm, aiter",
    ),
    (
        "backend-for-other-attention",
        "deepseek-r1",
        ["--attention-backend", "ROCM_AITER_FA"],
        {},
        "kprecompile: --attention-backend: got 'ROCM_AITER_FA', expected one of ROCM_AITER_MLA, ROCM_AITER_TRITON_MLA, "
        "TRITON_MLA for deepseek-r1's multi-head latent attention",
    ),
    (
        "backend-from-environment",
        "llama-3.1-8b-instruct",
        [],
        {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"},
        "kprecompile: VLLM_ATTENTION_BACKEND: got 'FLASH_ATTN', expected one of ROCM_AITER_UNIFIED_ATTN, ROCM_AITER_FA",
    ),
    (
        "old-vllm",
        "deepseek-r1",
        ["--vllm-version", "0.11.0"],
        {},
        "kprecompile: --vllm-version: got '0.11.0', expected a vLLM release, 0.11.2 or newer (tested: 0.12.0, 0.25.1, "
        "0.31.0, 0.33.0)",
    ),
    (
        "not-a-version",
        "deepseek-r1",
        ["--vllm-version", "latest"],
        {},
        "kprecompile: --vllm-version: got 'latest', expected a vLLM release, 0.11.2 or newer",
    ),
    (
        "unknown-family",
        "llama-3.1-8b-instruct",
        ["--family", "fp8_bmm"],
        {},
        "kprecompile: --family: got 'fp8_bmm', expected one of prefix_prefill, paged_decode, aiter_fa_context "
        "for llama-3.1-8b-instruct",
    ),
    (
        "unknown-target",
        "deepseek-r1",
        ["--target", "gfx9999"],
        {},
        "kprecompile: --target: got 'gfx9999', expected one of gfx90a, gfx942, gfx950, sm80, sm89, sm90, sm100, a "
        "product (mi210, mi250, mi250x, mi300a, mi300x, mi325x, mi350x, mi355x, a100, l40s, l4, h100, h200, h20, b200, "
        "gb200), or auto",
    ),
    ("zero-jobs", "deepseek-r1", ["--jobs", "0"], {}, "kprecompile: --jobs: got 0, expected a positive integer"),
    (
        "negative-timeout",
        "deepseek-r1",
        ["--job-timeout", "-1"],
        {},
        "kprecompile: --job-timeout: got -1.0, expected a positive number of seconds",
    ),
    # kprecompile's own settings, checked before any work (not once per kernel, after it).
    (
        "lock-timeout-text",
        "deepseek-r1",
        [],
        {"KPRECOMPILE_LOCK_TIMEOUT": "abc"},
        "kprecompile: KPRECOMPILE_LOCK_TIMEOUT: got 'abc', expected a positive number of seconds",
    ),
    (
        "lock-timeout-nan",
        "deepseek-r1",
        [],
        {"KPRECOMPILE_LOCK_TIMEOUT": "nan"},
        "kprecompile: KPRECOMPILE_LOCK_TIMEOUT: got 'nan', expected a positive number of seconds",
    ),
    (
        "trace-workers",
        "deepseek-r1",
        [],
        {"KPRECOMPILE_TRACE_WORKERS": "0"},
        "kprecompile: KPRECOMPILE_TRACE_WORKERS: got '0', expected a positive whole number",
    ),
    (
        "strict-mode",
        "deepseek-r1",
        [],
        {"KPRECOMPILE_STRICT": "bogus"},
        "kprecompile: KPRECOMPILE_STRICT: got 'bogus', expected one of off, warn, error",
    ),
    (
        "hook-switch",
        "deepseek-r1",
        [],
        {"KPRECOMPILE_VLLM_HOOK": "maybe"},
        "kprecompile: KPRECOMPILE_VLLM_HOOK: got 'maybe', expected 1 or 0 (true or false)",
    ),
]


WARM_ONLY = ("--jobs", "--job-timeout")
RUNS = [
    pytest.param(command, *case, id=f"{case[0]}-{command}")
    for case in CASES
    for command in ("plan", "warm", "verify")
    if command == "warm" or case[2][:1] not in ([option] for option in WARM_ONLY)
]


@pytest.mark.parametrize("command, name, config, options, environment, message", RUNS)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    capsys, monkeypatch, tmp_path, command, name, config, options, environment, message
):
    for variable in ("VLLM_ATTENTION_BACKEND", "VLLM_ROCM_USE_AITER"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    config_path = model_dir / "config.json"
    if isinstance(config, dict):
        config_path.write_text(json.dumps(config))
        model = str(config_path)
    elif isinstance(config, bytes):
        config_path.write_bytes(config)
        model = str(config_path)
    else:
        model = config.format(path=model_dir)
    cache = tmp_path / "cache"
    target = [] if "--target" in options else ["--target", "gfx942"]
    argv = [command, "--model", model, *target, *options, "--cache-dir", str(cache)]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    captured = capsys.readouterr()
    expected = message.format(path=model_dir, config=config_path)
    assert exited.value.code == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(expected), captured.err
    assert not cache.exists()


def test_an_empty_cache_dir_is_refused_not_the_current_directory(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["warm", "--model", "deepseek-v2-lite", "--target", "gfx942", "--family", "fp8_bmm", "--cache-dir", ""])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "kprecompile: --cache-dir: got '', expected a directory path\n"
    assert list(tmp_path.iterdir()) == []
