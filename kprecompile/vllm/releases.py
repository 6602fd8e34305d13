"""vLLM releases: what changes between them that decides which kernels run and the cache key.

kprecompile plans for a named release: the installed vLLM's where vLLM is importable,
`--vllm-version` on a builder without it, else `DEFAULT_RELEASE`. Releases fall into lines
that share their rules; each line is one `ReleaseLine` record in `RELEASE_LINES`, whose fields
say every rule kprecompile mirrors (the ROCm and CUDA backend selection in `selection/engines.py`,
the default CUDA-graph capture sizes here, how the families of vLLM's own kernels trace in
`shapes/`). Code reads a field, never compares versions: adding a line is one record and its
tests (tests/test_release_lines.py walks every record; tests/test_vllm.py checks the mirrors
against the real code of every tested release). Where each rule was read in vLLM's sources:
docs/engine-kernels.md, "vLLM release lines".
"""

from __future__ import annotations

import bisect
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata
from typing import TYPE_CHECKING, Literal

from ..errors import InputError

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..inputs.models import ModelConfig
    from ..inputs.serving import ServingParams
    from ..inputs.targets import Target

# Tested against these in every CI run, one per Triton series, each on the Triton its torch pins
# (scripts/install_vllm.py installs them): 0.12.0 (Triton 3.5.0) pairs with the installed
# amd-aiter; 0.25.1 (3.6.0) is the 0.23 line's, the H200 host's toolchain; 0.31.0 (3.7.1) the 0.27
# to 0.31 lines' Triton (its tests of a ROCm server skip where the registry's AITER lacks what its
# ROCM_AITER_FA imports: docs/release-matrix.md); 0.33.0 (3.8.0) the newest on the registry. The
# others, 0.11.2 included (Triton 3.5.0 as 0.12.0), run on demand (scripts/release_matrix.py):
# five releases' tests inside vLLM no longer fit CI's 90 minutes on 2 cores.
TESTED_RELEASES = ("0.12.0", "0.25.1", "0.31.0", "0.33.0")
DEFAULT_RELEASE = "0.12.0"
FIELD = "--vllm-version"

# How vLLM's ROCm selector picks a GQA backend when no `--attention-backend` decides:
# - "aiter_flags_first": AITER's MHA flag, then the unified-attention flag, then
#   VLLM_V1_USE_PREFILL_DECODE_ATTENTION, each before a named backend; else TRITON_ATTN.
# - "named_then_unified_flag": a named backend, then the unified-attention flag, AITER's MHA
#   flag, the prefill/decode split (VLLM_V1_USE_PREFILL_DECODE_ATTENTION up to 0.14, then
#   --attention-config's use_prefill_decode_attention); else TRITON_ATTN.
# - "aiter_flags_list": a named backend, else the first valid backend of a list: AITER's unified
#   attention, AITER's MHA (each by its flags), the prefill/decode split, TRITON_ATTN (0.18).
# - "priority_list": a named backend, else the first valid backend of vLLM's priority list
#   (ROCM_ATTN for the usual head sizes, whatever the flags).
GqaRule = Literal["aiter_flags_first", "named_then_unified_flag", "aiter_flags_list", "priority_list"]
# How a vLLM family's step is traced: a call site kprecompile builds from the step (the
# backend's metadata record, a KV cache in the shape the backend declares), or the engine's own
# step (vLLM's `VllmConfig`, the backend's metadata builder, the per-layer KV-cache view).
Tracing = Literal["call_site", "engine_step"]
# TRITON_MLA's decode entry point: `_forward_decode` (4 KV splits) or `forward_mqa` (4 splits up to
# 0.19; from 0.20 splits from the step's longest context).
TritonMlaDecode = Literal["forward_decode", "forward_mqa"]
# How vLLM merges the partial results of a prefill with cached context on ROCm: its Triton
# `merge_attn_states`, or its compiled operator on CDNA3 and newer (gfx90a's Triton not planned).
MlaMerge = Literal["triton", "compiled_on_cdna3"]
# What runs block-FP8 linear layers on sm89: vLLM's Triton GEMM, or Marlin's weight-only FP8.
Sm89BlockFp8 = Literal["triton_gemm", "marlin"]
# What AITER's linear path (VLLM_ROCM_USE_AITER_LINEAR) runs block-FP8 linear layers with: AITER's
# CK GEMM on e4m3fnuz GPUs (gfx942) and vLLM's Triton GEMM elsewhere (up to 0.12); AITER on every
# arch, its Triton GEMM on gfx950 for the (N, K) of vLLM's own list (`is_triton_gemm_w8a8_tuned`),
# else CK (0.13 to 0.30); the same where AITER's tuned configs list (N, K) (from 0.31).
AiterBlockFp8 = Literal["ck_on_gfx942", "vllm_tuned_list", "aiter_blockscale"]
# How ROCM_AITER_FA decodes a windowed layer's one-token steps: AITER's Triton unified attention;
# AITER's prebuilt paged attention, which takes the window; or (0.33) that paged kernel on a block
# table trimmed to the window where the heads are 64 or more and there are no sinks, else unified.
WindowedDecode = Literal["unified", "paged", "trimmed_paged"]
# Which uniform decode batches vLLM captures beside its size grid when no sizes are given:
# none; with speculative decoding, each standard request count x the query length; those, and
# without speculation max-num-seqs itself; (0.34) prefill and decode graphs sized apart, decode
# by request counts (`_split_capture_sizes`).
# Where vLLM runs AITER's FP4 BMM for bf16 MLA weights: every GPU (0.15, 0.16: on gfx942 AITER's
# wrapper then asserts MXFP4 support), or CDNA4 only (0.17 on).
Fp4BmmTargets = Literal["every", "cdna4"]
CaptureDecodes = Literal["none", "speculative", "speculative_and_max_num_seqs", "split_prefill_decode"]

