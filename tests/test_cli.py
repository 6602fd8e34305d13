import json
import os
import subprocess
import sys

import pytest
from helpers import kprecompile_cli, parse_command_line, run_cli

from kprecompile.errors import InputError


def test_auto_target_without_a_gpu_exits_2_and_writes_nothing(capsys, tmp_path, monkeypatch):
    """The rest of the bad-input table is in test_bad_input.py."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cache = tmp_path / "cache"
    status, out, err = run_cli(capsys, "warm", "--model", "deepseek-r1", "--target", "auto", "--cache-dir", str(cache))
    assert status == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("kprecompile: --target: got 'auto', expected a visible GPU for auto-detection"), err
    assert not cache.exists()


@pytest.mark.parametrize("where", ["after the subcommand", "after its options", "before the subcommand", "none"])
def test_verbosity_is_taken_anywhere_before_a_double_dash(where):
    """`kprecompile plan -v ...` as pip, uv and vllm take it; the control without one logs no INFO."""
    plan = ["--model", "deepseek-v2-lite", "--target", "gfx942", "--engine", "aiter", "--family", "fp8_bmm"]
    argv = {
        "after the subcommand": ["plan", "-v", *plan],
        "after its options": ["plan", *plan, "--verbose"],
        "before the subcommand": ["-v", "plan", *plan],
        "none": ["plan", *plan],
    }[where]
    result = kprecompile_cli(*argv, "--max-num-seqs", "4", "--json")
    assert result.returncode == 0, result.stderr
    traced = "INFO kprecompile.tracing.trace: traced fp8_bmm on gfx942"
    assert (traced in result.stderr) == (where != "none"), result.stderr
    assert json.loads(result.stdout)["kernels"] > 0


def test_plan_json_schema(capsys):
    status, out, _ = run_cli(capsys, "plan", "--model", "deepseek-r1", "--tp", "8", "--target", "gfx942", "--json")
    assert status == 0
    document = json.loads(out)
    assert document["engine"]["attention_backend"] == "ROCM_AITER_MLA"
    assert document["serving"]["max_num_seqs"] == 1024 and document["serving"]["block_size"] == 16
    # The values the engine resolves, not "auto" and null: R1's config length and dtype.
    assert (document["serving"]["max_model_len"], document["serving"]["dtype"]) == (163840, "bfloat16")
    assert document["serving"]["cudagraph_capture_sizes"][:3] == [1, 2, 4]
    families = {family["family"]: family for family in document["families"]}
    assert list(families) == ["fp8_bmm", "fp4_bmm", "mla_decode", "mla_prefill", "mla_merge", "block_fp8_linear"]
    # vLLM's merge around the prefill is traced from an installed vLLM (tests/test_vllm.py).
    assert families["mla_merge"]["skip_reason"].endswith(
        "kprecompile engine install vllm==0.12.0, then --vllm-version 0.12.0"
    )
    assert families["mla_merge"]["missing"] == "vllm==0.12.0" and families["fp8_bmm"]["missing"] is None
    bmm = families["fp8_bmm"]
    assert bmm["target"] == "gfx942" and bmm["calls"] == 2 * 1024 and 0 < bmm["kernels"] < bmm["calls"]
    assert bmm["parameters"]["heads_per_rank"] == 16
    # The stage-2 reduce takes the batch size as a constexpr: one kernel per reachable batch size.
    assert families["mla_decode"]["kernels"] == families["mla_decode"]["calls"] == 1024
    assert "CK flash-attention" in families["mla_prefill"]["skip_reason"]
    assert document["kernels"] == bmm["kernels"] + 1024


def test_plan_lists_every_mla_family_under_the_triton_mla_backend(capsys):
    status, out, _ = run_cli(
        capsys,
        "plan",
        "--model",
        "deepseek-r1",
        "--tp",
        "8",
        "--target",
        "gfx942",
        "--attention-backend",
        "ROCM_AITER_TRITON_MLA",
        "--max-num-seqs",
        "4",
        "--json",
    )
    assert status == 0
    families = {family["family"]: family for family in json.loads(out)["families"]}
    assert list(families) == ["fp8_bmm", "fp4_bmm", "mla_decode", "mla_prefill", "mla_merge", "block_fp8_linear"]
    aiters = [families[name] for name in ("fp8_bmm", "mla_decode", "mla_prefill")]
    assert all(family["skip_reason"] is None and family["kernels"] > 0 for family in aiters)


def test_plan_says_why_a_family_is_skipped_on_a_target(capsys):
    status, out, _ = run_cli(capsys, "plan", "--model", "deepseek-r1", "--tp", "8", "--target", "sm90", "--json")
    assert status == 0
    families = json.loads(out)["families"]
    assert [family["kernels"] for family in families] == [0, 0]
    # vLLM's CUDA selection on an H100/H200: FlashAttention-3's MLA kernels, prebuilt.
    assert [family["family"] for family in families] == ["triton_mla", "block_fp8_linear"]
    assert families[0]["skip_reason"].startswith("FLASH_ATTN_MLA runs vLLM's prebuilt FlashAttention-3 MLA kernels")
    status, out, _ = run_cli(
        capsys, "plan", "--model", "deepseek-r1", "--tp", "8", "--target", "sm90", "--engine", "aiter", "--json"
    )
    families = json.loads(out)["families"]
    assert status == 0 and [family["kernels"] for family in families] == [0, 0, 0]
    assert "ROCm targets only" in families[0]["skip_reason"] and "ROCm targets only" in families[1]["skip_reason"]


def test_plan_of_a_gqa_model_under_unified_attention(capsys):
    status, out, _ = run_cli(
        capsys,
        "plan",
        "--model",
        "llama-3.1-8b-instruct",
        "--target",
        "gfx942",
        "--attention-backend",
        "ROCM_AITER_UNIFIED_ATTN",
        "--max-num-seqs",
        "64",
        "--json",
    )
    assert status == 0
    families = {family["family"]: family for family in json.loads(out)["families"]}
    assert list(families) == ["prefix_prefill", "paged_decode"]
    assert all(family["kernels"] > 0 for family in families.values())
    assert "sliding_window" not in families["prefix_prefill"]["parameters"]


def test_plan_of_a_gqa_model_without_vllm_fails_naming_what_installs_it(capsys):
    """Llama under vLLM 0.12's default ROCm backend, no vLLM here: nothing compiles on this builder,
    which is a failure (exit 1), the family naming the command that installs vLLM's code."""
    status, out, _ = run_cli(capsys, "plan", "--model", "llama-3.1-8b-instruct", "--target", "gfx942", "--json")
    assert status == 1
    document = json.loads(out)
    assert document["engine"]["attention_backend"] == "ROCM_AITER_FA" and document["kernels"] == 0
    prebuilt, gathered = document["families"][:2], document["families"][2]
    assert all("prebuilt CK/assembly" in family["skip_reason"] for family in prebuilt)
    assert all(family["error"] is None for family in prebuilt)
    # vLLM's own kernels around it on steps with cached context need vLLM's code to be traced.
    assert gathered["family"] == "aiter_fa_context" and gathered["missing"] == "vllm==0.12.0"
    assert gathered["error"].endswith("kprecompile engine install vllm==0.12.0, then --vllm-version 0.12.0")
    assert document["failed"] == 1


