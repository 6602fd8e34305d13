"""Which kernel families an engine runs for a model, decided by the engine's own flags.

The model fixes the attention structure (MLA or GQA); the engine's attention backend and flags
decide which kernels run: AITER's Triton kernels (what kprecompile plans), AITER's prebuilt
CK/assembly kernels (nothing to compile), or vLLM's own Triton kernels. Where vLLM is installed
its own selector chooses (`vllm/selector.py`, through `select(selector=...)`); this module mirrors
it for builders without vLLM, rule by rule from the planned release's `ReleaseLine`, each mirror
tested against a real release of its line. NVIDIA targets take vLLM's CUDA selection. How the
mirrors read vLLM: docs/engine-kernels.md, "Backend selection".

Engines:
- `vllm-aiter` (default): vLLM with AITER enabled, `VLLM_ROCM_USE_AITER=1` unless the
  environment says otherwise: the configuration AMD recommends on Instinct GPUs.
- `vllm`: vLLM with its own defaults, where AITER is off unless `VLLM_ROCM_USE_AITER=1`.
- `aiter`: AITER's Triton kernels as AITER's own Python API calls them, no serving engine
  (AITER's tests and benchmarks, custom stacks): MLA models get the Triton MLA path, GQA
  models `pa_prefill`, the one AITER attention kernel that also runs on NVIDIA GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..errors import InputError
from ..inputs.environment import DEFAULT_ENGINE, ENGINES, registered_values
from ..inputs.flag_defaults import release_defaults
from ..inputs.layers import kv_b_proj_dtype
from ..inputs.models import ModelConfig
from ..inputs.targets import Target
from ..shapes.family import FamilyName
from ..vllm.releases import ReleaseLine, installed_release, release_line, resolve_release

# The compute capabilities (major) each backend's `supports_compute_capability` takes (None: any).
_CUDA_CAPABILITIES: dict[str, tuple[int, ...] | None] = {
    "FLASH_ATTN_MLA": (9,),
    "FLASHMLA": (9, 10),
    "FLASHINFER_MLA": (10,),
    "CUTLASS_MLA": (10,),
    "TOKENSPEED_MLA": (10,),
    "TRITON_MLA": None,
    "FLASH_ATTN": (8, 9, 10),
    "FLASHINFER": (8, 9, 10),
    "TRITON_ATTN": None,
    "FLEX_ATTENTION": None,
}
# What each CUDA backend of the priority lists runs.
_CUDA_RUNS = {
    "FLASH_ATTN": "vLLM's prebuilt flash-attention build (vllm_flash_attn)",
    "FLASHINFER": "FlashInfer's CUDA kernels",
    "FLEX_ATTENTION": "torch's FlexAttention, compiled by torch.compile",
    "FLASH_ATTN_MLA": "vLLM's prebuilt FlashAttention-3 MLA kernels",
    "FLASHMLA": "vLLM's prebuilt FlashMLA kernels",
    "FLASHINFER_MLA": "FlashInfer's CUDA MLA kernels",
    "CUTLASS_MLA": "vLLM's prebuilt CUTLASS MLA kernels",
    "TOKENSPEED_MLA": "TokenSpeed's CUDA MLA kernels",
}


# The variables of the environment registry that decide vLLM's attention backend and FP8 BMM.
SELECTION_FLAGS = (
    "VLLM_ROCM_USE_AITER",
    "VLLM_ROCM_USE_AITER_MLA",
    "VLLM_ROCM_USE_AITER_FP8BMM",
    "VLLM_ROCM_USE_AITER_FP4BMM",
    "VLLM_ROCM_USE_AITER_MHA",
    "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION",
    "VLLM_V1_USE_PREFILL_DECODE_ATTENTION",
    "VLLM_ROCM_USE_AITER_LINEAR",
    "VLLM_BATCH_INVARIANT",
)
BACKEND_VARIABLE = "VLLM_ATTENTION_BACKEND"
FP4_BMM_FLAG = "VLLM_ROCM_USE_AITER_FP4BMM"
# The "backend" of the aiter engine: AITER's Python API itself.
AITER_API = "aiter"


@dataclass(frozen=True)
class FamilyChoice:
    family: FamilyName
    # The engine's backend (or path) that runs this family's kernels.
    backend: str
    # Why kprecompile does not compile this family under this selection, or None when it does.
    skip_reason: str | None = None
    # (target, why not) where the engine takes another path on that target only.
    skip_targets: tuple[tuple[str, str], ...] = ()
    # What this builder lacks for the family (`vllm==0.12.0`), where that is why it is skipped.
    missing: str | None = None

    def skip_reason_on(self, target: str) -> str | None:
        """Why the family is not compiled for `target` (besides `skip_reason`), or None."""
        return dict(self.skip_targets).get(target)


@dataclass(frozen=True)
class Selection:
    engine: str
    attention_backend: str
    flags: dict[str, bool]
    choices: tuple[FamilyChoice, ...]
    # The vLLM release planned for (None for the aiter engine, which has no vLLM).
    vllm_release: str | None = None
    # Who chose the attention backend: vLLM's own selector or kprecompile's mirror of it.
    selected_by: str = "kprecompile's mirror"

    @property
    def planned(self) -> tuple[FamilyName, ...]:
        return tuple(choice.family for choice in self.choices if choice.skip_reason is None)

    def as_dict(self) -> dict[str, object]:
        """The selection as `plan --json` shows it."""
        return {
            "engine": self.engine,
            "vllm_release": self.vllm_release,
            "attention_backend": self.attention_backend,
            "selected_by": self.selected_by,
            "flags": dict(self.flags),
        }

    def key_part(self) -> dict[str, object]:
        """What of the selection enters the manifest key. The flags enter it through the
        environment fingerprint as effective values, so the profile's name does not: vllm-aiter
        with VLLM_ROCM_USE_AITER unset and vllm with it set to 1 share a cache."""
        return {
            "vllm_release": self.vllm_release,
            "attention_backend": self.attention_backend,
            "planned": list(self.planned),
        }


class BackendSelector(Protocol):
    """Another source of the attention backend than the mirror: vLLM's own selector
    (`vllm/selector.py`). Returns None where it cannot answer for `release`."""

    description: str

    def __call__(
        self, release: str, field: str, requested: str | None, flags: Mapping[str, str | None]
    ) -> str | None: ...


def read_flags(engine: str, environ: Mapping[str, str], release: str | None = None) -> dict[str, bool]:
    """The selection flags as vLLM `release` reads them, under the engine profile's defaults."""
    values = registered_values(environ, engine, release)
    return {name: values[name] == "1" for name in SELECTION_FLAGS}