# vLLM's CUDA priority lists (`_get_backend_priorities`), without the sparse-MLA backends and
# those for multimodal prefixes: below sm100, and on sm100.
CUDA_MLA = ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA")
CUDA_MLA_SM100 = ("CUTLASS_MLA", "FLASHINFER_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")
CUDA_GQA = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
CUDA_GQA_SM100 = ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION")


@dataclass(frozen=True)
class ReleaseLine:
    """The rules one line of vLLM releases shares: from `since` up to the next line's."""

    # The line's name: the major.minor of its first release.
    name: str
    # Its first release (0.11.0 and 0.11.1 named the unified flag differently: not mirrored).
    since: tuple[int, int, int]
    # Whether vLLM reads its attention variables, VLLM_ATTENTION_BACKEND and
    # VLLM_V1_USE_PREFILL_DECODE_ATTENTION (up to 0.14; from 0.15 --attention-backend and
    # --attention-config only, which EngineArgs takes from 0.13).
    backend_variable: bool
    # The ROCm backends offered to MLA models (0.12 brought ROCM_AITER_TRITON_MLA).
    rocm_mla_backends: tuple[str, ...]
    # The ROCm backends offered to GQA models (the same four since 0.11).
    rocm_gqa_backends: tuple[str, ...]
    # How the ROCm selector picks a GQA backend (`GqaRule`: 0.11 flags first, 0.12 named, 0.18 a
    # list by AITER's flags, 0.19 vLLM's priority list).
    gqa_rule: GqaRule
    # Whether pages of one token take ROCM_AITER_MLA with AITER's MLA off (up to 0.17; gone with 0.18's list).
    aiter_mla_for_block_size_1: bool
    # vLLM's CUDA priority list for MLA below sm100 (the same since 0.11).
    cuda_mla_priorities: tuple[str, ...]
    # vLLM's CUDA priority list for MLA on sm100 (0.15 put FLASHINFER_MLA first, 0.21 TOKENSPEED_MLA second).
    cuda_mla_priorities_sm100: tuple[str, ...]
    # vLLM's CUDA priority list for GQA below sm100 (the same since 0.11).
    cuda_gqa_priorities: tuple[str, ...]
    # vLLM's CUDA priority list for GQA on sm100 (FLASHINFER first since 0.11).
    cuda_gqa_priorities_sm100: tuple[str, ...]
    # Whether the largest default capture size scales with 1 + speculative tokens (0.13).
    capture_scales_with_speculation: bool
    # Whether a max-num-batched-tokens under the ceiling is captured as well (0.20).
    capture_batched_tokens: bool
    # The default capture ceiling on sm100-family GPUs (1024 from 0.28, 8192 tokens from 0.34;
    # 512 elsewhere, always).
    capture_ceiling_sm100: int
    # Which decode batches are captured beside the size grid (`CaptureDecodes`: 0.29, 0.31).
    capture_decodes: CaptureDecodes
    # How TRITON_ATTN's and ROCM_AITER_FA's steps are traced (`Tracing`: the engine's own step from 0.19).
    tracing: Tracing
    # TRITON_MLA's decode entry point (`TritonMlaDecode`: `forward_mqa` from 0.16).
    triton_mla_decode: TritonMlaDecode
    # Whether TRITON_MLA takes an FP8 KV cache (0.18; refused up to 0.17).
    triton_mla_fp8_kv_cache: bool
    # Whether AITER's MLA decode reduces its splits with a Triton stage 2 (up to 0.18; 0.19: HIP).
    aiter_mla_triton_reduce: bool
    # How MLA prefills with cached context merge partial results (`MlaMerge`: compiled from 0.32).
    mla_merge: MlaMerge
    # What runs block-FP8 linear layers on sm89 (`Sm89BlockFp8`: Marlin from 0.29, which stops refusing sm89).
    cuda_sm89_block_fp8: Sm89BlockFp8
    # What AITER's linear path runs block-FP8 linear layers with (`AiterBlockFp8`: 0.13 every arch
    # by vLLM's list, 0.31 by AITER's tuned configs).
    aiter_block_fp8: AiterBlockFp8
    # How ROCM_AITER_FA decodes a windowed layer's one-token steps (`WindowedDecode`: 0.11 paged,
    # 0.12 unified, 0.18 paged, 0.23 unified, 0.33 trimmed paged).
    aiter_fa_windowed_decode: WindowedDecode
    # Whether ROCM_AITER_FA takes layers with attention sinks (0.23; before, vLLM's list passes it
    # over for them: AITER's unified attention where AITER is found).
    aiter_fa_sinks: bool
    # Where AITER's FP4 BMM replaces the FP8 BMM for bf16 MLA weights (`Fp4BmmTargets`): every GPU
    # in 0.15 and 0.16, CDNA4 (gfx950) from 0.17.
    fp4_bmm_targets: Fp4BmmTargets = "cdna4"

    @property
    def first_release(self) -> str:
        return ".".join(map(str, self.since))


