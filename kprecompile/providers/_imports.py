"""Importing kernel libraries on machines they were not built for.

`import aiter` initializes HIP and fails without ROCm, but AITER's Triton kernels
(`aiter.ops.triton.*`) need none of it: registering the parent package as a bare namespace
module (its `__path__` the installed directory) lets them import anywhere (DESIGN.md fact 5).
On a ROCm build of torch the real package is imported instead, so that an engine sharing the
process later gets a fully initialized `aiter`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from types import ModuleType

AITER_PACKAGE = "aiter"


class LibraryUnavailableError(ImportError):
    """The library that holds a kernel family is not installed."""


def _ensure_aiter_package() -> None:
    if AITER_PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(AITER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LibraryUnavailableError("amd-aiter is not installed (pip install amd-aiter)")
    import torch

    if torch.version.hip is not None:
        importlib.import_module(AITER_PACKAGE)
        return
    package = types.ModuleType(AITER_PACKAGE)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    sys.modules[AITER_PACKAGE] = package


def import_library_module(name: str) -> ModuleType:
    """Import a kernel library's module, working around a library's unusable parent package."""
    if name == AITER_PACKAGE or name.startswith(AITER_PACKAGE + "."):
        _ensure_aiter_package()
    return importlib.import_module(name)


def resolve_object(path: str) -> object:
    """`module:qualified.name` -> the object."""
    module_name, _, qualname = path.partition(":")
    target: object = import_library_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target