def select(
    model: ModelConfig,
    engine: str = DEFAULT_ENGINE,
    attention_backend: str | None = None,
    environ: Mapping[str, str] | None = None,
    families: Sequence[str] = (),
    vllm_release: str | None = None,
    block_size: int = 16,
    selector: BackendSelector | None = None,
    targets: Sequence[Target] = (),
    dtype: str | None = None,
) -> Selection:
    """The families `engine` runs for `model` under these flags, each planned or with why not.

    `vllm_release` (the CLI's --vllm-version) defaults to the installed vLLM's, else
    `releases.DEFAULT_RELEASE`. `attention_backend` (the CLI's --attention-backend) wins over
    VLLM_ATTENTION_BACKEND, as vLLM's --attention-backend does (the variable is gone from 0.19).
    `families`, when given, keeps only those (--family). `block_size` matters where the release
    line takes AITER's MLA for pages of one token (`aiter_mla_for_block_size_1`). `selector`, when
    it answers, chooses the backend instead of the mirror (where vLLM is installed). `dtype`: the
    dtype vLLM runs the model in (`--dtype`; default the config's), which MLA's BMM follows.
    """
    if engine not in ENGINES:
        raise InputError("--engine", engine, "one of " + ", ".join(ENGINES))
    environ = os.environ if environ is None else environ
    if engine == "aiter":
        if attention_backend:
            raise InputError("--attention-backend", attention_backend, "no backend with --engine aiter (it has none)")
        choices = _aiter_choices(model)
        flags = read_flags(engine, environ)
        return Selection(engine, AITER_API, flags, _filtered(model, choices, families), selected_by="no engine")
    release = resolve_release(vllm_release)
    flags = read_flags(engine, environ, release)
    line = release_line(release)
    field, requested = "--attention-backend", attention_backend
    if not requested and line.backend_variable:
        field, requested = BACKEND_VARIABLE, environ.get(BACKEND_VARIABLE) or None
    # The backends vLLM's own model gave its layers (`vllm/model_layers.py`), asked per layer.
    layer_backends = tuple(dict.fromkeys(layer.backend for layer in model.attention_layers if layer.backend))
    by_layers = f"vLLM {release}'s own model, per layer"
    if targets and not any(target.is_rocm for target in targets):
        choices = _cuda_choices(model, field, requested, line, release, targets, flags, layer_backends)
        backend = next(choice.backend for choice in choices if choice.family in ("triton_attn", "triton_mla"))
        selected_by = by_layers if layer_backends else Selection.selected_by
        return Selection(engine, backend, flags, _filtered(model, choices, families), release, selected_by)
    backends = line.rocm_mla_backends if model.attention == "mla" else line.rocm_gqa_backends
    if requested is not None and requested not in backends:
        kind = "multi-head latent attention" if model.attention == "mla" else "grouped-query attention"
        raise InputError(field, requested, f"one of {', '.join(backends)} for {model.name}'s {kind} in vLLM {release}")
    chosen: tuple[str, ...] = layer_backends
    selected_by = by_layers
    if not chosen:
        backend = selector(release, field, requested, registered_values(environ, engine, release)) if selector else None
        selected_by = selector.description if backend else Selection.selected_by
        if backend is None:
            if model.attention == "mla":
                backend = requested or _default_mla_backend(flags, line, block_size)
            else:
                backend = _gqa_backend(requested, flags, line, has_sinks=bool(model.sinks))
        chosen = (backend,)
    for backend in chosen:
        if backend not in backends:
            # vLLM chose a backend kprecompile has no rules for: say so rather than plan nothing.
            raise InputError("attention backend", backend, f"one of {', '.join(backends)} (vLLM {release} selected it)")
    backend = ", ".join(chosen)
    if model.attention == "mla":
        bmm = _absorbed_bmm_choices(model, dtype or model.torch_dtype, flags, release)
        choices = _mla_choices(chosen[0], flags, line, release, bmm)
    else:
        # A model whose layers take different backends plans each backend's families.
        planned: dict[FamilyName, FamilyChoice] = {}
        for layer_backend in chosen:
            for choice in _gqa_choices(layer_backend, release):
                planned.setdefault(choice.family, choice)
        choices = tuple(planned.values())
    if model.fp8_block_size is not None:
        choices += (_block_fp8_linear(flags, line, release),)
    nvidia = tuple(target.name for target in targets if not target.is_rocm)
    if nvidia:
        # vLLM selects per platform, and its config modules keep the platform they were first
        # imported under: one process traces one platform's vLLM kernels.
        reason = (
            f"vLLM selects its attention backend and binds its platform per platform: plan NVIDIA targets "
            f"in a request of their own (--target {nvidia[0]})"
        )
        skipped = tuple((name, reason) for name in nvidia)
        vllm_kernels = ("triton_attn", "triton_mla")
        choices = tuple(
            replace(choice, skip_targets=choice.skip_targets + skipped) if choice.family in vllm_kernels else choice
            for choice in choices
        )
    return Selection(engine, backend, flags, _filtered(model, choices, families), release, selected_by)