_LINE_0_11 = ReleaseLine(
    name="0.11",
    since=(0, 11, 2),
    backend_variable=True,
    rocm_mla_backends=("ROCM_AITER_MLA", "TRITON_MLA"),
    rocm_gqa_backends=("ROCM_AITER_UNIFIED_ATTN", "ROCM_AITER_FA", "TRITON_ATTN", "ROCM_ATTN"),
    gqa_rule="aiter_flags_first",
    aiter_mla_for_block_size_1=True,
    cuda_mla_priorities=CUDA_MLA,
    cuda_mla_priorities_sm100=CUDA_MLA_SM100,
    cuda_gqa_priorities=CUDA_GQA,
    cuda_gqa_priorities_sm100=CUDA_GQA_SM100,
    capture_scales_with_speculation=False,
    capture_batched_tokens=False,
    capture_ceiling_sm100=512,
    capture_decodes="none",
    tracing="call_site",
    triton_mla_decode="forward_decode",
    triton_mla_fp8_kv_cache=False,
    aiter_mla_triton_reduce=True,
    mla_merge="triton",
    cuda_sm89_block_fp8="triton_gemm",
    aiter_block_fp8="ck_on_gfx942",
    aiter_fa_windowed_decode="paged",
    aiter_fa_sinks=False,
)
# Each later line: the one before it, with what its first release changed.
_LINE_0_12 = replace(
    _LINE_0_11,
    name="0.12",
    since=(0, 12, 0),
    rocm_mla_backends=("ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA", "TRITON_MLA"),
    gqa_rule="named_then_unified_flag",
    aiter_fa_windowed_decode="unified",
)
_LINE_0_13 = replace(
    _LINE_0_12,
    name="0.13",
    since=(0, 13, 0),
    capture_scales_with_speculation=True,
    tracing="engine_step",
    aiter_block_fp8="vllm_tuned_list",
)
# 0.15: the attention variables gone; FLASHINFER_MLA first on sm100.
_LINE_0_15 = replace(
    _LINE_0_13,
    name="0.15",
    since=(0, 15, 0),
    backend_variable=False,
    cuda_mla_priorities_sm100=("FLASHINFER_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"),
    fp4_bmm_targets="every",
)
_LINE_0_16 = replace(_LINE_0_15, name="0.16", since=(0, 16, 0), triton_mla_decode="forward_mqa")
_LINE_0_17 = replace(_LINE_0_16, name="0.17", since=(0, 17, 0), fp4_bmm_targets="cdna4")
_LINE_0_18 = replace(
    _LINE_0_17,
    name="0.18",
    since=(0, 18, 0),
    gqa_rule="aiter_flags_list",
    aiter_mla_for_block_size_1=False,
    aiter_fa_windowed_decode="paged",
    triton_mla_fp8_kv_cache=True,
)
_LINE_0_19 = replace(_LINE_0_18, name="0.19", since=(0, 19, 0), gqa_rule="priority_list", aiter_mla_triton_reduce=False)
# max-num-batched-tokens captured from 0.20.1 (0.20.0's `_set_cudagraph_sizes` does not add it).
_LINE_0_20 = replace(_LINE_0_19, name="0.20", since=(0, 20, 1), capture_batched_tokens=True)
_LINE_0_21 = replace(
    _LINE_0_20,
    name="0.21",
    since=(0, 21, 0),
    cuda_mla_priorities_sm100=(
        "FLASHINFER_MLA",
        "TOKENSPEED_MLA",
        "CUTLASS_MLA",
        "FLASH_ATTN_MLA",
        "FLASHMLA",
        "TRITON_MLA",
    ),
)
_LINE_0_23 = replace(_LINE_0_21, name="0.23", since=(0, 23, 0), aiter_fa_sinks=True, aiter_fa_windowed_decode="unified")
_LINE_0_28 = replace(_LINE_0_23, name="0.28", since=(0, 28, 0), capture_ceiling_sm100=1024)
_LINE_0_29 = replace(
    _LINE_0_28, name="0.29", since=(0, 29, 0), capture_decodes="speculative", cuda_sm89_block_fp8="marlin"
)
_LINE_0_31 = replace(
    _LINE_0_29,
    name="0.31",
    since=(0, 31, 0),
    capture_decodes="speculative_and_max_num_seqs",
    aiter_block_fp8="aiter_blockscale",
)
_LINE_0_32 = replace(_LINE_0_31, name="0.32", since=(0, 32, 0), mla_merge="compiled_on_cdna3")
_LINE_0_33 = replace(_LINE_0_32, name="0.33", since=(0, 33, 0), aiter_fa_windowed_decode="trimmed_paged")
_LINE_0_34 = replace(
    _LINE_0_33, name="0.34", since=(0, 34, 0), capture_ceiling_sm100=8192, capture_decodes="split_prefill_decode"
)
# Every line, oldest first: a release belongs to the last line whose `since` it reaches.
RELEASE_LINES: tuple[ReleaseLine, ...] = (
    _LINE_0_11,
    _LINE_0_12,
    _LINE_0_13,
    _LINE_0_15,
    _LINE_0_16,
    _LINE_0_17,
    _LINE_0_18,
    _LINE_0_19,
    _LINE_0_20,
    _LINE_0_21,
    _LINE_0_23,
    _LINE_0_28,
    _LINE_0_29,
    _LINE_0_31,
    _LINE_0_32,
    _LINE_0_33,
    _LINE_0_34,
)

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def release_line(release: str, field: str = FIELD) -> ReleaseLine:
    """The line `release` belongs to; an input error for what is not a vLLM release kprecompile knows."""
    match = _VERSION.match(release)
    version = (int(match[1]), int(match[2]), int(match[3] or 0)) if match else None
    lines = [line for line in RELEASE_LINES if version is not None and version >= line.since]
    if not lines:
        oldest = RELEASE_LINES[0].first_release
        raise InputError(
            field, release, f"a vLLM release, {oldest} or newer (tested: " + ", ".join(TESTED_RELEASES) + ")"
        )
    return lines[-1]


