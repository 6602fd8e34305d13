"""Helpers of the tests that run inside a real vLLM release (tests/in_vllm)."""

from __future__ import annotations

import contextlib
import os
import sys


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
    for name, module in list(sys.modules.items()):
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