def _cuda_priorities(model: ModelConfig, line: ReleaseLine, target: Target) -> tuple[str, ...]:
    sm100 = int(target.arch) // 10 == 10
    if model.attention == "mla":
        return line.cuda_mla_priorities_sm100 if sm100 else line.cuda_mla_priorities
    return line.cuda_gqa_priorities_sm100 if sm100 else line.cuda_gqa_priorities


def _cuda_takes(backend: str, target: Target) -> bool:
    majors = _CUDA_CAPABILITIES[backend]
    return majors is None or int(target.arch) // 10 in majors


def _cuda_backend(model: ModelConfig, line: ReleaseLine, target: Target) -> str:
    """vLLM's CUDA selection without a backend named: the first of its priority list whose
    compute-capability rule takes the target (for the usual head sizes and dtypes)."""
    return next(backend for backend in _cuda_priorities(model, line, target) if _cuda_takes(backend, target))


def _cuda_choices(
    model: ModelConfig,
    field: str,
    requested: str | None,
    line: ReleaseLine,
    release: str,
    targets: Sequence[Target],
    flags: dict[str, bool],
    layer_backends: tuple[str, ...] = (),
) -> tuple[FamilyChoice, ...]:
    """The families vLLM runs for `model` on these NVIDIA targets (module doc); `layer_backends`:
    what vLLM's own model chose for its layers, where it was built."""
    kind = "multi-head latent attention" if model.attention == "mla" else "grouped-query attention"
    triton = "TRITON_MLA" if model.attention == "mla" else "TRITON_ATTN"
    if layer_backends:
        backend = triton if triton in layer_backends else layer_backends[0]
    elif requested is not None:
        for target in targets:
            valid = [backend for backend in _cuda_priorities(model, line, target) if _cuda_takes(backend, target)]
            if requested not in valid:
                expected = f"one of {', '.join(valid)} for {model.name}'s {kind} on {target.name} in vLLM {release}"
                raise InputError(field, requested, expected)
        backend = requested
    else:
        chosen = {target.name: _cuda_backend(model, line, target) for target in targets}
        if len(set(chosen.values())) > 1:
            answer = ", ".join(f"{backend} on {name}" for name, backend in chosen.items())
            raise InputError("--target", ",".join(chosen), f"targets vLLM gives one backend; it selects {answer}")
        backend = next(iter(chosen.values()))
    family: FamilyName = "triton_mla" if model.attention == "mla" else "triton_attn"
    if backend != triton:
        reason = (
            f"{backend} runs {_CUDA_RUNS.get(backend, 'other kernels')}, not Triton: kprecompile plans Triton kernels "
            f"(--attention-backend {triton} runs vLLM's own)"
        )
        choice = FamilyChoice(family, backend, reason)
    else:
        choice = _vllm_kernels(family, backend, release)
    choices: tuple[FamilyChoice, ...] = (choice,)
    if model.fp8_block_size is not None:
        choices += (_cuda_block_fp8_linear(line, release, targets, flags),)
    return choices


