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
import functools
import os
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
    _quiet_logging()
    _real_triton(target)
    import vllm.platforms as platforms

    if getattr(platforms._current_platform, _TARGET_MARK, None) == target.name:
        return
    with rocm_platform(target) as platform:
        setattr(platform, _TARGET_MARK, target.name)


def _quiet_logging() -> None:
    """kprecompile's stdout carries its data (`--json`); vLLM logs to stdout, and on a builder
    without a GPU it warns about every GPU extension it cannot load. Before vLLM configures its
    logging in a kprecompile process: to stderr, critical messages only, unless the user chose otherwise
    (these variables are vLLM's own)."""
    if "vllm.logger" in sys.modules:
        return
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "CRITICAL")


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
    platform (`use_target_platform`) and its device queries (vLLM asks the device capability at
    import), and, where ROCm's flash-attn build is not installed (a CPU builder), with a
    `flash_attn` module that vLLM's ROCm attention modules import at import time for functions
    the Triton backends never call; called, it says so. It is gone after the block, so nothing
    else finds it."""
    import importlib.util

    with device_model(target):
        use_target_platform(target)
        if "flash_attn" in sys.modules or importlib.util.find_spec("flash_attn") is not None:
            yield
            return
        with _flash_attn_module():
            yield


@contextlib.contextmanager
def _flash_attn_module() -> Iterator[None]:
    """`flash_attn` for the block (see `target_imports`)."""
    import importlib.machinery
    import types

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


def refresh_switches() -> None:
    """vLLM's switches as the environment sets them now. Its AITER switches (`rocm_aiter_ops`'
    class attributes) are read from the environment when `vllm._aiter_ops` is imported, and that
    module registers torch operators, so it is imported once: read them again, with vLLM's own
    `refresh_env_variables` where the release has it, else the same assignments its class body
    makes."""
    import vllm.platforms.rocm as rocm
    from vllm._aiter_ops import rocm_aiter_ops

    # The platform's rules that read them are memoized (`use_rocm_custom_paged_attention`).
    for value in vars(rocm).values():
        if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", None) == rocm.__name__:
            value.cache_clear()
    refresh = getattr(rocm_aiter_ops, "refresh_env_variables", None)
    if refresh is not None:
        refresh()
        return
    import vllm.envs as envs

    for attribute, variable in _switch_assignments(rocm_aiter_ops):
        setattr(rocm_aiter_ops, attribute, getattr(envs, variable))


@functools.cache
def _switch_assignments(cls: type) -> tuple[tuple[str, str], ...]:
    """`_NAME = envs.VARIABLE` lines of the class body."""
    import inspect
    import re

    return tuple(re.findall(r"^\s+(_\w+) = envs\.(\w+)\s*$", inspect.getsource(cls), re.MULTILINE))
