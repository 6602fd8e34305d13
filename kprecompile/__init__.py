"""kprecompile: ahead-of-time Triton and AITER kernel precompilation for LLM serving."""

from __future__ import annotations

__version__ = "0.1.0"

from .cache import CacheLayout  # noqa: E402
from .engines import Selection, select  # noqa: E402
from .environment import compute_hash  # noqa: E402
from .errors import InputError, KprecompileError  # noqa: E402
from .models import ModelConfig, load_model  # noqa: E402
from .planning import Plan, plan  # noqa: E402
from .serving import ServingParams  # noqa: E402
from .targets import Target, resolve_target  # noqa: E402
from .verification import VerifyReport, verify  # noqa: E402
from .warming import WarmReport, warm  # noqa: E402

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
    "compute_hash",
    "load_model",
    "plan",
    "resolve_target",
    "select",
    "verify",
    "warm",
]