def _cuda_block_fp8_linear(
    line: ReleaseLine, release: str, targets: Sequence[Target], flags: dict[str, bool]
) -> FamilyChoice:
    """vLLM's block-FP8 linear layers on NVIDIA GPUs (asked of its linear method in
    tests/vllm_linear_probe.py): from sm90 CUTLASS, or DeepGEMM where installed; below sm89
    Marlin's weight-only FP8; on sm89 the line's `cuda_sm89_block_fp8`. Batch-invariant mode turns
    Marlin off and adds vLLM's own Triton matmul kernels: not planned."""
    # vLLM's compiled CUTLASS query, as kprecompile's stand-in answers it on a builder.
    from ..shapes.block_fp8_linear import CUTLASS_BLOCK_FP8_FROM

    if flags["VLLM_BATCH_INVARIANT"]:
        reason = (
            "with VLLM_BATCH_INVARIANT=1 vLLM takes its batch-invariant linear paths (no Marlin; its own "
            "Triton kernels), which kprecompile does not plan"
        )
        return FamilyChoice("block_fp8_linear", "Fp8LinearMethod", reason)
    cutlass = (
        "vLLM runs block-FP8 linear layers with CUTLASS from sm90: nothing to compile for Triton (DeepGEMM, "
        "where installed, JIT-builds its own CUDA kernels)"
    )
    marlin = f"vLLM {release} runs block-FP8 linear layers with Marlin's weight-only FP8 on {{}}: nothing to compile"
    skipped = []
    for target in targets:
        if int(target.arch) >= CUTLASS_BLOCK_FP8_FROM:
            skipped.append((target.name, cutlass))
        elif int(target.arch) < 89 or line.cuda_sm89_block_fp8 == "marlin":
            skipped.append((target.name, marlin.format(target.name)))
    if len(skipped) == len(targets):
        return FamilyChoice("block_fp8_linear", "Fp8LinearMethod", "; ".join(dict.fromkeys(r for _, r in skipped)))
    return replace(_vllm_kernels("block_fp8_linear", "Fp8LinearMethod", release), skip_targets=tuple(skipped))


