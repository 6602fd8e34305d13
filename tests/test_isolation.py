"""The suite never touches the user's caches: every cache variable points into temporary
directories (conftest.py), and what a command writes by default lands there.

conftest.py's session fixture also compares the real user caches before and after the whole
run and fails it if anything changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import CACHE_VARIABLES, UNSET_VARIABLES

from kprecompile.inputs import settings


def test_every_cache_variable_points_into_temporary_directories(isolated_session, isolated_cache, tmp_path):
    for name in CACHE_VARIABLES:
        path = Path(os.environ[name])
        assert path.is_relative_to(isolated_session.home) or path.is_relative_to(tmp_path), name
        assert not any(path.is_relative_to(real) for real in isolated_session.real_caches), name
    for name in UNSET_VARIABLES:
        assert name not in os.environ
    assert settings.cache_layout().root == isolated_cache


def test_a_command_without_cache_options_writes_only_under_the_temporary_cache(isolated_cache, isolated_session):
    before = {path for path in isolated_session.home.rglob("*")}
    # DeepSeek-R1 on an H100/H200 compiles nothing (vLLM's prebuilt FlashAttention-3 MLA): no torch
    # import, but warm records the configuration and remembers Triton's key.
    result = subprocess.run(
        [sys.executable, "-m", "kprecompile", "warm", "--model", "deepseek-r1", "--target", "sm90"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "cache: " + str(isolated_cache) in result.stdout
    assert list(isolated_cache.glob("toolchain-v1/*.json")) and list(isolated_cache.glob("manifests-v*/*.json"))
    assert {path for path in isolated_session.home.rglob("*")} == before
