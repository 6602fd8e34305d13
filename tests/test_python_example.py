"""The reference's Python example, saved as a script and run as a user would: it warms; without
its `__main__` guard, each compile worker stops at once with one line, and the script fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kprecompile.cache.inventory import configurations
from kprecompile.cache.layout import CacheLayout

ROOT = Path(__file__).parent.parent
GUARD = 'if __name__ == "__main__":'

# The example itself is in the fast subset, so that tests/test_tritons.py runs it under every
# supported Triton (a newcomer's `.[builder]` install resolves the newest).
pytestmark = [pytest.mark.compiles]


def example() -> str:
    reference = (ROOT / "docs" / "reference.md").read_text()
    section = reference[reference.index("## Python\n") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def run_script(path: Path, cache: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "KPRECOMPILE_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, str(path)], cwd=path.parent, env=environment, capture_output=True, text=True, timeout=900
    )


def test_the_python_example_runs_as_a_script(tmp_path):
    script = tmp_path / "warm_r1.py"
    script.write_text(example())
    result = run_script(script, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    planned = int(re.search(r"(\d+) kernels planned", result.stdout).group(1))
    compiled = int(re.search(r"(\d+) compiled, 0 cached", result.stdout).group(1))
    assert planned == compiled > 0
    [configuration] = configurations(CacheLayout.of(tmp_path / "cache"))
    assert configuration.model_name == "deepseek-r1" and len(configuration.entries) == planned


@pytest.mark.slow
def test_without_its_main_guard_each_worker_says_so_and_the_script_fails(tmp_path):
    text = example()
    assert GUARD in text
    unguarded = text[: text.index(GUARD)] + "main()\n"
    script = tmp_path / "warm_r1.py"
    script.write_text(unguarded)
    result = run_script(script, tmp_path / "cache")
    assert result.returncode == 1, result.stdout + result.stderr
    said = f"kprecompile: this compile worker re-imported {script}, which calls kprecompile.warm again: call it under"
    worker_lines = [line for line in result.stderr.splitlines() if line.startswith("kprecompile:")]
    assert worker_lines and all(line.startswith(said) for line in worker_lines), result.stderr
    assert "Traceback" not in result.stderr and "bootstrapping phase" not in result.stderr
    # Each failure the script printed says what to do.
    assert f"if {script} calls kprecompile.warm outside `{GUARD}`" in result.stdout
    assert not any(CacheLayout.of(tmp_path / "cache").root.glob("manifests-*/**/*.json"))