def _filtered(
    model: ModelConfig, choices: tuple[FamilyChoice, ...], families: Sequence[str]
) -> tuple[FamilyChoice, ...]:
    if not families:
        return choices
    available = [choice.family for choice in choices]
    for family in families:
        if family not in available:
            raise InputError("--family", family, f"one of {', '.join(available)} for {model.name}")
    return tuple(choice for choice in choices if choice.family in families)


def _aiter_choices(model: ModelConfig) -> tuple[FamilyChoice, ...]:
    if model.attention == "mla":
        return tuple(FamilyChoice(family, AITER_API) for family in ("fp8_bmm", "mla_decode", "mla_prefill"))
    return (FamilyChoice("pa_prefill", AITER_API),)


def _default_mla_backend(flags: dict[str, bool], line: ReleaseLine, block_size: int) -> str:
    aiter_mla = flags["VLLM_ROCM_USE_AITER"] and flags["VLLM_ROCM_USE_AITER_MLA"]
    if aiter_mla or (line.aiter_mla_for_block_size_1 and block_size == 1):
        return "ROCM_AITER_MLA"
    return "TRITON_MLA"


def _gqa_backend(requested: str | None, flags: dict[str, bool], line: ReleaseLine, has_sinks: bool = False) -> str:
    """vLLM's ROCm selector for multi-head / grouped-query attention, by the line's `gqa_rule`;
    `has_sinks`: the layers carry attention sinks (vLLM asks with `has_sink`)."""
    aiter = flags["VLLM_ROCM_USE_AITER"]
    mha, unified = aiter and flags["VLLM_ROCM_USE_AITER_MHA"], aiter and flags["VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION"]
    # The split by its variable up to 0.14; from 0.15 by --attention-config, which is not mirrored.
    prefill_decode = flags["VLLM_V1_USE_PREFILL_DECODE_ATTENTION"] and line.backend_variable
    if line.gqa_rule == "aiter_flags_first":
        # The flags first, also when a backend is named: AITER's MHA wins over it.
        if mha or requested == "ROCM_AITER_FA":
            return "ROCM_AITER_FA"
        if unified or requested == "ROCM_AITER_UNIFIED_ATTN":
            return "ROCM_AITER_UNIFIED_ATTN"
        if prefill_decode or requested == "ROCM_ATTN":
            return "ROCM_ATTN"
        return "TRITON_ATTN"
    if requested:
        return requested
    if line.gqa_rule == "aiter_flags_list":
        # The first valid of AITER's unified attention, AITER's MHA (no sinks before 0.23), the
        # split, TRITON_ATTN.
        if unified:
            return "ROCM_AITER_UNIFIED_ATTN"
        if mha and (not has_sinks or line.aiter_fa_sinks):
            return "ROCM_AITER_FA"
        return "ROCM_ATTN" if prefill_decode else "TRITON_ATTN"
    if line.gqa_rule == "priority_list":
        # The first valid backend of the priority list: ROCM_ATTN for the usual head sizes. It takes
        # no sinks: then AITER's FA with its MHA flag (where the line's takes sinks), else AITER's
        # unified attention (where AITER is installed, as in vLLM's ROCm images).
        if not has_sinks:
            return "ROCM_ATTN"
        return "ROCM_AITER_FA" if mha and line.aiter_fa_sinks else "ROCM_AITER_UNIFIED_ATTN"
    if unified:
        return "ROCM_AITER_UNIFIED_ATTN"
    if mha:
        return "ROCM_AITER_FA"
    return "ROCM_ATTN" if prefill_decode else "TRITON_ATTN"


