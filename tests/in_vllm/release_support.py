"""Helpers of the tests that run inside a real vLLM release (tests/in_vllm)."""

from __future__ import annotations

import contextlib
import os
import sys

import pytest


@contextlib.contextmanager
def environment(**variables: str):
    """The process environment with `variables` set, for the block."""
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def bind_platform() -> None:
    """A server's vLLM modules hold its platform from import on. Here some were imported before the
    stand-in (the runner, by the plugin: under the ROCm platform its import needs ROCm's flash-attn
    build): give them the stand-in, as the server's would have the real one."""
    import vllm.platforms as platforms

    platform = platforms._current_platform
    for name, module in sys.modules.copy().items():
        if name.startswith("vllm.") and module is not None and hasattr(module, "current_platform"):
            if module.current_platform is not platform:
                module.current_platform = platform


def kv_storage_classes() -> int:
    """The KV-cache size classes that give a ROCm kernel a specialization of its own: under and
    over 2 GiB where Triton emits AMD buffer ops (which address 2 GiB at most; on by default
    from Triton 3.6), one class otherwise (Triton 3.5, the own Triton of vLLM 0.11 to 0.13)."""
    from triton import knobs

    return 2 if knobs.amd.use_buffer_ops else 1


def load_plugins_on(target) -> None:
    """vLLM's `load_general_plugins()`, as in a server on `target`. 0.13 to 0.16 import AITER with
    vLLM's layers (the plugin's hooks import them) wherever it is installed, and read its FP8 type
    from the GPU at import: there the builder's AITER (its Triton side, its HIP side absent) under
    the target's driver. A ROCm server has its own AITER; an NVIDIA one has none."""
    from vllm.plugins import load_general_plugins
    from vllm_releases import since

    from kprecompile.platforms.triton_driver import active_target
    from kprecompile.tracing.libraries import aiter_hip_absent, installed_aiter_without_hip
    from kprecompile.vllm.releases import installed_release

    release = installed_release()
    if not (since(release, "0.13") and not since(release, "0.17")):
        load_general_plugins()
        return
    installed_aiter_without_hip()
    with active_target(target), aiter_hip_absent():
        load_general_plugins()


def aiter_lacked_by(module: str) -> str | None:
    """The AITER module that vLLM's `module` imports at its top level (a ROCm server's import) and
    the installed AITER has no file for, or None: read from the two packages' files, nothing
    imported. vLLM 0.31's ROCM_AITER_FA imports AITER's Gluon paged decode, which the registry's
    amd-aiter predates; a ROCm server runs the AITER its image pins, which has it."""
    import ast
    import importlib.util
    from pathlib import Path

    # The module's file from its top-level package's directory: `find_spec` of a submodule would
    # import its parents (vLLM's configure its logging on the stdout of the moment).
    top, *rest = module.split(".")
    [directory] = importlib.util.find_spec(top).submodule_search_locations
    path = Path(directory, *rest)
    source = (path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py").read_text()
    aiter = importlib.util.find_spec("aiter")
    if aiter is None:
        return None
    roots = [Path(location) for location in aiter.submodule_search_locations]

    def top_level(statements):
        for statement in statements:
            if isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0:
                yield statement.module
            elif isinstance(statement, ast.Import):
                yield from (alias.name for alias in statement.names)
            elif isinstance(statement, (ast.If, ast.Try)):
                yield from top_level(statement.body)
                yield from top_level(getattr(statement, "orelse", []))

    for name in top_level(ast.parse(source).body):
        if not name.startswith("aiter."):
            continue
        parts = name.split(".")[1:]
        if not any(
            (root.joinpath(*parts).with_suffix(".py")).is_file() or root.joinpath(*parts).is_dir() for root in roots
        ):
            return name
    return None


def skip_where_aiter_lacks(module: str) -> None:
    """Skip the calling test where the installed AITER lacks what vLLM's `module` imports at its
    top level (`aiter_lacked_by`): a ROCm server of the release imports it from the AITER its image
    builds, so the test needs that AITER (`scripts/install_vllm.py --aiter-source CLONE`)."""
    lacking = aiter_lacked_by(module)
    if lacking is not None:
        from kprecompile.vllm.aiter_source import aiter_pin
        from kprecompile.vllm.releases import installed_release

        release = installed_release()
        pytest.skip(
            f"vLLM {release}'s {module.rpartition('.')[2]} imports {lacking}, which the installed AITER lacks; "
            f"its ROCm servers run AITER {aiter_pin(release)} (scripts/install_vllm.py --aiter-source CLONE)"
        )


def empty_context_masks(release: str, max_num_seqs: int, budget: int, several_chunks: bool) -> int:
    """Kernels of vLLM's Triton mask of empty context chunks in an MLA plan (0.26 and 0.27 only:
    `mask_empty_context` in `vllm/v1/attention/ops/triton_merge_attn_states.py`, called by
    `mla_attention.py` on every platform; read in the 0.25.1, 0.26.0, 0.27.0, 0.27.1 and 0.28.0
    wheels). Triton specializes its count of prefills (2 or more: other; 16 where max-num-seqs and
    the budget of two tokens a prefill reach it) and its log-sum-exp head stride, the prefill
    tokens (other; a multiple of 16), by class; and where a context takes several chunks of the
    workspace, a later chunk's row of context offsets is 16-byte aligned or not."""
    from vllm_releases import since

    if not since(release, "0.26") or since(release, "0.28"):
        return 0
    # Two prefills: 4 tokens (other) or 16; sixteen: 33 (other) or 32.
    pairs = 2 + (max_num_seqs >= 16) * ((budget >= 32) + (budget >= 33))
    return pairs * (2 if several_chunks else 1)
