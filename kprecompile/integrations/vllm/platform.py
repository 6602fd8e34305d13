"""Make the installed vLLM see a target's platform on a machine without that GPU.

vLLM decides per platform: its ROCm platform's attention-backend selector, its config defaults,
its FP8 range. To ask the real code what it would do on an MI300X from a CPU builder (or a test),
`rocm_platform(target)` imports vLLM's ROCm platform under torch device queries that describe
the target (the same stand-in the tracer uses, plus the CUDA-availability queries vLLM makes)
and makes it vLLM's current platform for the rest of the process. vLLM modules bind
`current_platform` at import: use this in a process that has not imported them yet.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ...driver import device_model
from ...errors import InputError
from ...targets import Target


@contextlib.contextmanager
def rocm_platform(target: Target) -> Iterator[Any]:
    """vLLM's ROCm platform for `target`, current for vLLM; torch's device queries describe the
    target inside the block."""
    import torch

    if not target.is_rocm:
        raise InputError("--target", target.name, "a ROCm target for vLLM's ROCm platform")
    import vllm.platforms as platforms

    major, minor = int(target.arch[3]), int(target.arch[4])
    queries = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "get_device_capability": lambda device=None: (major, minor),
        "get_device_name": lambda device=None: target.description,
    }
    saved = {name: getattr(torch.cuda, name) for name in queries}
    for name, answer in queries.items():
        setattr(torch.cuda, name, answer)
    try:
        with device_model(target):
            # The module asks the device its arch at import (and caches it): import it here.
            sys.modules.pop("vllm.platforms.rocm", None)
            from vllm.platforms.rocm import RocmPlatform

            platforms._current_platform = RocmPlatform()
            yield platforms._current_platform
    finally:
        for name, answer in saved.items():
            setattr(torch.cuda, name, answer)


_TARGET_MARK = "_kprecompile_target"


def use_target_platform(target: Target) -> None:
    """Make the target's stand-in platform vLLM's current one, for vLLM kernel modules imported
    next (tracing and compile workers, which import them per target): they read its FP8 type and
    range and its arch checks at import. Also makes sure vLLM's `triton_utils` hold the real
    Triton (see `_real_triton`). Does nothing when it already is."""
    import vllm.platforms as platforms

    _real_triton(target)
    if getattr(platforms._current_platform, _TARGET_MARK, None) == target.name:
        return
    with rocm_platform(target) as platform:
        setattr(platform, _TARGET_MARK, target.name)


def _real_triton(target: Target) -> None:
    """vLLM swaps Triton for a placeholder module when its import finds no active GPU driver
    (`vllm/triton_utils/importing.py`), as on a CPU builder: kernels would then be stubs, and
    nothing would be traced. Import `vllm.triton_utils` while Triton's backend for the target
    reports the only active driver, as on the target's GPU host; the check has no other effect."""
    module = sys.modules.get("vllm.triton_utils.importing")
    if module is not None and module.HAS_TRITON:
        return
    from triton.backends import backends

    for name in [name for name in sys.modules if name == "vllm.triton_utils" or name.startswith("vllm.triton_utils.")]:
        del sys.modules[name]
    wanted = "amd" if target.is_rocm else "nvidia"
    saved = {name: backend.driver.__dict__["is_active"] for name, backend in backends.items() if backend.driver}
    for name, backend in backends.items():
        if backend.driver:
            backend.driver.is_active = staticmethod(lambda active=name == wanted: active)
    try:
        import vllm.triton_utils  # noqa: F401
    finally:
        for name, is_active in saved.items():
            backends[name].driver.is_active = is_active  # the staticmethod itself


@contextlib.contextmanager
def target_imports(target: Target) -> Iterator[None]:
    """vLLM modules imported in the block are imported as on the target's GPU host: under its
    platform (`use_target_platform`), and, where ROCm's flash-attn build is not installed (a CPU
    builder), with a `flash_attn` module that vLLM's ROCm attention modules import at import
    time for functions the Triton backends never call; called, it says so. It is gone after the
    block, so nothing else finds it."""
    import importlib.machinery
    import importlib.util
    import types

    use_target_platform(target)
    if "flash_attn" in sys.modules or importlib.util.find_spec("flash_attn") is not None:
        yield
        return

    def flash_attn_varlen_func(*args: object, **kwargs: object) -> None:
        raise RuntimeError("flash-attn is not installed here; kprecompile traces vLLM's Triton kernels only")

    module = types.ModuleType("flash_attn")
    # No distribution behind it: libraries that ask for flash-attn's version find none.
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    module.flash_attn_varlen_func = flash_attn_varlen_func
    sys.modules["flash_attn"] = module
    try:
        yield
    finally:
        sys.modules.pop("flash_attn", None)