def installed_release() -> str | None:
    """The installed vLLM's version, or None where vLLM is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def resolve_release(requested: str | None) -> str:
    """The release to plan for: `requested`, else the installed vLLM's, else the default.

    An installed release kprecompile was not tested against is followed: planned for with its
    line's rules and its own code, after one WARNING naming the nearest tested release."""
    if requested:
        release_line(requested, FIELD)
        return requested
    installed = installed_release()
    if installed is None:
        return DEFAULT_RELEASE
    warn_if_untested(installed)
    return installed


_WARNED: set[str] = set()


def warn_if_untested(installed: str, log: logging.Logger = logger) -> None:
    """One WARNING per process where the installed vLLM is not a tested release (it is followed)."""
    line = release_line(installed, "vllm")
    if installed in TESTED_RELEASES or installed in _WARNED:
        return
    _WARNED.add(installed)
    log.warning(
        "vLLM %s is installed, which kprecompile was not tested against: planning for it with its own code "
        "and the rules of its line (%s), as for the nearest tested release, %s",
        installed,
        line.name,
        nearest_tested_release(installed),
    )


def nearest_tested_release(release: str) -> str:
    """The tested release closest to `release` (the newer of two equally close)."""

    def position(text: str) -> int:
        match = _VERSION.match(text)
        assert match is not None, text
        return int(match[1]) * 1_000_000 + int(match[2]) * 1_000 + int(match[3] or 0)

    return min(TESTED_RELEASES, key=lambda tested: (abs(position(tested) - position(release)), -position(tested)))


