"""Make the installed vLLM see a target's platform on a machine without that GPU.

vLLM decides per platform: its ROCm platform's attention-backend selector, its config defaults,
its FP8 range. To ask the real code what it would do on an MI300X from a CPU builder (or a test),
`rocm_platform(target)` imports vLLM's ROCm platform under torch device queries that describe
the target (the same stand-in the tracer uses, plus the CUDA-availability queries vLLM makes)
and makes it vLLM's current platform for the rest of the process; `cuda_platform(target)` does
the same with vLLM's CUDA platform for an NVIDIA target. vLLM modules bind `current_platform` at
import: use this in a process that has not imported them yet.

vLLM's CUDA platform module imports vLLM's compiled extension (`vllm._C`) to register its
operators, and fails where it cannot be loaded: on a builder (no CUDA runtime) and wherever only
vLLM's Python files are installed. ROCm's platform module tolerates the same failure with a
warning; `cuda_platform` imports the CUDA one the same way (`_without_extensions`): an extension
that cannot be loaded stays absent, its operators registered nowhere, so a call to one fails as
it would. vLLM's Triton kernels never call them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

from ..errors import InputError
from ..inputs.targets import Target
from .triton_driver import device_model, device_properties


@contextlib.contextmanager
def _device_queries(target: Target) -> Iterator[None]:
    """torch's device queries (availability, count, capability, name, properties) describe the
    target inside the block."""
    import torch

    major, minor = device_properties(target).major, device_properties(target).minor
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
            yield
    finally:
        for name, answer in saved.items():
            setattr(torch.cuda, name, answer)


@contextlib.contextmanager
def rocm_platform(target: Target) -> Iterator[Any]:
    """vLLM's ROCm platform for `target`, current for vLLM; torch's device queries describe the
    target inside the block."""
    if not target.is_rocm:
        raise InputError("--target", target.name, "a ROCm target for vLLM's ROCm platform")
    _vllm_package()
    import vllm.platforms as platforms

    with _device_queries(target):
        # The module asks the device its arch at import (and caches it): import it here.
        sys.modules.pop("vllm.platforms.rocm", None)
        from vllm.platforms.rocm import RocmPlatform

        platforms._current_platform = RocmPlatform()
        yield platforms._current_platform


@contextlib.contextmanager
def cuda_platform(target: Target) -> Iterator[Any]:
    """vLLM's CUDA platform for `target` (an NVIDIA one), current for vLLM; torch's device
    queries describe the target inside the block. The platform is vLLM's variant that asks torch
    about the device (`NonNvmlCudaPlatform`): the other asks NVML, which reports the GPUs of the
    host (none on a builder, an H200 when baking for an A100 on one) whatever the target."""
    if target.is_rocm:
        raise InputError("--target", target.name, "an NVIDIA target for vLLM's CUDA platform")
    _vllm_package()
    import vllm.platforms as platforms

    with _device_queries(target):
        # The class caches the device's capability: a fresh module per target.
        sys.modules.pop("vllm.platforms.cuda", None)
        module = _without_extensions("vllm.platforms.cuda")
        platforms._current_platform = module.NonNvmlCudaPlatform()
        yield platforms._current_platform


def _vllm_package() -> ModuleType:
    """`vllm`, imported where its compiled extensions cannot be loaded (see `_without_extensions`):
    from 0.2x importing the package resolves vLLM's current platform (`utils.torch_utils` asks it
    whether memory can be pinned), which on a host with an NVIDIA driver is the CUDA platform and
    imports its extension."""
    return sys.modules.get("vllm") or _without_extensions("vllm")


def _without_extensions(name: str) -> ModuleType:
    """Import `name` where vLLM's compiled extensions it imports cannot be loaded: each such
    extension is absent during the import, as ROCm's platform module leaves `vllm._C` when it
    fails to load (see the module doc). An extension is a module the vLLM distribution ships as
    a shared object (its RECORD says so), whether the file is here and does not load (no CUDA
    runtime) or is not here (vLLM's Python files only). Other import errors propagate."""
    import importlib.machinery

    absent: list[str] = []
    try:
        while True:
            try:
                return importlib.import_module(name)
            except ImportError as error:
                extension = _extension_name(error)
                if extension is None or extension in absent:
                    raise
                module = ModuleType(extension, "vLLM's compiled extension, which cannot be loaded here")
                module.__spec__ = importlib.machinery.ModuleSpec(extension, None)
                sys.modules[extension] = module
                absent.append(extension)
                sys.modules.pop(name, None)
    finally:
        for extension in absent:
            sys.modules.pop(extension, None)


def _extension_name(error: ImportError) -> str | None:
    """The vLLM extension whose import failed (see `_without_extensions`), else None."""
    if isinstance(error, ModuleNotFoundError):
        name = error.name
    elif error.path and error.path.endswith(".so"):
        path = Path(error.path)
        try:
            relative = path.parent.relative_to(Path(importlib.util.find_spec("vllm").origin).parent.parent)
        except ValueError:
            return None
        name = ".".join((*relative.parts, path.name.split(".")[0]))
    else:
        return None
    return name if name in _vllm_extensions() else None


@functools.cache
def _vllm_extensions() -> frozenset[str]:
    """vLLM's compiled extensions by module name, from its distribution's RECORD (read as text:
    `metadata.files` leaves out files that are not on disk from Python 3.12)."""
    import csv
    from importlib import metadata

    try:
        record = metadata.distribution("vllm").read_text("RECORD") or ""
    except metadata.PackageNotFoundError:
        return frozenset()
    paths = [PurePosixPath(row[0]) for row in csv.reader(record.splitlines()) if row]
    return frozenset(
        ".".join((*path.parent.parts, path.name.split(".")[0]))
        for path in paths
        if path.parts[0] == "vllm" and path.name.endswith(".so")
    )


@contextlib.contextmanager
def target_platform(target: Target) -> Iterator[Any]:
    """vLLM's platform of the target's kind (`rocm_platform`, `cuda_platform`)."""
    with rocm_platform(target) if target.is_rocm else cuda_platform(target) as platform:
        yield platform


_TARGET_MARK = "_kprecompile_target"


def use_target_platform(target: Target) -> None:
    """Make the target's stand-in platform vLLM's current one, for vLLM kernel modules imported
    next (tracing and compile workers, which import them per target): they read its FP8 type and
    range and its arch checks at import. Also makes sure vLLM's `triton_utils` hold the real
    Triton (see `_real_triton`). Does nothing when it already is."""
    quiet_vllm_logging()
    _vllm_package()
    _real_triton(target)
    import vllm.platforms as platforms

    if getattr(platforms._current_platform, _TARGET_MARK, None) == target.name:
        return
    with target_platform(target) as platform:
        setattr(platform, _TARGET_MARK, target.name)


def target_platform_in_place(target: Target) -> bool:
    """Whether `use_target_platform(target)` has nothing left to do: vLLM's current platform is
    the target's stand-in and its `triton_utils` hold the real Triton."""
    platforms = sys.modules.get("vllm.platforms")
    importing = sys.modules.get("vllm.triton_utils.importing")
    return (
        platforms is not None
        and importing is not None
        and bool(getattr(importing, "HAS_TRITON", False))
        and getattr(platforms.__dict__.get("_current_platform"), _TARGET_MARK, None) == target.name
    )


def quiet_vllm_logging() -> None:
    """kprecompile's stdout carries its data (`--json`); vLLM logs to stdout, and on a builder
    without a GPU it warns about every GPU extension it cannot load. Before vLLM configures its
    logging in a kprecompile process: to stderr, critical messages only, unless the user chose otherwise
    (these variables are vLLM's own). From 0.19 vLLM configures its loggers only when an engine
    starts, so until then its records reach the root logger (kprecompile's handler): its `vllm`
    logger gets the same level."""
    if "vllm.logger" in sys.modules or importlib.util.find_spec("vllm") is None:
        return
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    level = os.environ.setdefault("VLLM_LOGGING_LEVEL", "CRITICAL")
    with contextlib.suppress(ValueError):
        logging.getLogger("vllm").setLevel(level.upper())


def _real_triton(target: Target) -> None:
    """vLLM swaps Triton for a placeholder module when its import finds no active GPU driver
    (`vllm/triton_utils/importing.py`), as on a CPU builder: kernels would then be stubs, and
    nothing would be traced. Import `vllm.triton_utils` while Triton's backend for the target
    reports the only active driver, as on the target's GPU host; the check has no other effect."""
    module = sys.modules.get("vllm.triton_utils.importing")
    if module is not None and module.HAS_TRITON:
        return
    from triton.backends import backends

    utils = [
        name for name in sys.modules.copy() if name == "vllm.triton_utils" or name.startswith("vllm.triton_utils.")
    ]
    for name in utils:
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
    import), and, where the flash-attention build the platform's attention modules import at
    import time cannot be loaded (ROCm's `flash_attn` is not installed on a CPU builder; vLLM's
    own `vllm.vllm_flash_attn` needs its compiled extensions, which load only beside a CUDA
    runtime), with a module of that name whose functions the Triton backends never call;
    called, one says so. It is gone after the block, so nothing else finds it."""
    with device_model(target):
        use_target_platform(target)
        name = "flash_attn" if target.is_rocm else "vllm.vllm_flash_attn"
        if name in sys.modules or _flash_attention_loads(name):
            yield
            return
        with _flash_attention_module(name):
            yield


_FLASH_ATTENTION_FUNCTIONS = (
    "flash_attn_varlen_func",
    "get_scheduler_metadata",
    "is_fa_version_supported",
    "fa_version_unsupported_reason",
    "compile_flash_attn_varlen_func_from_specs",
    "sparse_attn_func",
    "sparse_attn_varlen_func",
)


# flash-attn's submodules vLLM imports where `find_spec("flash_attn")` finds it (0.19's rotary
# embedding takes its Triton rotary), and their functions.
_FLASH_ATTENTION_SUBMODULES = {"flash_attn.ops.triton.rotary": ("apply_rotary",)}


@functools.cache
def _flash_attention_loads(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None and bool(importlib.import_module(name))
    except ImportError:
        return False


@contextlib.contextmanager
def _flash_attention_module(name: str) -> Iterator[None]:
    """`name` for the block (see `target_imports`): its functions raise when called, and it has
    no submodules but those vLLM imports once it finds the package (`_FLASH_ATTENTION_SUBMODULES`;
    vLLM's queries of the FA version import its `flash_attn_interface`, and take its absence as
    no flash attention)."""
    import importlib.machinery

    def unavailable(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{name} cannot be loaded here; kprecompile traces vLLM's Triton kernels only")

    module = ModuleType(name)
    # No distribution behind it: libraries that ask for flash-attn's version find none.
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for function in _FLASH_ATTENTION_FUNCTIONS:
        setattr(module, function, unavailable)
    added = {name: module}
    for qualified, functions in _FLASH_ATTENTION_SUBMODULES.items():
        if not qualified.startswith(name + "."):
            continue
        parent = module
        parts = qualified.split(".")
        for index in range(1, len(parts)):
            child_name = ".".join(parts[: index + 1])
            child = added.get(child_name)
            if child is None:
                child = added[child_name] = ModuleType(child_name)
                child.__spec__ = importlib.machinery.ModuleSpec(child_name, None)
                setattr(parent, parts[index], child)
            parent = child
        for function in functions:
            setattr(parent, function, unavailable)
    sys.modules.update(added)
    try:
        yield
    finally:
        for added_name in added:
            sys.modules.pop(added_name, None)


def refresh_switches() -> None:
    """vLLM's switches as the environment sets them now. Its AITER switches (`rocm_aiter_ops`'
    class attributes) are read from the environment when `vllm._aiter_ops` is imported, and that
    module registers torch operators, so it is imported once: read them again, with vLLM's own
    `refresh_env_variables` where the release has it, else the same assignments its class body
    makes. Nothing under vLLM's CUDA platform, which has no such switches."""
    _vllm_package()
    import vllm.platforms as platforms

    if platforms._current_platform is not None and not platforms._current_platform.is_rocm():
        return
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
