"""kprecompile: ahead-of-time Triton and AITER kernel precompilation for LLM serving.

The public names below are imported on first use, so that a command that needs little (such as
`kprecompile verify`) does not pay for importing every module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "activate": "runtime",
    "preload": "runtime",
    "prepare": "hook",
    "CacheLayout": "cache",
    "cache_layout": "settings",
    "InputError": "errors",
    "KprecompileError": "errors",
    "ModelConfig": "models",
    "load_model": "models",
    "Plan": "planning",
    "plan": "planning",
    "Selection": "engines",
    "select": "engines",
    "ServingParams": "serving",
    "Target": "targets",
    "resolve_target": "targets",
    "VerifyReport": "verification",
    "verify": "verification",
    "WarmReport": "warming",
    "warm": "warming",
    "compute_hash": "environment",
}

__all__ = [
    "CacheLayout",
    "InputError",
    "KprecompileError",
    "ModelConfig",
    "Plan",
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
    from .engines import Selection, select
    from .environment import compute_hash
    from .errors import InputError, KprecompileError
    from .hook import prepare
    from .models import ModelConfig, load_model
    from .planning import Plan, plan
    from .runtime import activate, preload
    from .serving import ServingParams
    from .settings import cache_layout
    from .targets import Target, resolve_target
    from .verification import VerifyReport, verify
    from .warming import WarmReport, warm