def _standard_sizes(largest: int) -> list[int]:
    """vLLM's candidate sizes up to `largest`: 1, 2, 4, steps of 8 below 256, of 16 from 256."""
    sizes = [size for size in (1, 2, 4) if size <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8))
    sizes += list(range(256, largest + 1, 16))
    return sizes


# Models whose vLLM config class raises the default capture ceiling when the user names neither
# sizes nor a ceiling (vLLM's `model_executor/models/config.py`, every tested release).
MODEL_CAPTURE_CEILINGS = {"GptOssForCausalLM": 1024}


def capture_sizes(
    release: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    decode_query_len: int,
    ceiling: int | None = None,
    target: Target | None = None,
) -> tuple[int, ...]:
    """The CUDA-graph capture sizes `release` chooses on `target` (None: not an sm100-family GPU)
    when the user names none; `ceiling` is the largest size a model's config class sets (decode
    sizes are then not added)."""
    line = release_line(release, "vllm")
    if line.capture_decodes == "split_prefill_decode":
        return _split_capture_sizes(release, max_num_seqs, max_num_batched_tokens, decode_query_len, ceiling, target)
    per_seq = decode_query_len if line.capture_scales_with_speculation else 1
    sm100 = target is not None and not target.is_rocm and int(target.arch) // 10 == 10
    default = line.capture_ceiling_sm100 if sm100 else 512
    largest = min(max_num_seqs * per_seq * 2, default) if ceiling is None else ceiling
    decode_sizes: list[int] = []
    if line.capture_decodes != "none" and ceiling is None:
        if decode_query_len > 1:
            requests = sorted({*_standard_sizes(min(max_num_seqs, default)), min(max_num_seqs, default)})
            decode_sizes = [n * decode_query_len for n in requests if n * decode_query_len <= largest]
        elif line.capture_decodes == "speculative_and_max_num_seqs" and max_num_seqs <= largest:
            decode_sizes = [max_num_seqs]
    largest = min(largest, max_num_batched_tokens)
    sizes = _standard_sizes(largest)
    if line.capture_batched_tokens and max_num_batched_tokens <= largest:
        sizes.append(max_num_batched_tokens)
    sizes += [size for size in decode_sizes if size <= max_num_batched_tokens]
    return tuple(sorted(set(sizes)))


