"""Isolation and shared state for the suite.

- Every cache variable (kprecompile's, Triton's, AITER's, HOME and XDG_CACHE_HOME) points into
  temporary directories for the whole session, and each test gets its own cache root; at the
  end of the session the real user's caches are compared with their state at the start, and a
  change fails the run.
- One small configuration is baked once per session, by the Dockerfile's own command line
  (DeepSeek-V2-Lite, 3 sequences, gfx942 and gfx950: FP8 BMM and MLA decode, real compiles);
  tests that need a warm cache get their own copy of it instead of warming from scratch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import CACHE_VARIABLES, UNSET_VARIABLES

from kprecompile.cache.layout import CacheLayout
from kprecompile.cache.signing import generate_key
from kprecompile.inputs.environment import VARIABLES
from kprecompile.inputs.targets import TARGETS

ROOT = Path(__file__).parent.parent
# Small stand-ins for the Dockerfile's build arguments: the command line is the Dockerfile's.
# (MODEL: the preset in place of the Hugging Face id `hf download` would fetch the config of.)
BUILD_ARGS = {
    "MODEL": "deepseek-v2-lite",
    "SERVE_ARGS": "--tensor-parallel-size 1 --max-num-seqs 3",
    "TARGETS": "--target gfx942 --target gfx950",
}
BUNDLE_PATH_IN_IMAGE = "/opt/kprecompile/bundle"


def _real_user_caches() -> list[Path]:
    import platformdirs

    home = Path.home()
    return [Path(platformdirs.user_cache_dir("kprecompile", appauthor=False)), home / ".triton", home / ".aiter"]


def _snapshot(paths: list[Path]) -> dict[str, tuple[int, int]]:
    state = {}
    for root in paths:
        for path in [root, *root.rglob("*")] if root.exists() else []:
            status = path.lstat()
            state[str(path)] = (status.st_size, status.st_mtime_ns)
    return state


@dataclass(frozen=True)
class Isolation:
    # The session's HOME, under which every cache variable points.
    home: Path
    # The real user's caches, as they were named before the session moved HOME.
    real_caches: tuple[Path, ...]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """A test on the session's bake (or a copy of it) really compiles kernels: the bake does."""
    for item in items:
        if "baked" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.compiles)


@pytest.fixture(scope="session", autouse=True)
def isolated_session(tmp_path_factory):
    """The whole session runs with its caches (and HOME) in a temporary directory; the real
    user's caches must be exactly as they were when it ends."""
    real = _real_user_caches()
    before = _snapshot(real)
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        for name, relative in CACHE_VARIABLES.items():
            patch.setenv(name, str((home / relative).resolve()))
        # And the engine's flags: tests set the ones they are about.
        for name in (*UNSET_VARIABLES, *(variable.name for variable in VARIABLES)):
            patch.delenv(name, raising=False)
        # The session's own signing key, which signs every archive the tests make and which import
        # trusts: tests of unsigned or foreign archives unset KPRECOMPILE_TRUSTED_KEYS or sign with
        # another key (the default, with no trusted key, refuses every archive).
        (home / "keys").mkdir(mode=0o700)
        key = generate_key(home / "keys" / "session-key", "kprecompile tests")
        patch.setenv("KPRECOMPILE_SIGNING_KEY", key.private_key_path)
        patch.setenv("KPRECOMPILE_TRUSTED_KEYS", key.public_key_path)
        yield Isolation(home, tuple(real))
    after = _snapshot(real)
    changed = sorted({path for path, _ in set(before.items()) ^ set(after.items())})
    assert not changed, (
        f"the real user caches changed during the run ({len(changed)} paths, first {changed[:3]}): a test "
        f"escaped the suite's isolation, or a process outside it (a kprecompile warm, vLLM or Triton in "
        f"another terminal) used {', '.join(map(str, real))} meanwhile; run the suite again with nothing else "
        f"using them, or with HOME and XDG_CACHE_HOME pointed at an empty directory"
    )


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch) -> Path:
    """Each test's default cache root (and Triton's) is its own."""
    root = tmp_path / "cache"
    monkeypatch.setenv("KPRECOMPILE_CACHE_DIR", str(root))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    if not os.environ.get("KPRECOMPILE_VLLM_RELEASE"):
        # An earlier test of this process may have set them (see UNSET_VARIABLES): compile workers
        # would serve a layer's kernel instead of compiling it, a server would log to nowhere.
        # (Inside a vLLM release the plugin's tests share what `register()` set, as a server does.)
        for name in UNSET_VARIABLES:
            monkeypatch.delenv(name, raising=False)
    return root


@pytest.fixture(autouse=True)
def tritons_own_key():
    """A preload in the test's process hands Triton its key for the rest of the process
    (`toolchain.give_triton_its_key`): the next test gets Triton's own function back."""
    yield
    import sys

    from kprecompile.inputs.toolchain import rebind_triton_key

    handed = getattr(sys.modules.get("triton.runtime.cache"), "triton_key", None)
    if hasattr(handed, "computing"):
        rebind_triton_key(handed, handed.computing)


@pytest.fixture
def cache_layout(isolated_cache) -> CacheLayout:
    """A private cache, the one the environment points at."""
    return CacheLayout.of(isolated_cache)


@pytest.fixture
def gfx942():
    return TARGETS["gfx942"]


@pytest.fixture
def gfx950():
    return TARGETS["gfx950"]


@pytest.fixture
def sm90():
    return TARGETS["sm90"]


def dockerfile_bake_command(out: Path) -> list[str]:
    text = (ROOT / "scripts" / "Dockerfile.example").read_text()
    [line] = [line for line in text.splitlines() if line.startswith("RUN kprecompile bake")]
    command = re.sub(r"\$\{(\w+)\}", lambda match: BUILD_ARGS[match.group(1)], line.removeprefix("RUN "))
    return [part if part != BUNDLE_PATH_IN_IMAGE else str(out) for part in shlex.split(command)]


@pytest.fixture(scope="session")
def baked(tmp_path_factory):
    """The Dockerfile's bake, once per session, through the CLI's entry point in this process
    (a subprocess would only import torch again): (bundle directory, archive, --json document)."""
    from kprecompile.cli import main

    out = tmp_path_factory.mktemp("image") / "bundle"
    archive = out.parent / "bundle.tgz"
    command = dockerfile_bake_command(out)
    assert command[:2] == ["kprecompile", "bake"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), pytest.raises(SystemExit) as exited:
        main([*command[1:], "--archive", str(archive), "--json"])
    assert exited.value.code == 0, stdout.getvalue()
    document = json.loads(stdout.getvalue())
    assert {c["target"] for c in document["configurations"]} == {"gfx942", "gfx950"}
    return out, archive, document


def copy_cache(source: Path, destination: Path) -> Path:
    """A writable copy of a cache, its group files pointed at the copy (Triton's own cache
    manager opens an entry's files by the absolute path its group file records)."""
    shutil.copytree(source, destination)
    for group in destination.glob("triton-v1/*/__grp__*.json"):
        group.write_text(group.read_text().replace(str(source), str(destination)))
    (destination / "bundle.json").unlink(missing_ok=True)
    (destination / "bundle.sig").unlink(missing_ok=True)
    return destination


@pytest.fixture
def warm_copy(baked, tmp_path) -> CacheLayout:
    """A private, writable copy of the session's baked cache."""
    out, _, _ = baked
    return CacheLayout.of(copy_cache(out, tmp_path / "warm"))