def small_warm(tmp_path, *extra):
    """`warm` of one kernel (DeepSeek-V2-Lite's MLA decode reduce for one sequence, gfx942), JSON output."""
    return [
        "warm",
        "--model",
        "deepseek-v2-lite",
        "--target",
        "gfx942",
        "--max-num-seqs",
        "1",
        "--family",
        "mla_decode",
        "--jobs",
        "1",
        "--cache-dir",
        str(tmp_path),
        "--json",
        *extra,
    ]


@pytest.mark.compiles
def test_warm_twice_compiles_then_reports_everything_cached(capsys, tmp_path):
    argv = small_warm(tmp_path)
    status, out, err = run_cli(capsys, *argv)
    first = json.loads(out)
    assert status == 0, err
    assert first["compiled"] == first["kernels"] > 0 and first["failed"] == 0 and first["cached"] == 0

    status, out, _ = run_cli(capsys, *argv)
    second = json.loads(out)
    assert status == 0
    assert (second["compiled"], second["cached"], second["failed"]) == (0, first["kernels"], 0)
    # Found warm from the manifest: no compile worker started, nothing traced.
    assert first["workers"] == 1 and second["workers"] == 0 and second["trace_seconds"] == 0
    assert set(second) >= {"compiled", "cached", "failed", "seconds", "failures", "families"}


