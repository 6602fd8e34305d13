"""Providers turn a family's shape records into real library calls on meta tensors.

A provider names the library modules its calls import (re-imported fresh for each traced
target, because libraries cache per-arch configs in module state), says which targets it
supports, and launches one call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..targets import Target
from . import aiter_fp8_bmm, aiter_mla_decode, aiter_mla_prefill, aiter_unified_attention


@dataclass(frozen=True)
class Provider:
    family: str
    library: str
    module_prefixes: tuple[str, ...]
    unsupported_reason: Callable[[Target], str | None]
    describe: Callable[[Any], str]
    launch: Callable[[Any, Target], None]


PROVIDERS: dict[str, Provider] = {
    "fp8_bmm": Provider(
        family="fp8_bmm",
        library="amd-aiter",
        module_prefixes=("aiter.ops.triton",),
        unsupported_reason=aiter_fp8_bmm.unsupported_reason,
        describe=aiter_fp8_bmm.describe,
        launch=aiter_fp8_bmm.launch,
    ),
    "mla_decode": Provider(
        family="mla_decode",
        library="amd-aiter",
        module_prefixes=("aiter.mla",),
        unsupported_reason=aiter_mla_decode.unsupported_reason,
        describe=aiter_mla_decode.describe,
        launch=aiter_mla_decode.launch,
    ),
    "mla_prefill": Provider(
        family="mla_prefill",
        library="amd-aiter",
        module_prefixes=("aiter.ops.triton",),
        unsupported_reason=aiter_mla_prefill.unsupported_reason,
        describe=aiter_mla_prefill.describe,
        launch=aiter_mla_prefill.launch,
    ),
    **{
        family: Provider(
            family=family,
            library="amd-aiter",
            module_prefixes=("aiter.ops.triton",),
            unsupported_reason=aiter_unified_attention.unsupported_reason,
            describe=aiter_unified_attention.describe,
            launch=aiter_unified_attention.launch,
        )
        for family in ("prefix_prefill", "paged_decode")
    },
}


def provider_for(family: str) -> Provider:
    return PROVIDERS[family]
