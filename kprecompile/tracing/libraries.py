"""Importing kernel libraries (AITER, ...) on machines they were not built for.

`import aiter` initializes HIP and fails without ROCm, but AITER's Triton kernels
(`aiter.ops.triton.*`) need none of it: registering the parent package as a bare namespace
module (its `__path__` the installed directory) lets them import anywhere (docs/design.md, fact 5).
On a ROCm build of torch the real package is imported instead, so that an engine sharing the
process later gets a fully initialized `aiter`.

`aiter.mla` (MLA decode) also imports `aiter.dtypes` and `aiter.jit.utils.chip_info`, which ask
the ROCm runtime for the GPU's arch and compute units at import. With the bare package they
are stand-ins that answer for the GPU Triton's active driver reports (the target being traced
or compiled) and the device torch reports, the same answers the real modules give on it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

from ..errors import LibraryUnavailableError

AITER_PACKAGE = "aiter"
AITER_DISTRIBUTION = "amd-aiter"
VLLM_PACKAGE = VLLM_DISTRIBUTION = "vllm"


def _ensure_aiter_package() -> None:
    if AITER_PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(AITER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LibraryUnavailableError(AITER_DISTRIBUTION, f"pip install {AITER_DISTRIBUTION}")
    import torch

    if torch.version.hip is not None:
        importlib.import_module(AITER_PACKAGE)
        return
    # Without ROCm, AITER's HIP side is absent for the rest of the process: from about v0.1.10
    # AITER's Triton package imports its JIT core on the way (`aiter.ops.triton` -> its quant
    # kernels -> `aiter.utility.dtypes` -> `aiter.ops.enum`), which then fails as a missing
    # module, as AITER's own optional imports expect, not with "ROCm version file not found".
    if not any(isinstance(finder, _AiterHipAbsent) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AiterHipAbsent())
    package = types.ModuleType(AITER_PACKAGE)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    sys.modules[AITER_PACKAGE] = package
    package.dtypes = sys.modules[f"{AITER_PACKAGE}.dtypes"] = _dtypes_standin()
    # Where `aiter.dtypes` lives in AITER's source (v0.1.10 on): its Triton quantization imports it there.
    sys.modules[f"{AITER_PACKAGE}.utility.dtypes"] = package.dtypes
    sys.modules[f"{AITER_PACKAGE}.jit.utils.chip_info"] = _chip_info_standin()


def aiter_module_lacking(error: BaseException | None) -> str | None:
    """The AITER module `error` says is missing where AITER itself is installed: an engine release
    newer than the installed AITER imports what only its own AITER has (vLLM 0.31's ROCM_AITER_FA
    imports AITER's Gluon paged decode at import). None for anything else."""
    name = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    if not name or not name.startswith(AITER_PACKAGE + "."):
        return None
    installed = AITER_PACKAGE in sys.modules or importlib.util.find_spec(AITER_PACKAGE) is not None
    return name if installed else None


def installed_aiter_without_hip() -> None:
    """Where AITER is installed and not imported yet, its package as kprecompile imports it (its
    Triton side, without HIP on a builder): vLLM 0.13 to 0.16 import AITER's `dtypes` at the top
    of `vllm._aiter_ops` whenever AITER is installed, and the real package asks for ROCm at import."""
    if AITER_PACKAGE not in sys.modules and importlib.util.find_spec(AITER_PACKAGE) is not None:
        _ensure_aiter_package()


def _active_arch() -> str:
    from triton.runtime import driver

    return str(driver.active.get_current_target().arch)


def _dtypes_standin() -> ModuleType:
    """`aiter.dtypes`: torch dtypes by AITER's short names, and their table `d_dtypes`; `fp8` is
    the active target's FP8 (AITER reads it from the GPU at import)."""
    import torch

    module = types.ModuleType(f"{AITER_PACKAGE}.dtypes")
    fallback = torch.uint8
    names = {
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
        "fp32": torch.float32,
        "u32": torch.uint32,
        "i32": torch.int32,
        "i16": torch.int16,
        "i8": torch.int8,
        "u8": torch.uint8,
        "i64": torch.int64,
        "u64": torch.uint64,
        "fp8_e8m0": getattr(torch, "float8_e8m0fnu", fallback),
        "i4x2": getattr(torch, "int4", fallback),
        "fp4x2": getattr(torch, "float4_e2m1fn_x2", fallback),
    }
    fp8_by_arch = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}
    module.__dict__.update(names)

    def __getattr__(name: str) -> object:
        if name == "fp8":
            return fp8_by_arch.get(_active_arch(), fallback)
        if name == "d_dtypes":
            return {**names, "fp8": __getattr__("fp8")}
        raise AttributeError(name)

    module.__getattr__ = __getattr__
    return module


