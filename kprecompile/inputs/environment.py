"""The environment fingerprint: every variable that changes which kernels run or how they compile.

A registry of the engine's kernel-selection flags and AITER's own switches, each read the way
its owner reads it and canonicalized, so that unset and an explicit default, or `TRUE` and
`1`, give the same fingerprint; plus the variables Triton itself reports as invalidating its
cache, exactly as Triton reports them (Triton's own kernel keys distinguish unset from an
explicit default, so a cache must too: docs/design.md, fact 10). The fingerprint's hash enters every
manifest key, and `compute_hash()` gives it to engines to fold into their own cache hashes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from ..cache.keys import hash_named_dict
from ..cache.layout import CacheLayout
from ..errors import InputError

# bool: vLLM's `os.getenv(name, default).lower() in ("true", "1")`;
# int_bool: vLLM's `bool(int(os.getenv(name, default)))`; string: the value as set.
Kind = Literal["bool", "int_bool", "string"]


@dataclass(frozen=True)
class Variable:
    name: str
    owner: Literal["vllm", "aiter"]
    kind: Kind
    # Canonical value when unset: "1"/"0" for booleans, the string or None for strings.
    default: str | None
    why: str

    def canonical(self, raw: str | None, default: str | None = None) -> str | None:
        """The value as its owner understands it, in one spelling; unset, `default` (the planned
        release's own default, `inputs/flag_defaults.py`) or else kprecompile's."""
        if raw is None or (raw == "" and self.kind != "string"):
            return default if default is not None else self.default
        if self.kind == "bool":
            return "1" if raw.lower() in ("true", "1") else "0"
        if self.kind == "int_bool":
            try:
                return "1" if int(raw) else "0"
            except ValueError:
                raise InputError(self.name, raw, "an integer (vLLM reads it with int())") from None
        return raw or self.default


def _vllm_bool(name: str, default: bool, why: str) -> Variable:
    return Variable(name, "vllm", "bool", "1" if default else "0", why)


VARIABLES: tuple[Variable, ...] = (
    _vllm_bool("VLLM_ROCM_USE_AITER", False, "master switch for every AITER kernel path"),
    _vllm_bool("VLLM_ROCM_USE_AITER_MLA", True, "MLA attention through AITER (ROCM_AITER_MLA) instead of TRITON_MLA"),
    _vllm_bool("VLLM_ROCM_USE_AITER_FP8BMM", True, "MLA absorbed-weight BMM through AITER's Triton FP8 BMM"),
    _vllm_bool(
        "VLLM_ROCM_USE_AITER_FP4BMM", True, "MLA absorbed-weight BMM of bf16 weights through AITER's FP4 BMM (gfx950)"
    ),
    _vllm_bool("VLLM_ROCM_USE_AITER_MHA", True, "GQA attention through AITER's CK/asm kernels (ROCM_AITER_FA)"),
    _vllm_bool(
        "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION", False, "GQA attention through AITER's Triton unified attention"
    ),
    _vllm_bool("VLLM_ROCM_USE_AITER_PAGED_ATTN", False, "decode through AITER's paged attention"),
    _vllm_bool("VLLM_V1_USE_PREFILL_DECODE_ATTENTION", False, "GQA attention through ROCM_ATTN's prefill/decode split"),
    _vllm_bool("VLLM_ROCM_CUSTOM_PAGED_ATTN", True, "ROCM_ATTN decode through vLLM's HIP paged attention"),
    _vllm_bool("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT", False, "KV-cache layout AITER's FA backend reads"),
    _vllm_bool("VLLM_ROCM_USE_AITER_TRITON_ROPE", False, "rotary embedding through AITER's Triton kernel"),
    _vllm_bool("VLLM_ROCM_USE_AITER_TRITON_GEMM", True, "GEMMs through AITER's Triton kernels"),
    _vllm_bool("VLLM_ROCM_USE_AITER_LINEAR", True, "scaled GEMMs through AITER"),
    _vllm_bool("VLLM_ROCM_USE_AITER_MOE", True, "fused MoE through AITER"),
    _vllm_bool("VLLM_ROCM_USE_AITER_RMSNORM", True, "RMSNorm through AITER"),
    _vllm_bool("VLLM_ROCM_USE_AITER_FP4_ASM_GEMM", False, "FP4 GEMMs through AITER's assembly kernels"),
    _vllm_bool("VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", False, "MoE shared experts fused into AITER's MoE"),
    _vllm_bool("VLLM_ROCM_USE_SKINNY_GEMM", True, "small-batch GEMMs through vLLM's skinny kernels"),
    Variable("VLLM_MLA_DISABLE", "vllm", "int_bool", "0", "MLA models run as plain MHA"),
    _vllm_bool(
        "VLLM_BATCH_INVARIANT", False, "batch-invariant mode: vLLM's own Triton matmul kernels, no Marlin FP8 GEMMs"
    ),
    Variable("VLLM_DISABLED_KERNELS", "vllm", "string", None, "linear-layer kernels vLLM must not choose"),
    Variable("VLLM_ROCM_FP8_PADDING", "vllm", "int_bool", "1", "FP8 weights padded to 256 bytes: GEMM shapes"),
    Variable("VLLM_ROCM_MOE_PADDING", "vllm", "int_bool", "1", "MoE weights padded: MoE GEMM shapes"),
    Variable("VLLM_ATTENTION_BACKEND", "vllm", "string", None, "forces the attention backend"),
    Variable("GPU_ARCHS", "aiter", "string", None, "AITER's arch override (tuned tables, FP8 type)"),
    Variable("CU_NUM", "aiter", "string", None, "AITER's compute-unit override (MLA decode KV splits)"),
    Variable(
        "FLASH_ATTENTION_TRITON_AMD_AUTOTUNE", "aiter", "string", None, "autotuning in AITER's Triton flash attention"
    ),
)
VARIABLE_NAMES = frozenset(variable.name for variable in VARIABLES)

ENGINES = ("vllm-aiter", "vllm", "aiter")
DEFAULT_ENGINE = "vllm-aiter"
# What an engine profile assumes for a variable left unset, where it differs from vLLM's default:
# `vllm-aiter` is vLLM as AMD recommends running it on Instinct GPUs, with AITER on.
_ENGINE_DEFAULTS: dict[str, dict[str, str]] = {"vllm-aiter": {"VLLM_ROCM_USE_AITER": "1"}, "vllm": {}, "aiter": {}}


@dataclass(frozen=True)
class Fingerprint:
    # Every registered variable, canonical (None: a string variable not set).
    variables: dict[str, str | None]
    # Triton's cache-invalidating variables that are set, as Triton reports them.
    triton: dict[str, str]

    def as_dict(self) -> dict[str, dict[str, str | None]]:
        return {"variables": dict(self.variables), "triton": dict(self.triton)}

    @property
    def hash(self) -> str:
        return hash_named_dict(self.as_dict())


def registered_values(
    environ: Mapping[str, str] | None = None, engine: str = DEFAULT_ENGINE, release: str | None = None
) -> dict[str, str | None]:
    """Every registered variable's effective value under `engine`'s defaults, canonical; a vLLM
    flag left unset takes vLLM `release`'s own default (None: kprecompile's, as with no vLLM)."""
    if engine not in ENGINES:
        raise InputError("--engine", engine, "one of " + ", ".join(ENGINES))
    environ = os.environ if environ is None else environ
    release_defaults = {}
    if release is not None and engine != "aiter":
        from .flag_defaults import release_defaults as defaults_of

        release_defaults = defaults_of(release)
    values = {}
    for variable in VARIABLES:
        raw = environ.get(variable.name)
        if not raw and variable.name in _ENGINE_DEFAULTS[engine]:
            raw = _ENGINE_DEFAULTS[engine][variable.name]
        values[variable.name] = variable.canonical(raw, release_defaults.get(variable.name))
    return values


@contextlib.contextmanager
def engine_environment(engine: str) -> Iterator[None]:
    """The process environment with `engine`'s profile defaults for what it leaves unset, for the
    block: vLLM's own code, called while tracing, reads its flags from the environment."""
    unset = {name: value for name, value in _ENGINE_DEFAULTS[engine].items() if not os.environ.get(name)}
    saved = {name: os.environ.get(name) for name in unset}
    os.environ.update(unset)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def triton_values(layout: CacheLayout | None = None, remember: bool = True) -> dict[str, str]:
    """Triton's cache-invalidating variables of this process (read by libtriton from the process env).

    Asking libtriton imports Triton (about 0.1 s). With `layout`, the answer comes from the names
    libtriton answered for before (`triton_env.py`) where it answered for every variable now set.
    """
    if layout is not None:
        from .triton_env import remembered_triton_values

        return remembered_triton_values(layout, remember)
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(sorted(get_cache_invalidating_env_vars().items()))


def fingerprint(
    environ: Mapping[str, str] | None = None,
    engine: str = DEFAULT_ENGINE,
    layout: CacheLayout | None = None,
    remember: bool = True,
    release: str | None = None,
) -> Fingerprint:
    """This process's fingerprint; `environ` overrides the registered variables' source (tests);
    `layout` lets Triton's part come from what the cache remembers of libtriton's answers
    (`remember` false: without adding to it); `release`: the vLLM release whose defaults unset
    flags take."""
    return Fingerprint(registered_values(environ, engine, release), triton_values(layout, remember))


def compute_hash(engine: str = DEFAULT_ENGINE, release: str | None = None) -> str:
    """The fingerprint's hash: fold it into an engine's own cache hash (compile or graph caches).

    Values are effective ones, so `vllm-aiter` with VLLM_ROCM_USE_AITER unset hashes like
    `vllm` with VLLM_ROCM_USE_AITER=1: the same kernels run. `release` defaults to the installed
    vLLM's (its defaults are what unset flags mean in this process).
    """
    if release is None and engine != "aiter":
        from .flag_defaults import installed_vllm_release

        release = installed_vllm_release()
    return fingerprint(engine=engine, release=release).hash
