"""The AITER a release's ROCm image builds, installed beside the release from a git clone
(`kprecompile engine install vllm==X --aiter-source CLONE`): a real git repository holding the
installed amd-aiter's package, its commit taken into a release's directory and found first there;
what a wrong clone, ref or archive gets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import util
from pathlib import Path

import pytest
from helpers import kprecompile_cli

from kprecompile.errors import InputError, KprecompileError
from kprecompile.vllm import aiter_source
from kprecompile.vllm.aiter_source import AITER_PINS, aiter_identity, install_aiter, resolve_commit
from kprecompile.vllm.releases import TESTED_RELEASES

TAG = "v0.1.7.post2.dev18"
GIT = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def _git(repository: Path, *arguments: str) -> str:
    environment = {**os.environ, **GIT, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    environment["GIT_COMMITTER_EMAIL"] = "t@t"
    result = subprocess.run(["git", "-C", str(repository), *arguments], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A git repository whose tagged commit holds the installed amd-aiter's Python package, as
    AITER's own repository holds it (`aiter/` at the top), beside files that are not the package."""
    repository = tmp_path_factory.mktemp("aiter-clone")
    shutil.copytree(Path(util.find_spec("aiter").submodule_search_locations[0]), repository / "aiter")
    (repository / "setup.py").write_text("raise SystemExit('never run')\n")
    _git(repository, "init", "-q")
    _git(repository, "add", "-A")
    _git(repository, "commit", "-q", "-m", "aiter")
    _git(repository, "tag", TAG)
    return repository


def test_every_tested_release_has_its_images_aiter_pin():
    assert set(TESTED_RELEASES) <= set(AITER_PINS)
    assert all(pin.startswith("v0.") or len(pin) >= 8 for pin in AITER_PINS.values())


def test_a_tag_of_the_clone_is_installed_into_the_release_and_found_first_there(clone, tmp_path):
    release = tmp_path / "0.25.1"
    release.mkdir()
    commit = _git(clone, "rev-parse", "HEAD")
    identity = install_aiter(clone, TAG, release)
    assert (identity.version, identity.commit, identity.requested) == ("0.1.7.post2.dev18", commit, TAG)
    # Only the package: nothing else of the clone, no staging left behind.
    assert sorted(path.name for path in release.iterdir()) == ["aiter", "amd_aiter-0.1.7.post2.dev18.dist-info"]
    found = aiter_identity("0.25.1", release)
    assert (found.commit, found.release_pin, found.matches_pin) == (commit, "v0.1.16.post2", False)
    # A process with the release first on its path imports this AITER and reports it.
    probe = (
        "import importlib.util, importlib.metadata as m;"
        "print(importlib.util.find_spec('aiter').origin, m.version('amd-aiter'))"
    )
    environment = {**os.environ, "PYTHONPATH": str(release)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=environment)
    origin, version = result.stdout.split()
    assert origin == str(release / "aiter" / "__init__.py") and version == "0.1.7.post2.dev18", result.stderr
    # Its pin, named by the release (here the test's tag stands for it), is the release's own.
    assert aiter_source.AiterIdentity("0.1.7.post2.dev18", commit, TAG, TAG).matches_pin
    # Installed again from a commit with no tag: it replaces the first, named by its commit.
    (clone / "aiter" / "extra.py").write_text("")
    _git(clone, "add", "-A")
    _git(clone, "commit", "-q", "-m", "untagged")
    second = _git(clone, "rev-parse", "HEAD")
    try:
        again = install_aiter(clone, second[:10], release)
    finally:
        _git(clone, "reset", "-q", "--hard", TAG)
    assert again.version == f"0+g{second[:12]}" and (release / "aiter" / "extra.py").is_file()
    assert [path.name for path in release.glob("amd_aiter-*")] == [f"amd_aiter-0+g{second[:12]}.dist-info"]


def test_a_wrong_clone_or_ref_is_one_line_and_writes_nothing(clone, tmp_path):
    release = tmp_path / "release"
    release.mkdir()
    with pytest.raises(
        InputError, match=r"--aiter-source: got '.*', expected a git clone of https://github.com/ROCm/aiter"
    ):
        install_aiter(tmp_path, TAG, release)
    with pytest.raises(InputError, match=r"--aiter-source: got '.*nowhere', expected a directory"):
        install_aiter(tmp_path / "nowhere", TAG, release)
    with pytest.raises(InputError, match=r"--aiter-ref: got 'v9.9.9', expected a tag or commit of the clone"):
        install_aiter(clone, "v9.9.9", release)
    assert resolve_commit(clone, TAG) == _git(clone, "rev-parse", "HEAD")
    assert list(release.iterdir()) == []