# `mla_merge` "compiled_on_cdna3": the merge vLLM runs is not Triton.
_COMPILED_MERGE = (
    "vLLM 0.32 and newer merge prefill results with their compiled merge_attn_states on CDNA3 and newer "
    "(gfx942, gfx950): nothing to compile (gfx90a's Triton merge is not planned)"
)


def _absorbed_bmm_choices(
    model: ModelConfig, dtype: str, flags: dict[str, bool], release: str
) -> tuple[FamilyChoice, FamilyChoice]:
    """How vLLM multiplies MLA's absorbed weights: AITER's FP4 BMM on gfx950 where kv_b_proj's
    weight is bf16 (as vLLM's build of the layers says, else the config's reading) and the release
    reads VLLM_ROCM_USE_AITER_FP4BMM (0.15 on); else AITER's FP8 BMM with its flag; else torch.bmm.
    Both flags default to off from 0.33 (`inputs/flag_defaults.py`)."""
    aiter = flags["VLLM_ROCM_USE_AITER"]
    reads_fp4 = FP4_BMM_FLAG in release_defaults(release)
    # vLLM's own build says what kv_b_proj holds (a quantized checkpoint may leave it bf16);
    # without it, the config's reading.
    built = {layer.kv_b_proj_dtype for layer in model.attention_layers if layer.mla} - {""}
    bf16_weights = (built or {kv_b_proj_dtype(model, dtype)}) == {"bfloat16"}
    fp4 = aiter and reads_fp4 and flags[FP4_BMM_FLAG] and bf16_weights
    if fp4:
        fp4_choice = FamilyChoice("fp4_bmm", FP4_BMM_FLAG)
    else:
        if not reads_fp4:
            reason = f"vLLM {release} has no FP4 BMM for MLA (0.15 and newer)"
        elif not bf16_weights:
            if built:
                holds = f"vLLM builds it {', '.join(sorted(built))}"
            elif model.quantized:
                holds = "a quantized checkpoint"
            else:
                holds = dtype
            reason = f"vLLM runs AITER's FP4 BMM only where kv_b_proj's weight is bf16 ({model.name}: {holds})"
        else:
            reason = _flag_off("FP4 BMM", FP4_BMM_FLAG, release)
        fp4_choice = FamilyChoice("fp4_bmm", "torch bmm", reason)
    if aiter and flags["VLLM_ROCM_USE_AITER_FP8BMM"]:
        where = "every GPU" if release_line(release).fp4_bmm_targets == "every" else "gfx950"
        why = f"vLLM {release} runs AITER's FP4 BMM on {where} for {model.name}'s bf16 kv_b_proj ({FP4_BMM_FLAG})"
        if fp4 and where == "every GPU":
            fp8_choice = FamilyChoice("fp8_bmm", "torch bmm", why)
        else:
            fp8_choice = FamilyChoice(
                "fp8_bmm", "VLLM_ROCM_USE_AITER_FP8BMM", skip_targets=(("gfx950", why),) if fp4 else ()
            )
    else:
        fp8_choice = FamilyChoice("fp8_bmm", "torch bmm", _flag_off("FP8 BMM", "VLLM_ROCM_USE_AITER_FP8BMM", release))
    return fp8_choice, fp4_choice