def test_console_script_prints_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kprecompile", "plan", "--model", "deepseek-v2-lite", "--tp", "3", "--target", "gfx942"],
        capture_output=True,
        text=True,
        env={**os.environ, "KPRECOMPILE_CACHE_DIR": str(tmp_path)},
    )
    assert result.returncode == 2
    assert (
        result.stderr
        == "kprecompile: --tp: got 3, expected a divisor of num_attention_heads = 16 of deepseek-v2-lite\n"
    )


# Run as `python -c`: an object whose finalizer says when the interpreter tears its modules down,
# and an exit handler; then the command, through the process's entry point or `main` alone.
_ENDING = (
    "import atexit, sys\n"
    "class Torn:\n"
    "    def __del__(self):\n"
    "        print('torn down', flush=True)\n"
    "kept = Torn()\n"
    "atexit.register(print, 'exit handlers ran')\n"
    "sys.argv[0] = 'kprecompile'\n"
    "from kprecompile.cli import {entry}\n"
    "{entry}()\n"
)


def test_the_command_ends_with_its_status_and_output_without_tearing_down_its_imports(tmp_path):
    """The process ends once the command has (tearing down torch and Triton's modules takes a
    second or more): its exit handlers run, its output is whole, its status is the command's;
    the finalizers of what it imported never run. `main` alone is the control: it tears down."""
    env = {**os.environ, "KPRECOMPILE_CACHE_DIR": str(tmp_path)}
    plan = ["plan", "--model", "deepseek-r1", "--tp", "8", "--target", "gfx942", "--family", "fp8_bmm", "--json"]
    bad = ["plan", "--model", "deepseek-v2-lite", "--tp", "3", "--target", "gfx942"]

    def ended(entry: str, arguments: list[str]) -> subprocess.CompletedProcess:
        script = _ENDING.format(entry=entry)
        return subprocess.run([sys.executable, "-c", script, *arguments], capture_output=True, text=True, env=env)

    planned = ended("run", plan)
    assert planned.returncode == 0, planned.stderr[-2000:]
    document, _, after = planned.stdout.rpartition("}\n")
    assert json.loads(document + "}")["kernels"] > 0 and after == "exit handlers ran\n"
    refused = ended("run", bad)
    assert refused.returncode == 2 and refused.stdout == "exit handlers ran\n"
    assert refused.stderr.startswith("kprecompile: --tp: got 3, expected a divisor") and refused.stderr.count("\n") == 1
    control = ended("main", bad)
    assert control.returncode == 2 and control.stdout == "exit handlers ran\ntorn down\n"


@pytest.mark.compiles
def test_failed_kernels_exit_1_are_listed_and_leave_no_manifest(capsys, tmp_path):
    status, out, _ = run_cli(capsys, *small_warm(tmp_path, "--job-timeout", "0.01"))
    report = json.loads(out)
    assert status == 1
    assert report["failed"] == report["kernels"] == len(report["failures"]) > 0
    for failure in report["failures"]:
        assert failure["error"] == "timed out after 0.01 s"
        assert failure["kernel"].endswith(":_fwd_kernel_stage2_asm") and failure["family"] == "mla_decode"
        assert "BATCH_NUM=1" in failure["specialization"] and "num_warps=" in failure["specialization"]
    assert report["manifests"] == []
    assert not list((tmp_path / "manifests-v1").glob("*.json"))