def _chip_info_standin() -> ModuleType:
    """`aiter.jit.utils.chip_info`: the arch and compute units of the GPU being compiled for."""
    module = types.ModuleType(f"{AITER_PACKAGE}.jit.utils.chip_info")

    def get_gfx() -> str:
        return _active_arch()

    def get_cu_num() -> int:
        import torch

        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count

    module.get_gfx = get_gfx
    module.get_cu_num = get_cu_num
    return module


# AITER's JIT core asks the ROCm install for its version at import: without ROCm it raises
# RuntimeError where the engines expect ImportError.
_AITER_HIP_MODULE = f"{AITER_PACKAGE}.jit.core"


class _AiterHipAbsent(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == _AITER_HIP_MODULE:
            raise ImportError(f"{_AITER_HIP_MODULE} needs a ROCm install, which this builder does not have", name=name)
        return None


@contextlib.contextmanager
def aiter_hip_absent() -> Iterator[None]:
    """On a builder without ROCm, AITER's HIP modules fail to import as ImportError, the way
    vLLM's optional imports of them (`try: from aiter.ops.shuffle import ...` in its quark
    config, imported by every quantized model's config) expect a missing AITER to fail; they
    otherwise raise RuntimeError (`ROCm version file not found`) and stop vLLM's config. Only the
    HIP side is absent: AITER's Triton kernels import as before (`_ensure_aiter_package`)."""
    import torch

    if torch.version.hip is not None or _AITER_HIP_MODULE in sys.modules:
        yield
        return
    finder = _AiterHipAbsent()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


_OPERATORS_KEEP_FIRST = False


def operators_keep_first_definition() -> None:
    """From now on in this process, a torch operator defined again keeps its first definition.

    Tracing imports a library's modules afresh per target, and some register torch operators at
    import (vLLM 0.33's `rocm_aiter_mla_sparse`, pulled in by `vllm._aiter_ops` and DeepSeek's
    model classes): a module imported again defines its operators again, which torch refuses, so
    the second model or target of a process failed where each alone traced. Installed when
    kprecompile first drops library modules, before anything can import one again; the operator
    keeps the first import's implementation, the module's kernels are the fresh import's."""
    global _OPERATORS_KEEP_FIRST
    if _OPERATORS_KEEP_FIRST:
        return
    import torch.library
    from torch._library.simple_registry import singleton

    library = torch.library.Library
    define, impl, register_fake = library.define, library.impl, library._register_fake

    def qualified(self: Any, name: str) -> str:
        return name if "::" in name else f"{self.ns}::{name}"

    def define_once(self: Any, schema: str, *args: Any, **kwargs: Any) -> Any:
        name = schema.split("(")[0]
        if f"{self.ns}::{name}" in torch.library._defs:
            return name
        return define(self, schema, *args, **kwargs)

    def impl_once(self: Any, op_name: Any, fn: Any, dispatch_key: str = "", *args: Any, **kwargs: Any) -> Any:
        if isinstance(op_name, str):
            key = f"{self.ns}/{op_name.split('::')[-1]}/{dispatch_key or self.dispatch_key}"
            if key in torch.library._impls:
                return None
        return impl(self, op_name, fn, dispatch_key, *args, **kwargs)

    def register_fake_once(self: Any, op_name: str, fn: Any, _stacklevel: int = 1, **kwargs: Any) -> Any:
        if singleton.find(qualified(self, op_name)).fake_impl.kernel is not None:
            return None
        # The caller's frame, not this one, is the registration's source.
        return register_fake(self, op_name, fn, _stacklevel + 1, **kwargs)

    library.define, library.impl, library._register_fake = define_once, impl_once, register_fake_once
    _OPERATORS_KEEP_FIRST = True


# AITER's decorator (v0.1.10 on) that registers a wrapper as a torch operator.
_TORCH_GUARD = f"{AITER_PACKAGE}.jit.utils.torch_guard"


def _left_as_python(*_: Any, **__: Any) -> Any:
    return lambda function: function


@contextlib.contextmanager
def aiter_wrappers_as_python(fresh_modules: Sequence[str]) -> Iterator[None]:
    """AITER's `torch_compile_guard` makes a wrapper (its FP4 BMM, its GEMMs) a torch operator
    whose meta kernel is a fake that only returns an empty output: called on meta tensors, the
    Triton launch inside never runs, and a trace captures nothing. In the block the decorator
    leaves each function as it is, so AITER modules imported afresh in it (`fresh_modules`) bind
    the wrapper's own body, which the server's operator runs on its tensors."""
    if AITER_PACKAGE not in sys.modules and not any(name.startswith(AITER_PACKAGE) for name in fresh_modules):
        yield
        return
    try:
        _ensure_aiter_package()
        guard = importlib.import_module(_TORCH_GUARD)
    except (ImportError, LibraryUnavailableError):
        yield
        return
    original = guard.torch_compile_guard
    guard.torch_compile_guard = _left_as_python
    try:
        yield
    finally:
        guard.torch_compile_guard = original


def import_library_module(name: str) -> ModuleType:
    """Import a kernel library's module, working around a library's unusable parent package."""
    if name == AITER_PACKAGE or name.startswith(AITER_PACKAGE + "."):
        _ensure_aiter_package()
    if name.startswith(VLLM_PACKAGE + "."):
        return _import_vllm_module(name)
    return importlib.import_module(name)


def release_attribute(attribute: str, modules: Sequence[str]) -> Any:
    """`attribute` of the first of a library's `modules` that holds it: where the installed release
    keeps a class that moved between releases. ImportError naming them all where none does."""
    for name in modules:
        with contextlib.suppress(ImportError):
            module = import_library_module(name)
            if hasattr(module, attribute):
                return getattr(module, attribute)
    raise ImportError(f"{attribute} is in none of {', '.join(modules)}")


def _import_vllm_module(name: str) -> ModuleType:
    """vLLM's kernel modules read their platform at import: under the cross-compile driver
    (tracing, compile workers) that is the stand-in of the driver's target; in a serving process
    it is vLLM's own."""
    from ..platforms.triton_driver import cross_compile_target

    target = cross_compile_target()
    if target is None:
        return importlib.import_module(name)
    from ..platforms.vllm_platform import target_imports, target_platform_in_place

    # A trace's steps ask for modules imported already, hundreds of times: where the platform is
    # in place (and the module is not still being imported), nothing would be imported or set.
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if module is not None and not getattr(spec, "_initializing", False) and target_platform_in_place(target):
        return module
    if importlib.util.find_spec(VLLM_PACKAGE) is None:
        raise LibraryUnavailableError(
            VLLM_DISTRIBUTION, "kprecompile engine install vllm==VERSION, then --vllm-version VERSION"
        )
    with target_imports(target):
        installed_aiter_without_hip()
        return importlib.import_module(name)


def resolve_object(path: str) -> object:
    """`module:qualified.name` -> the object."""
    module_name, _, qualname = path.partition(":")
    target: object = import_library_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def resolve_kernel(path: str) -> object:
    """`module:qualified.name` -> the JITFunction under it (unwrapping triton.heuristics and
    triton.autotune), as compile workers and preload need it."""
    from triton.runtime.jit import JITFunction

    kernel = resolve_object(path)
    while not isinstance(kernel, JITFunction):
        inner = getattr(kernel, "fn", None)
        if inner is None or inner is kernel:
            raise TypeError(f"{path} is a {type(kernel).__name__}, not a Triton kernel")
        kernel = inner
    return kernel


def missing_library(distribution: str, module: str) -> str | None:
    """Why kernels in `module` cannot be traced here (`distribution` is not installed), or None."""
    if importlib.util.find_spec(module.partition(".")[0]) is None:
        return f"{distribution} is not installed here (pip install {distribution})"
    return None