def _flag_off(kernel: str, flag: str, release: str) -> str:
    default = release_defaults(release).get(flag, "1")
    return (
        f"vLLM runs AITER's {kernel} only with VLLM_ROCM_USE_AITER=1 and {flag}=1 "
        f"(vLLM {release} defaults it to {default})"
    )


def _mla_choices(
    backend: str, flags: dict[str, bool], line: ReleaseLine, release: str, bmm: tuple[FamilyChoice, ...]
) -> tuple[FamilyChoice, ...]:
    choices = list(bmm)
    if backend == "TRITON_MLA":
        choices.append(_vllm_kernels("triton_mla", backend, release))
        return tuple(choices)
    # Both AITER MLA backends decode with AITER's mla_decode_fwd: assembly stage 1, then a Triton
    # stage-2 reduce or (`aiter_mla_triton_reduce` off) AITER's persistent HIP reduce.
    if not line.aiter_mla_triton_reduce:
        reason = f"{backend} in vLLM 0.19 and newer reduces MLA decode splits with AITER's HIP kernel: no Triton"
        choices.append(FamilyChoice("mla_decode", backend, reason))
    else:
        choices.append(FamilyChoice("mla_decode", backend))
    if backend == "ROCM_AITER_TRITON_MLA":
        choices.append(FamilyChoice("mla_prefill", backend))
    else:
        reason = f"{backend} runs AITER's prebuilt CK flash-attention kernels (ROCM_AITER_TRITON_MLA runs Triton's)"
        choices.append(FamilyChoice("mla_prefill", backend, reason))
    # Around either prefill, on steps with cached context: vLLM's merge of the partial results.
    if line.mla_merge == "compiled_on_cdna3":
        choices.append(FamilyChoice("mla_merge", backend, _COMPILED_MERGE))
    else:
        choices.append(_vllm_kernels("mla_merge", backend, release))
    return tuple(choices)


def _vllm_kernels(family: FamilyName, backend: str, release: str) -> FamilyChoice:
    """A family of vLLM's own kernels: traced from the installed vLLM, which must be `release`."""
    installed = installed_release()
    if installed == release:
        return FamilyChoice(family, backend)
    where = "an installed vLLM" if installed is None else f"the installed vLLM, which is {installed}"
    reason = (
        f"{backend} runs vLLM's own Triton kernels, traced from {where}: "
        f"kprecompile engine install vllm=={release}, then --vllm-version {release}"
    )
    return FamilyChoice(family, backend, reason, missing=f"vllm=={release}")


def _block_fp8_linear(flags: dict[str, bool], line: ReleaseLine, release: str) -> FamilyChoice:
    """vLLM's block-FP8 linear layers on ROCm. With VLLM_ROCM_USE_AITER and
    VLLM_ROCM_USE_AITER_LINEAR (on by default), what the line's `aiter_block_fp8` says: AITER's CK
    GEMM on gfx942 (e4m3fnuz) and vLLM's Triton GEMM elsewhere, or AITER on every arch. Without
    AITER's linear path, vLLM's Triton GEMM."""
    aiter_linear = flags["VLLM_ROCM_USE_AITER"] and flags["VLLM_ROCM_USE_AITER_LINEAR"]
    choice = _vllm_kernels("block_fp8_linear", "Fp8LinearMethod", release)
    if not aiter_linear:
        return choice
    if line.aiter_block_fp8 == "vllm_tuned_list":
        reason = (
            f"vLLM {release} runs block-FP8 linear layers through AITER with VLLM_ROCM_USE_AITER_LINEAR=1: "
            "AITER's CK GEMM, except on gfx950 for the (N, K) of vLLM's own list (is_triton_gemm_w8a8_tuned: "
            "DeepSeek-V3's shapes among them), which run AITER's Triton GEMM after vLLM's Triton group "
            "quantization; kprecompile does not trace those, which compile on first use (with "
            "VLLM_ROCM_USE_AITER_LINEAR=0, vLLM's Triton GEMM: planned)"
        )
        return FamilyChoice("block_fp8_linear", "AITER", reason)
    if line.aiter_block_fp8 == "aiter_blockscale":
        return FamilyChoice("block_fp8_linear", "AiterFp8BlockScaledMMKernel", _aiter_blockscale_reason())
    reason = (
        f"vLLM {release} runs block-FP8 linear layers on gfx942 through AITER's CK blockscale GEMM with "
        "VLLM_ROCM_USE_AITER_LINEAR=1 (its rule needs e4m3fnuz): nothing to compile"
    )
    return replace(choice, skip_targets=(("gfx942", reason),))