def test_warm_with_nothing_to_compile_succeeds_and_records_the_configuration(capsys, tmp_path):
    """DeepSeek-R1 on an H100/H200: vLLM runs prebuilt FlashAttention-3 MLA kernels, nothing to compile."""
    status, out, _ = run_cli(
        capsys, "warm", "--model", "deepseek-r1", "--target", "sm90", "--cache-dir", str(tmp_path), "--json"
    )
    report = json.loads(out)
    assert status == 0
    assert (report["kernels"], report["compiled"], report["failed"]) == (0, 0, 0)
    assert len(report["manifests"]) == 1


def test_a_warm_that_compiles_nothing_for_lack_of_vllm_fails_and_records_nothing(capsys, tmp_path):
    """The negative of the above: Llama on gfx942 compiles nothing because vLLM's code is absent
    here; a CI bake must not go green with an empty cache, and `verify` must not say warm."""
    status, out, err = run_cli(
        capsys, "warm", "--model", "llama-3.1-8b-instruct", "--target", "gfx942", "--cache-dir", str(tmp_path), "--json"
    )
    report = json.loads(out)
    assert status == 1 and report["kernels"] == 0 and report["manifests"] == []
    [family] = report["family_failures"]
    assert family["family"] == "aiter_fa_context" and "kprecompile engine install vllm==0.12.0" in family["error"]
    assert "aiter_fa_context on gfx942 failed, gfx942 is not warm" in err
    status, _, _ = run_cli(
        capsys, "verify", "--model", "llama-3.1-8b-instruct", "--target", "gfx942", "--cache-dir", str(tmp_path)
    )
    assert status == 1


@pytest.mark.compiles
def test_a_failed_bake_prints_its_json_names_the_model_and_writes_no_index(capsys, tmp_path):
    out = tmp_path / "bundle"
    status, stdout, _ = run_cli(
        capsys,
        "bake",
        "--model",
        "deepseek-v2-lite",
        "--target",
        "gfx942",
        "--max-num-seqs",
        "1",
        "--family",
        "mla_decode",
        "--jobs",
        "1",
        "--job-timeout",
        "0.01",
        "--out",
        str(out),
        "--archive",
        str(tmp_path / "b.tgz"),
        "--json",
    )
    report = json.loads(stdout)
    assert status == 1
    assert report["failed"] == report["kernels"] == len(report["failures"]) > 0
    assert {failure["model"] for failure in report["failures"]} == {"deepseek-v2-lite"}
    assert report["configurations"] == [] and report["archive"] is None
    assert not (out / "bundle.json").exists() and not (tmp_path / "b.tgz").exists()


@pytest.mark.parametrize(
    "count, noun, spelled",
    [(1, "kernel", "1 kernel"), (2, "kernel", "2 kernels"), (1158, "kernel", "1,158 kernels"), (0, "file", "0 files")],
)
def test_counts_are_spelled_with_their_plural(count, noun, spelled):
    from kprecompile.cli.output import plural

    assert plural(count, noun) == spelled


def test_activate_is_part_of_the_public_api():
    import kprecompile

    assert "activate" in kprecompile.__all__ and callable(kprecompile.activate)


def test_a_vllm_serve_line_is_understood(capsys):
    """vLLM's spellings (-tp, --tensor-parallel-size, underscores, --dtype half, --speculative-config)
    and product names as targets plan exactly what kprecompile's own spellings do."""
    vllm = [
        "plan",
        "--model",
        "deepseek-r1",
        "-tp",
        "8",
        "--max_num_seqs=64",
        "--dtype",
        "half",
        "--target",
        "MI300X",
        "--speculative-config",
        '{"method": "deepseek_mtp", "num_speculative_tokens": 1}',
        "--json",
    ]
    own = [
        "plan",
        "--model",
        "deepseek-r1",
        "--tp",
        "8",
        "--max-num-seqs",
        "64",
        "--dtype",
        "float16",
        "--target",
        "gfx942",
        "--num-speculative-tokens",
        "1",
        "--json",
    ]
    documents = []
    for argv in (vllm, own):
        status, out, err = run_cli(capsys, *argv)
        assert status == 0, err
        document = json.loads(out)
        documents.append({name: document[name] for name in ("serving", "targets", "families", "kernels")})
    assert documents[0] == documents[1]
    assert documents[0]["serving"]["num_speculative_tokens"] == 1 and documents[0]["targets"] == ["gfx942"]
    status, out, _ = run_cli(
        capsys,
        "plan",
        "--model",
        "deepseek-r1",
        "--tensor-parallel-size",
        "8",
        "--target",
        "h200",
        "--family",
        "triton_mla",
        "--json",
    )
    assert status == 0 and json.loads(out)["targets"] == ["sm90"]


