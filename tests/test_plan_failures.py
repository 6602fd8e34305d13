"""A family whose trace raises is a failure (exit 1, never recorded warm); one that cannot run here for
a known reason is a skipped row (exit 0).

The failure is real: AITER's FP8 MLA decode has no block size for 16 heads x 5 query tokens
(`get_block_n_fp8[80]` in `aiter/mla.py` raises KeyError), which DeepSeek-V2-Lite with an FP8 KV
cache and 4 speculative tokens reaches at batch 1.
"""

from __future__ import annotations

import json

import pytest
from helpers import run_cli

import kprecompile
from kprecompile.inputs.serving import ServingParams
from kprecompile.selection.request import resolve_requests

# mla_decode fails; fp8_bmm plans (and compiles) 4 kernels.
FAILING = (
    "--model",
    "deepseek-v2-lite",
    "--kv-cache-dtype",
    "fp8",
    "--num-speculative-tokens",
    "4",
    "--target",
    "gfx942",
    "--max-num-seqs",
    "1",
    "--max-model-len",
    "4096",
    "--family",
    "fp8_bmm",
    "--family",
    "mla_decode",
)
ERROR = "tracing mla_decode failed at mla_decode_fwd(batch=1, heads=16, query_len=5): KeyError: 80"


def options(*replaced: str) -> list[str]:
    """FAILING with each (option, value) pair of `replaced` in place of its value."""
    chosen = list(FAILING)
    for option, value in zip(replaced[::2], replaced[1::2], strict=True):
        chosen[chosen.index(option) + 1] = value
    return chosen


def test_a_family_whose_trace_raises_fails_plan_and_the_rest_is_planned(capsys):
    status, out, err = run_cli(capsys, "plan", *FAILING, "--json")
    document = json.loads(out)
    families = {row["family"]: row for row in document["families"]}
    assert status == 1
    assert err == f"kprecompile: deepseek-v2-lite: mla_decode on gfx942 failed: {ERROR}\n"
    assert families["mla_decode"]["error"] == ERROR and families["mla_decode"]["skip_reason"] is None
    assert families["fp8_bmm"]["error"] is None and families["fp8_bmm"]["kernels"] == document["kernels"] == 4
    assert document["failed"] == 1


def test_a_family_that_cannot_run_here_is_a_skipped_row_and_plan_succeeds(capsys):
    """The negative control: at tp 2 the same family has 8 heads per rank, which AITER's MLA decode
    does not take (its limits say so): a known reason, exit 0."""
    status, out, err = run_cli(capsys, "plan", *FAILING, "--tp", "2", "--json")
    document = json.loads(out)
    families = {row["family"]: row for row in document["families"]}
    assert status == 0, err
    assert families["mla_decode"]["error"] is None
    assert families["mla_decode"]["skip_reason"].startswith("AITER's MLA decode supports 16 or 128 heads per rank")
    assert document["failed"] == 0 and document["kernels"] > 0
    # Without speculative tokens the same family plans: what fails is the 80-row query.
    status, out, err = run_cli(capsys, "plan", *options("--num-speculative-tokens", "0"), "--json")
    assert status == 0, err
    assert json.loads(out)["failed"] == 0


@pytest.mark.compiles
def test_warm_compiles_the_rest_exits_1_and_verify_never_says_warm(capsys, tmp_path):
    cache = ("--cache-dir", str(tmp_path))
    status, out, err = run_cli(capsys, "warm", *FAILING, *cache, "--jobs", "1", "--json")
    report = json.loads(out)
    assert status == 1
    assert err.endswith(f"kprecompile: deepseek-v2-lite: mla_decode on gfx942 failed, gfx942 is not warm: {ERROR}\n")
    assert report["family_failures"] == [
        {"model": "deepseek-v2-lite", "family": "mla_decode", "target": "gfx942", "error": ERROR}
    ]
    assert (report["compiled"], report["failed"]) == (4, 0)
    assert report["manifests"] == [] and not list((tmp_path / "manifests-v1").glob("*.json"))
    status, out, _ = run_cli(capsys, "verify", *FAILING, *cache, "--json")
    assert status == 1 and json.loads(out)["warm"] is False
    # Again: still a failure, the rest found cached.
    status, out, _ = run_cli(capsys, "warm", *FAILING, *cache, "--jobs", "1", "--json")
    assert status == 1 and (json.loads(out)["cached"], json.loads(out)["compiled"]) == (4, 0)


@pytest.mark.compiles
def test_bake_compiles_the_rest_exits_1_and_writes_no_index(capsys, tmp_path):
    out_dir = tmp_path / "bundle"
    status, out, err = run_cli(
        capsys, "bake", *FAILING, "--out", str(out_dir), "--archive", str(tmp_path / "b.tgz"), "--jobs", "1", "--json"
    )
    report = json.loads(out)
    assert status == 1
    assert f"mla_decode on gfx942 failed, gfx942 is not warm: {ERROR}" in err
    assert [failure["family"] for failure in report["family_failures"]] == ["mla_decode"]
    assert (report["compiled"], report["failed"]) == (4, 0)
    assert report["configurations"] == [] and report["archive"] is None
    assert not (out_dir / "bundle.json").exists() and not (tmp_path / "b.tgz").exists()


def test_the_python_api_exposes_the_failed_family(tmp_path):
    serving = ServingParams(max_num_seqs=1, max_model_len=4096, kv_cache_dtype="fp8", num_speculative_tokens=4)
    [request] = resolve_requests(
        ["deepseek-v2-lite"], serving, ["gfx942"], engine="vllm-aiter", families=["fp8_bmm", "mla_decode"]
    )
    result = kprecompile.plan(request)
    assert [(row.family, row.target, row.error) for row in result.failed] == [("mla_decode", "gfx942", ERROR)]
    assert result.kernels == 4