def test_what_the_archive_names_outside_the_package_is_not_written(tmp_path):
    """A commit whose `aiter/` holds a link out of it, and files beside the package: only the
    package's regular files are written; a package bigger than the bound is refused, nothing written."""
    repository = tmp_path / "hostile"
    (repository / "aiter").mkdir(parents=True)
    (repository / "aiter" / "__init__.py").write_text("")
    (repository / "aiter" / "escape").symlink_to("/etc/passwd")
    (repository / "aiter" / "big.bin").write_bytes(b"\0" * 4096)
    (repository / "outside.py").write_text("")
    _git(repository, "init", "-q")
    _git(repository, "add", "-A")
    _git(repository, "commit", "-q", "-m", "hostile")
    release = tmp_path / "release"
    release.mkdir()
    install_aiter(repository, "HEAD", release)
    assert sorted(path.name for path in (release / "aiter").iterdir()) == ["__init__.py", "big.bin"]
    assert not (release / "outside.py").exists()
    bounded = tmp_path / "bounded"
    bounded.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(aiter_source, "MAX_PACKAGE_BYTES", 1024)
        with pytest.raises(KprecompileError, match="unpacks to more than"):
            install_aiter(repository, "HEAD", bounded)
    assert list(bounded.iterdir()) == []


def test_engine_install_checks_the_clone_before_installing_anything(clone, tmp_path):
    engines = {"KPRECOMPILE_ENGINES_DIR": str(tmp_path / "engines")}
    cases = [
        (("--aiter-ref", TAG), "--aiter-ref: got 'v0.1.7.post2.dev18', expected --aiter-source too"),
        (("--aiter-source", str(tmp_path)), "--aiter-source: got"),
        (("--aiter-source", str(clone)), "--aiter-ref: got '59bd8ff2', expected a tag or commit of the clone"),
    ]
    for arguments, expected in cases:
        result = kprecompile_cli("engine", "install", "vllm==0.12.0", *arguments, env=engines)
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert expected in line, line
    assert not (tmp_path / "engines").exists()
    # The plan says which AITER it imports, against the release's pin.
    planned = kprecompile_cli(
        "plan", "--model", "deepseek-r1", "--target", "gfx942", "--vllm-version", "0.12.0", "--json", env=engines
    )
    document = json.loads(planned.stdout)
    assert document["aiter"]["release_pin"] == "59bd8ff2" and document["aiter"]["version"], planned.stderr
    assert document["aiter"]["matches_pin"] is None  # the index's AITER: its commit is not recorded


def test_aiters_hip_side_is_a_missing_module_once_its_triton_side_is_imported_without_rocm():
    """AITER's Triton package imports its JIT core on the way from about v0.1.10 (v0.1.16: its
    quant kernels -> `aiter.utility.dtypes` -> `aiter.ops.enum` -> `aiter.jit.core`), which asks the
    ROCm install for its version: on a builder that is a missing module, which AITER's own
    optional imports take in their stride, not RuntimeError. The real installed AITER, in a fresh
    process each; without kprecompile's import, the same module stops with RuntimeError."""
    probe = (
        "import sys\n"
        "if sys.argv[1] == 'kprecompile':\n"
        "    from kprecompile.tracing.libraries import import_library_module\n"
        "    import_library_module('aiter.ops.triton')\n"
        "else:\n"
        "    import importlib.util, types\n"
        "    spec = importlib.util.find_spec('aiter')\n"
        "    package = types.ModuleType('aiter'); package.__path__ = list(spec.submodule_search_locations)\n"
        "    sys.modules['aiter'] = package\n"
        "try:\n"
        "    import aiter.jit.core\n"
        "except BaseException as error:\n"
        "    print(type(error).__name__)\n"
    )
    answers = {}
    for how in ("kprecompile", "plain"):
        result = subprocess.run([sys.executable, "-c", probe, how], capture_output=True, text=True)
        answers[how] = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    assert answers == {"kprecompile": "ImportError", "plain": "RuntimeError"}, answers