@pytest.mark.slow
@pytest.mark.compiles
def test_unattended_warm_prints_plain_progress_lines_and_ctrl_c_exits_130(tmp_path):
    """stderr not a terminal (CI, docker build): plain lines naming the model and target; Ctrl-C
    stops at once with 130 and leaves no manifest."""
    import signal
    import subprocess
    import sys

    # `python -m kprecompile`, with Python's own Ctrl-C handler whatever this process inherited: a
    # job a non-interactive shell starts with `&` ignores SIGINT, and so would the warm (it then
    # finished and exited 0: the flake issue 27 saw, reproduced by running this test that way).
    restore = "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    argv = [
        sys.executable,
        "-c",
        restore + "runpy.run_module('kprecompile', run_name='__main__', alter_sys=True)",
        "warm",
        "--model",
        "deepseek-r1",
        "--tp",
        "8",
        "--family",
        "fp8_bmm",
        "--target",
        "gfx942",
        "--cache-dir",
        str(tmp_path),
    ]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status, first, second = process.stderr.readline(), process.stderr.readline(), process.stderr.readline()
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=300)
    # Alive during the silent seconds too: what runs before there is anything to count.
    assert status == "kprecompile: deepseek-r1 on gfx942: tracing the engine's calls\n"
    assert first == "kprecompile: deepseek-r1 on gfx942: 134 kernels\n"
    assert second.startswith("kprecompile: deepseek-r1 on gfx942: ") and "/134 kernels (" in second
    assert process.returncode == 130 and rest.strip().endswith("kprecompile: interrupted")
    assert not list(tmp_path.glob("manifests-v*/*.json"))


def test_progress_lines_come_every_tenth_and_at_the_end():
    import io

    from kprecompile.progress import ProgressLines

    stream = io.StringIO()
    progress = ProgressLines(stream=stream, interval_seconds=3600)
    progress.start("m on gfx942", 95, 0)
    for _ in range(95):
        progress.advance()
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "kprecompile: m on gfx942: 95 kernels" and lines[-1].startswith(
        "kprecompile: m on gfx942: 95/95"
    )
    assert len(lines) == 1 + 10 + 1  # the start, every 9 kernels (10%), the end


def test_every_json_document_says_its_schema_version(capsys, tmp_path):
    for argv in (
        ["plan", "--model", "deepseek-r1", "--family", "fp8_bmm", "--target", "gfx942", "--max-num-seqs", "2"],
        ["env"],
        ["cache", "dir", "--cache-dir", str(tmp_path)],
    ):
        status, out, _ = run_cli(capsys, *argv, "--json")
        assert status == 0 and json.loads(out)["schema_version"] == 1


def test_a_cache_dir_that_cannot_be_written_is_one_line_up_front(capsys):
    """Found out once before any work, not once per kernel (sysfs refuses new directories, even
    to root)."""
    status, out, err = run_cli(
        capsys,
        "warm",
        "--model",
        "deepseek-r1",
        "--target",
        "gfx942",
        "--family",
        "fp8_bmm",
        "--cache-dir",
        "/sys/kprecompile-cache",
    )
    assert (status, out) == (2, "")
    assert (
        err == "kprecompile: --cache-dir: got '/sys/kprecompile-cache', expected a directory this user can write "
        "(Operation not permitted)\n"
    )


