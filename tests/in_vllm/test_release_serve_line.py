"""A pasted `vllm serve` line inside each tested release: the release's own parser reads it, and
the table a builder without vLLM checks lines against (`vllm/serve_flags.json`) holds every flag of
it, read with the same number of values; the mirror of vLLM's token counts reads as the release's."""

from __future__ import annotations

import json

import pytest
from helpers import kprecompile_cli

from kprecompile.inputs.serve_line import human_readable_int
from kprecompile.inputs.targets import TARGETS
from kprecompile.tracing.libraries import import_library_module
from kprecompile.vllm.serve_parser import parser_flags, release_parser, serve_flags

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.vllm_process("capture-rocm")]

PLAN = ("--target", "gfx942", "--engine", "aiter", "--family", "fp8_bmm", "--json")
LENGTHS = ("8192", "32k", "32K", "25.6k", "1m", "1M", "2g", "2G", "1t", "1T", "auto", "-1", "32.5K")


def test_the_flag_table_holds_every_flag_of_this_releases_vllm_serve(release):
    flags = parser_flags(release_parser(TARGETS["gfx942"]))
    table = serve_flags()
    assert len(flags) > 200  # the release's whole parser, engine and frontend flags
    assert {flag: arity for flag, arity in flags.items() if table.get(flag) != arity} == {}
    # The control: a table without one of them misses it.
    dropped = dict(table)
    del dropped["--gpu-memory-utilization"]
    assert {flag for flag in flags if flag not in dropped} == {"--gpu-memory-utilization"}


def test_the_token_count_mirror_reads_as_this_release_does(release):
    """Every spelling the release takes reads the same; what it refuses, the mirror refuses too,
    unless a later release takes it (`t`, `T` and `auto` are newer)."""
    with_auto = getattr(import_library_module("vllm.utils.argparse_utils"), "human_readable_int_or_auto", None)
    plain = getattr(import_library_module("vllm.utils.argparse_utils"), "human_readable_int", None)
    theirs = with_auto or plain or import_library_module("vllm.engine.arg_utils").human_readable_int
    read = 0
    for text in LENGTHS:
        try:
            expected = theirs(text)
        except Exception:  # noqa: BLE001 (argparse's and int's errors alike: the release refuses it)
            continue
        assert human_readable_int(text) == (None if expected == -1 else expected), text
        read += 1
    assert read >= 9


def test_a_pasted_line_is_read_by_this_releases_parser(release):
    """Its abbreviations too (argparse's: `--max-num-seq`), which the table refuses: the setting a
    line changes is read, never left at kprecompile's default."""
    line = (
        "deepseek-v2-lite", "--max-model-len", "32k", "--max-num-seq", "8", "--port", "8000",
        "--gpu-memory-utilization", "0.9", "--enable-prefix-caching",
        "--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 8]}',
    )  # fmt: skip
    result = kprecompile_cli("-v", "plan", *line, *PLAN)
    assert result.returncode == 0, result.stderr[-2000:]
    serving = json.loads(result.stdout)["serving"]
    assert serving["max_model_len"] == 32_000 and serving["max_num_seqs"] == 8
    assert serving["cudagraph_capture_sizes"] == [1, 2, 8]
    assert "vllm serve flags not read (they change no kernel kprecompile plans): --port --gpu-memory-utilization" in (
        result.stderr
    )
    # The control: a flag the release does not take is one line, exit 2, from its parser.
    result = kprecompile_cli("plan", "deepseek-v2-lite", "--no-such-flag", "1", *PLAN)
    assert result.returncode == 2 and result.stderr.startswith("kprecompile: vllm serve line: got ")
    assert "--no-such-flag" in result.stderr and len(result.stderr.strip().splitlines()) == 1