def _split_capture_sizes(
    release: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    decode_query_len: int,
    ceiling: int | None,
    target: Target | None,
) -> tuple[int, ...]:
    """0.34's sizes: prefill graphs by token counts, uniform decode graphs by request counts times
    the decode query length. On sm100 both default to wider grids (up to 8,192 tokens); under a
    model's ceiling (gpt-oss's config class) prefill takes the standard sizes to it and decode
    the request grid to ceiling / query length; elsewhere prefill takes the shared sizes of 0.33's
    rule and decode the request counts each shared size rounds up to. (Draft-model, EAGLE and MTP drafts' own request
    grids and dynamic speculation are not mirrored: vLLM's own config answers where installed.)"""
    sm100 = target is not None and not target.is_rocm and int(target.arch) // 10 == 10
    query = decode_query_len
    decode_tokens = max_num_batched_tokens
    if sm100:  # a model's ceiling is not applied there: sm100's defaults are wider
        most = release_line(release).capture_ceiling_sm100
        prefill = _walk_grid(min(most, max_num_batched_tokens), lambda t: min(t, max(8, t / 4), 0.07 * max(t, 4096)))
        requests = _request_grid(max_num_seqs)
        decode_tokens = min(max_num_batched_tokens, most)
    elif ceiling is not None:  # gpt-oss's config class: prefill to the ceiling, decode by requests
        most = min(max_num_batched_tokens, ceiling)
        prefill = sorted({size for size in _standard_sizes(ceiling) if size < most} | {most})
        requests = _request_grid(min(ceiling // query, max_num_seqs))
    else:
        shared = capture_sizes("0.33.0", max_num_seqs, max_num_batched_tokens, query, ceiling, target)
        prefill, largest = list(shared), max(shared, default=0)
        requests = sorted(
            {min(-(-size // query), max_num_seqs) for size in shared if -(-size // query) * query <= largest}
        )
    limit = min(max_num_seqs, decode_tokens // query)
    reachable = requests[: bisect.bisect_left(requests, limit) + 1] if limit >= 1 else []
    decode = {min(n, limit) * query for n in reachable}
    return tuple(sorted(decode | set(prefill)))


def _request_grid(max_requests: int) -> list[int]:
    """vLLM 0.34's request-count grid: every count up to 6, then strides growing as n^(2/3)."""
    return _walk_grid(max_requests, lambda n: 0.65 * n ** (2 / 3))


def _walk_grid(limit: int, step: Callable[[int], float]) -> list[int]:
    """vLLM 0.34's grids: sizes 1 ... `limit`, each the next multiple of the largest power of two
    not above `step(size)`."""
    grid, size = [], 1
    while size < limit:
        grid.append(size)
        stride = 1 << max(0, math.floor(math.log2(max(1.0, step(size)))))
        size = (size // stride + 1) * stride
    return [*grid, limit] if limit else []


def serving_capture_sizes(
    serving: ServingParams,
    release: str = DEFAULT_RELEASE,
    model: ModelConfig | None = None,
    target: Target | None = None,
) -> tuple[int, ...]:
    """The token counts graphs are captured for under `serving` (empty when eager), as vLLM
    `release` computes them for `model` on `target` when none are given."""
    if serving.enforce_eager:
        return ()
    if serving.cudagraph_capture_sizes is None:
        architectures = model.architectures if model is not None else ()
        ceiling = next((MODEL_CAPTURE_CEILINGS[name] for name in architectures if name in MODEL_CAPTURE_CEILINGS), None)
        return capture_sizes(
            release, serving.max_num_seqs, serving.max_num_batched_tokens, serving.decode_query_len, ceiling, target
        )
    return tuple(size for size in serving.cudagraph_capture_sizes if size <= serving.max_num_batched_tokens)