def test_doctor_reports_each_part_and_what_works(capsys, tmp_path):
    status, out, _ = run_cli(capsys, "doctor", "--cache-dir", str(tmp_path), "--json")
    document = json.loads(out)
    checks = {check["name"]: check for check in document["checks"]}
    assert status == 0 and document["ok"] is True
    assert list(checks) == ["python", "torch", "triton", "amd-aiter", "gpu", "driver modules", "vllm", "cache"]
    # A HIP runtime where TRITON_LIBHIP_PATH names one (a stand-in file: Triton only looks it up),
    # none where it names nothing: what doctor says follows Triton's own lookup.
    stand_in = tmp_path / "rocm" / "libamdhip64.so"
    stand_in.parent.mkdir()
    stand_in.touch()
    for path, rocm in ((stand_in, True), (tmp_path / "none" / "libamdhip64.so", False)):
        from triton.backends.amd.driver import _get_path_to_hip_runtime_dylib

        _get_path_to_hip_runtime_dylib.cache_clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TRITON_LIBHIP_PATH", str(path))
            _, out, _ = run_cli(capsys, "doctor", "--cache-dir", str(tmp_path), "--json")
        _get_path_to_hip_runtime_dylib.cache_clear()
        modules = {check["name"]: check for check in json.loads(out)["checks"]}["driver modules"]
        assert ("ROCm" in modules["value"]) == rocm, modules
        # Without ROCm, ok only where Triton finds libcuda (a CUDA host).
        assert modules["verdict"] == ("ok" if rocm or "CUDA" in modules["value"] else "warn"), modules
    import triton

    # Every supported Triton is a tested one (the suite runs on each: tests/test_packaging.py's list).
    assert checks["triton"]["verdict"] == "ok" and checks["triton"]["value"] == triton.__version__
    assert checks["amd-aiter"]["verdict"] == "ok" and checks["gpu"]["value"] == "none visible"
    assert checks["cache"]["value"] == str(tmp_path)


def test_sizes_and_counts_read_as_people_write_them():
    from kprecompile.wording import human_size, plural

    assert [human_size(size) for size in (0, 940, 243_400, 159_012_345, 2_500_000_000)] == [
        "0 B",
        "940 B",
        "243.4 kB",
        "159.0 MB",
        "2.5 GB",
    ]
    assert [plural(count, "configuration") for count in (1, 2, 1158)] == [
        "1 configuration",
        "2 configurations",
        "1,158 configurations",
    ]
    assert plural(2, "kernel entry", "kernel entries") == "2 kernel entries"


def _leaf_commands():
    """(path, command) of every command that runs (groups walked), as `kprecompile --help` lists them."""
    import click

    from kprecompile.cli import cli

    pending = [("", cli)]
    while pending:
        path, command = pending.pop()
        if isinstance(command, click.Group):
            context = click.Context(command)
            for name in command.list_commands(context):
                pending.append((f"{path} {name}".strip(), command.get_command(context, name)))
        else:
            yield path, command


def test_every_commands_help_ends_with_examples_that_parse(capsys):
    """Each command's `--help` shows examples, and each example is a real invocation: its
    arguments parse with that command's own options (a renamed option fails here)."""
    import shlex

    from kprecompile.cli.examples import EXAMPLES

    leaves = dict(_leaf_commands())
    assert sorted(leaves) == sorted(EXAMPLES)
    for path, command in leaves.items():
        status, out, _ = run_cli(capsys, *path.split(), "--help")
        assert status == 0 and "Examples:" in out, path
        for example in EXAMPLES[path]:
            assert f"    {example}\n" in out, (path, example)
            words = shlex.split(example)
            assert words[: 1 + len(path.split())] == ["kprecompile", *path.split()], example
            parse_command_line(command, path, words[1 + len(path.split()) :])  # raises on an unknown option
    # The control: an option the command does not take is refused by the same parse.
    import click

    with pytest.raises(click.NoSuchOption):
        leaves["cache prune"].make_context("cache prune", ["--max-bytes", "10G"])
    with pytest.raises(InputError, match="--max-num-seq"):  # and a command that takes a vllm serve line
        parse_command_line(leaves["warm"], "warm", ["--model", "deepseek-r1", "--max-num-seq", "8"])


def test_help_names_the_environment_variable_of_each_option_that_has_one(capsys):
    status, out, _ = run_cli(capsys, "warm", "--help")
    text = " ".join(out.split())
    assert status == 0 and "[env: KPRECOMPILE_CACHE_DIR;" in text and "[env: VLLM_ATTENTION_BACKEND;" in text


