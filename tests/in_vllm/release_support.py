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
