"""kprecompile: ahead-of-time Triton and AITER kernel precompilation for LLM serving.

The public names below are imported on first use, so that a command that needs little (such as
`kprecompile verify`) does not pay for importing every module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

_EXPORTS = {
    "activate": "serve.runtime",
    "preload": "warmup.preload",
    "start_preload": "warmup.preload",
    "prepare": "serve.hook",
    "CacheLayout": "cache",
    "cache_layout": "inputs.settings",
    "InputError": "errors",
    "KprecompileError": "errors",
    "ModelConfig": "inputs.models",
    "load_model": "inputs.models",
    "Plan": "warmup.planning",
    "plan": "warmup.planning",
    "Selection": "selection.engines",
    "select": "selection.engines",
    "ServingParams": "inputs.serving",
    "Target": "inputs.targets",
    "resolve_target": "inputs.targets",
    "VerifyReport": "warmup.verification",
    "verify": "warmup.verification",
    "WarmReport": "warmup.warming",
    "warm": "warmup.warming",
    "compute_hash": "inputs.environment",
    "Request": "selection.request",
}

__all__ = [
    "CacheLayout",
    "InputError",
    "KprecompileError",
    "ModelConfig",
    "Plan",
    "Request",
    "Selection",
    "ServingParams",
    "Target",
    "VerifyReport",
    "WarmReport",
    "__version__",
    "activate",
    "cache_layout",
    "compute_hash",
    "load_model",
    "plan",
    "preload",
    "prepare",
    "resolve_target",
    "select",
    "start_preload",
    "verify",
    "warm",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kprecompile' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


if TYPE_CHECKING:
    from .cache import CacheLayout
    from .errors import InputError, KprecompileError
    from .inputs.environment import compute_hash
    from .inputs.models import ModelConfig, load_model
    from .inputs.serving import ServingParams
    from .inputs.settings import cache_layout
    from .inputs.targets import Target, resolve_target
    from .selection.engines import Selection, select
    from .selection.request import Request
    from .serve.hook import prepare
    from .serve.runtime import activate
    from .warmup.planning import Plan, plan
    from .warmup.preload import preload
    from .warmup.verification import VerifyReport, verify
    from .warmup.warming import WarmReport, warm