def test_printable_escapes_what_a_terminal_would_act_on_and_nothing_else():
    from kprecompile.wording import printable

    assert printable("deepseek-v2-lite") == "deepseek-v2-lite"  # negative control
    assert printable("/models/Llama 3 (8B)/é") == "/models/Llama 3 (8B)/é"
    assert printable("m\nkprecompile: forged") == "m\\nkprecompile: forged"
    assert printable("a\rb\tc\x1b[2Kd\x7f\u202ee\u2028") == "a\\rb\\tc\\x1b[2Kd\\x7f\\u202ee\\u2028"


def test_a_label_with_a_newline_is_one_progress_line_each_time():
    import io

    from kprecompile.progress import ProgressLines

    stream = io.StringIO()
    progress = ProgressLines(stream=stream, interval_seconds=3600)
    progress.start("/models/m\nkprecompile: all 95 kernels compiled on gfx942", 2, 0)
    progress.status("/models/m\rx", "tracing\nthe engine's calls")
    progress.advance(2)
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "kprecompile: /models/m\\nkprecompile: all 95 kernels compiled on gfx942: 2 kernels",
        "kprecompile: /models/m\\rx: tracing\\nthe engine's calls",
        "kprecompile: /models/m\\rx: 2/2 kernels (100%), 0 s",
    ]


def test_a_model_path_with_a_newline_is_one_escaped_error_line(tmp_path):
    """One line either way: InputError quotes its value with repr, and the CLI escapes the line."""
    from helpers import kprecompile_cli

    model = tmp_path / "m\nkprecompile: cache is warm"
    result = kprecompile_cli("verify", "--model", model, "--target", "gfx942")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "m\\nkprecompile: cache is warm" in result.stderr


def test_a_warning_naming_a_path_with_a_newline_is_one_line(tmp_path):
    """The CLI's log handler escapes each message (here the damaged journal's path)."""
    from helpers import kprecompile_cli

    root = tmp_path / "cache\nWARNING kprecompile: forged"
    journals = root / "journals-v1"
    journals.mkdir(parents=True)
    (journals / f"{'e' * 64}.jsonl").write_bytes(b"damaged\n")
    result = kprecompile_cli("misses", "--cache-dir", root)
    assert result.returncode == 0
    [line] = result.stderr.splitlines()
    assert line.startswith("WARNING kprecompile.cache.journal: journal ") and "cache\\nWARNING" in line


def _completions(*words: str) -> list[str]:
    """What bash completion offers after `kprecompile WORDS` (the last word being typed), through
    the installed console script as the shell calls it."""
    import shutil
    import subprocess

    environment = {
        **os.environ,
        "COMP_WORDS": " ".join(["kprecompile", *words]),
        "COMP_CWORD": str(len(words)),
        "_KPRECOMPILE_COMPLETE": "bash_complete",
    }
    script = shutil.which("kprecompile")
    result = subprocess.run([script], env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [line.split(",", 1)[1] for line in result.stdout.splitlines() if line.startswith("plain,")]


def test_the_shell_completes_commands_and_each_closed_set():
    from kprecompile.inputs.models import list_presets
    from kprecompile.inputs.targets import TARGETS

    assert _completions("ca") == ["cache"]
    assert _completions("warm", "--target", "gfx9") == [name for name in TARGETS if name.startswith("gfx9")]
    assert _completions("warm", "--target", "mi30") == ["mi300a", "mi300x"]
    assert _completions("bake", "--engine", "") == ["vllm-aiter", "vllm", "aiter"]
    assert _completions("plan", "--kv-cache-dtype", "fp") == ["fp8", "fp8_e4m3"]
    assert _completions("plan", "--model", "") == list_presets()
    assert "ROCM_AITER_TRITON_MLA" in _completions("warm", "--attention-backend", "rocm_aiter")
    assert _completions("warm", "--family", "mla_d") == ["mla_decode"]
    # The controls: an open value and a name in no set are offered nothing.
    assert _completions("warm", "--max-num-seqs", "") == []
    assert _completions("warm", "--target", "zz") == []
