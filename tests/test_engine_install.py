"""`kprecompile engine install vllm==X` and `--vllm-version X` on a builder without vLLM: the
release's Python (with its Triton) from the engines directory, put first on the path of the
command and of its subprocesses; and what a builder without it gets (one line, exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from helpers import kprecompile_cli
from vllm_releases import release_path

RELEASE = "0.12.0"
PLAN = ["plan", "--model", "llama-3.1-8b-instruct", "--target", "gfx942", "--max-num-seqs", "2"]
PLAN += ["--max-model-len", "1024", "--vllm-version", RELEASE, "--family", "aiter_fa_context", "--json"]


def _run(*arguments: str, engines: Path, cache: Path) -> subprocess.CompletedProcess:
    """The CLI in a process of its own (the engine goes on that process's path), without vLLM."""
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    environment.update(KPRECOMPILE_ENGINES_DIR=str(engines), KPRECOMPILE_CACHE_DIR=str(cache))
    return subprocess.run(
        [sys.executable, "-m", "kprecompile", *arguments], capture_output=True, text=True, env=environment, timeout=900
    )


@pytest.mark.parametrize(
    "requirement, expected",
    [
        ("sglang==0.4.0", "expected vllm==X.Y.Z"),
        ("vllm", "expected vllm==X.Y.Z"),
        ("vllm>=0.12", "expected vllm==X.Y.Z"),
        ("vllm==0.12", "expected vllm==X.Y.Z"),
        ("vllm==0.10.1", "expected a vLLM release, 0.11.2 or newer"),
    ],
)
def test_engine_install_refuses_what_it_cannot_install_in_one_line_writing_nothing(requirement, expected, tmp_path):
    result = kprecompile_cli("engine", "install", requirement, env={"KPRECOMPILE_ENGINES_DIR": str(tmp_path / "e")})
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"kprecompile: REQUIREMENT: got '{requirement}'") and expected in line, line
    assert not (tmp_path / "e").exists()


@pytest.mark.slow
@pytest.mark.vllm
def test_a_release_from_engine_install_is_planned_with_its_own_code_and_triton(tmp_path):
    """The tests' install of 0.12.0 (the function `engine install` runs) in the engines
    directory: `engine install` finds it, `engine ls` lists it,
    and `plan --vllm-version 0.12.0` traces vLLM's own kernels from it. Without it, the same plan
    fails in one line naming the command that installs it."""
    engines, cache = tmp_path / "engines", tmp_path / "cache"
    (engines / "vllm").mkdir(parents=True)
    (engines / "vllm" / RELEASE).symlink_to(release_path(RELEASE))
    found = _run("engine", "install", f"vllm=={RELEASE}", "--json", engines=engines, cache=cache)
    assert found.returncode == 0, found.stderr
    # Plans with it run under the Triton its torch pins, 3.5.0, installed beside it, and the
    # index's AITER (the release's ROCm image builds 59bd8ff2; the index's commit is not recorded).
    aiter = {"version": metadata.version("amd-aiter"), "commit": None, "requested": None}
    assert json.loads(found.stdout) == {
        "schema_version": 1,
        "engine": "vllm",
        "version": RELEASE,
        "path": str(engines / "vllm" / RELEASE),
        "installed": False,
        "triton": "3.5.0",
        "triton_pinned": "3.5.0",
        "aiter": {**aiter, "release_pin": "59bd8ff2", "matches_pin": None},
    }
    listed = _run("engine", "ls", "--json", engines=engines, cache=cache)
    assert [row["version"] for row in json.loads(listed.stdout)["engines"]] == [RELEASE], listed.stderr
    planned = _run(*PLAN, engines=engines, cache=cache)
    assert planned.returncode == 0, planned.stderr[-3000:]
    document = json.loads(planned.stdout)
    [family] = [family for family in document["families"] if family["family"] == "aiter_fa_context"]
    assert family["kernels"] > 0 and document["engine"]["vllm_release"] == RELEASE, family
    # Negative control: no engine here, the same plan fails naming what installs it.
    (engines / "vllm" / RELEASE).unlink()
    missing = _run(*PLAN, engines=engines, cache=cache)
    assert missing.returncode == 1
    assert f"kprecompile engine install vllm=={RELEASE}" in missing.stderr, missing.stderr


def test_an_engines_directory_others_can_write_is_refused(tmp_path):
    from kprecompile.errors import InputError
    from kprecompile.vllm.install import use_engine

    root = tmp_path / "engines"
    release = root / "vllm" / RELEASE
    (release / "vllm").mkdir(parents=True)
    (release / "vllm" / "__init__.py").write_text("")
    (root / "vllm").chmod(0o777)
    saved = list(sys.path), os.environ.get("PYTHONPATH")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("KPRECOMPILE_ENGINES_DIR", str(root))
            with pytest.raises(InputError, match="engine directory.*only its owner can write"):
                use_engine(RELEASE)
            assert sys.path == saved[0]
            (root / "vllm").chmod(0o755)
            assert use_engine("0.33.0") is None  # not installed there
            assert use_engine(RELEASE) == release and sys.path[0] == str(release)
    finally:
        sys.path[:] = saved[0]
        if saved[1] is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved[1]
