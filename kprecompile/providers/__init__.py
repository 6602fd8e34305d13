"""Providers turn a family's shape records into real library calls on meta tensors.

A provider names the library modules its calls import (re-imported fresh for each traced
target, because libraries cache per-arch configs in module state), says which targets it
supports, and launches one call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..targets import Target
from . import aiter_fp8_bmm, aiter_mla_decode, aiter_mla_prefill, aiter_pa_prefill, aiter_unified_attention


@dataclass(frozen=True)
class Provider:
    family: str
    library: str
    module_prefixes: tuple[str, ...]
    unsupported_reason: Callable[[Target], str | None]
    describe: Callable[[Any], str]
    launch: Callable[[Any, Target], None]


def _aiter(family: str, module: ModuleType, module_prefixes: tuple[str, ...]) -> Provider:
    """A family whose calls are AITER wrappers, implemented by one provider module."""
    return Provider(family, "amd-aiter", module_prefixes, module.unsupported_reason, module.describe, module.launch)


PROVIDERS: dict[str, Provider] = {
    provider.family: provider
    for provider in (
        _aiter("fp8_bmm", aiter_fp8_bmm, ("aiter.ops.triton",)),
        _aiter("mla_decode", aiter_mla_decode, ("aiter.mla",)),
        _aiter("mla_prefill", aiter_mla_prefill, ("aiter.ops.triton",)),
        # One kernel, two kinds of step: with a prefill, and pure decode.
        _aiter("prefix_prefill", aiter_unified_attention, ("aiter.ops.triton",)),
        _aiter("paged_decode", aiter_unified_attention, ("aiter.ops.triton",)),
        _aiter("pa_prefill", aiter_pa_prefill, ("aiter.ops.triton",)),
    )
}


def provider_for(family: str) -> Provider:
    return PROVIDERS[family]
