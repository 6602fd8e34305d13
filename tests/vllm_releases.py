"""The real vLLM releases the tests run against, each installed beside this environment
(scripts/install_vllm.py: the wheel with --no-deps and the light packages it imports, torch stays
this CPU build) and used through PYTHONPATH in a process of its own."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from kprecompile.errors import KprecompileError
from kprecompile.vllm.releases import TESTED_RELEASES

# The releases the tests inside vLLM run against: the tested ones, or those KPRECOMPILE_TEST_RELEASES
# names (comma-separated: scripts/release_matrix.py runs them for any release).
NAMED_RELEASES = tuple(
    release.strip() for release in os.environ.get("KPRECOMPILE_TEST_RELEASES", "").split(",") if release.strip()
)
SUPPORTED_RELEASES = NAMED_RELEASES or TESTED_RELEASES

ROOT = Path(__file__).parent.parent

__all__ = [
    "NAMED_RELEASES",
    "SUPPORTED_RELEASES",
    "installer",
    "merges_per_launch",
    "release_path",
    "since",
    "vllm_environment",
]


def since(release: str, first: str) -> bool:
    """Whether `release` is `first` or newer: for what the tests assert of vLLM's own code that
    no release line's rule covers (a line's rule is read from its record instead)."""
    from packaging.version import Version

    return Version(release) >= Version(first)


def merges_per_launch(release: str, budget: int, continuation: bool = False) -> int:
    """Merge kernels one launch of vLLM's Triton merge stands for in a plan (read in each wheel's
    `triton_merge_attn_states.py`). 0.20 to 0.26 take the count of tokens with context as a
    constexpr, so a server compiles one per count up to the token budget (max-num-batched-tokens).
    From 0.27 the count and the log-sum-exp head strides are ordinary integers, which Triton
    specializes by class (1, other, a multiple of 16, where the budget reaches it): the count and
    the tied head strides of contiguous log-sum-exps, each in every class; an MLA prefill's
    `continuation` merge (from 0.28: a chunk that starts inside a sequence's context) also slices its
    running log-sum-exp at a token, a head stride of its own and an address aligned or not."""
    if not since(release, "0.20"):
        return 1
    if not since(release, "0.27"):
        return budget
    classes = len([value for value in (1, 2, 16) if value <= budget])
    return classes**2 * (classes * 2 if continuation else 1)


def installer():
    """scripts/install_vllm.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("install_vllm", ROOT / "scripts" / "install_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def release_path(version: str) -> Path:
    """The release's directory, installed on first use (CI's .ci/run installs them first)."""
    script = installer()
    try:
        return script.install(version)
    except KprecompileError as error:
        pytest.skip(f"vLLM {version} could not be installed here ({error}); run scripts/install_vllm.py")


def vllm_environment(version: str, cache: Path) -> dict[str, str]:
    """A server's environment: the release on the path, no GPU, AITER on, the cache named, and
    AITER's JIT directory left for the plugin to set."""
    environment = {name: value for name, value in os.environ.items() if name != "AITER_JIT_DIR"}
    return {
        **environment,
        "PYTHONPATH": str(release_path(version)),
        "CUDA_VISIBLE_DEVICES": "",
        "KPRECOMPILE_CACHE_DIR": str(cache),
        "VLLM_ROCM_USE_AITER": "1",
    }