def _aiter_blockscale_reason() -> str:
    """`aiter_block_fp8` "aiter_blockscale" (vLLM 0.31 and newer) with AITER's linear path
    (`AiterFp8BlockScaledMMKernel`, as its linear method chooses it in tests/vllm_linear_probe.py):
    AITER's Triton GEMM on gfx950 only for (N, K) that AITER's tuned-config lookup lists, else its
    CK GEMM; the activation quantization is AITER's HIP group quantization (or Inductor's code
    under torch.compile)."""
    from ..shapes.block_fp8_linear import AITER_TUNED_LOOKUP, aiter_has_tuned_lookup, installed_aiter

    head = (
        "vLLM 0.31 and newer run block-FP8 linear layers through AITER with VLLM_ROCM_USE_AITER_LINEAR=1: "
        "AITER's CK GEMM on gfx942 (e4m3fnuz) and, on gfx950, for every (N, K) AITER's Triton GEMM is not "
        "tuned for, after AITER's HIP group quantization"
    )
    tail = "(with VLLM_ROCM_USE_AITER_LINEAR=0, vLLM's Triton GEMM: planned)"
    if not aiter_has_tuned_lookup():
        return (
            f"{head}; vLLM asks {AITER_TUNED_LOOKUP} which shapes are tuned, and the installed "
            f"amd-aiter {installed_aiter()} has no such module, so every layer runs CK: nothing to compile "
            f"{tail}"
        )
    return (
        f"{head}; the installed amd-aiter {installed_aiter()} lists tuned shapes ({AITER_TUNED_LOOKUP}), "
        "and their Triton GEMM is not traced yet (kprecompile is tested with amd-aiter 0.1.7.post2.dev18, "
        f"which has no such module) {tail}"
    )


def _gqa_choices(backend: str, release: str) -> tuple[FamilyChoice, ...]:
    if backend == "ROCM_ATTN":
        return (_vllm_kernels("rocm_attn", backend, release),)
    if backend == "TRITON_ATTN":
        # Traced as the line's `tracing` says (`triton_attn.py`).
        return (_vllm_kernels("triton_attn", backend, release),)
    # AITER's backends: unified attention is Triton; FA is prebuilt, with vLLM's own Triton kernels
    # around its prefill on steps with cached context.
    if backend != "ROCM_AITER_FA":
        return (FamilyChoice("prefix_prefill", backend), FamilyChoice("paged_decode", backend))
    reason = f"{backend} runs AITER's prebuilt CK/assembly attention (ROCM_AITER_UNIFIED_ATTN runs Triton's)"
    # Traced as the line's `tracing` says (`aiter_fa_context.py`; the engine's step also sends some
    # decodes to AITER's Triton unified attention).
    context = _vllm_kernels("aiter_fa_context", backend, release)
    return (FamilyChoice("prefix_prefill", backend, reason), FamilyChoice("paged_decode", backend, reason), context)
