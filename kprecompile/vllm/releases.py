"""vLLM releases: what changes between them that decides which kernels run and the cache key.

kprecompile plans for a named release: the installed vLLM's where vLLM is importable,
`--vllm-version` on a builder without it, else `DEFAULT_RELEASE`. Releases fall into lines that
share the rules mirrored here (the attention backend the ROCm platform selects, the default
CUDA-graph capture sizes); tests/test_vllm.py checks each mirror against the real code of every
tested release.

- 0.11: the ROCm selector takes AITER's flash attention (`ROCM_AITER_FA`) before the
  unified-attention flag; no `ROCM_AITER_TRITON_MLA`; capture sizes up to 2 x max-num-seqs.
- 0.12 (to 0.18): the unified-attention flag first; capture sizes as 0.11 (0.13 brought the
  1 + speculative-tokens factor).
- 0.19 and newer (0.33): a priority list of valid backends (`ROCM_ATTN` first for GQA, even with
  AITER on), `VLLM_ATTENTION_BACKEND` and `VLLM_V1_USE_PREFILL_DECODE_ATTENTION` gone, AITER's
  MLA decode reduced by a persistent HIP kernel (no Triton stage 2), and max-num-seqs (and
  max-num-batched-tokens, when small) captured as well.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import TYPE_CHECKING, Literal

from ..errors import InputError

if TYPE_CHECKING:
    from ..inputs.serving import ServingParams

# Tested against these (scripts/install_vllm.py installs them): 0.11.2 and 0.12.0 pair with the
# installed amd-aiter; 0.33.0 is the newest on the registry.
TESTED_RELEASES = ("0.11.2", "0.12.0", "0.33.0")
DEFAULT_RELEASE = "0.12.0"
FIELD = "--vllm-version"

Line = Literal["0.11", "0.12", "0.13", "0.19"]
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def installed_release() -> str | None:
    """The installed vLLM's version, or None where vLLM is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def resolve_release(requested: str | None) -> str:
    """The release to plan for: `requested`, else the installed vLLM's, else the default.

    An installed release kprecompile was not tested against is planned for only when the user
    names it (`--vllm-version`, planned with its release line's rules): unasked, that would be
    a guess."""
    if requested:
        line_of(requested, FIELD)
        return requested
    installed = installed_release()
    if installed is None:
        return DEFAULT_RELEASE
    line_of(installed, "vllm")
    if installed not in TESTED_RELEASES:
        tested = ", ".join(TESTED_RELEASES)
        expected = f"a tested release ({tested}); to plan for {installed} by its release line's rules, name it"
        raise InputError("installed vllm", installed, f"{expected}: --vllm-version {installed}")
    return installed


def line_of(release: str, field: str = FIELD) -> Line:
    match = _VERSION.match(release)
    if match is None or (int(match[1]), int(match[2]), int(match[3] or 0)) < (0, 11, 2):
        # 0.11.0 and 0.11.1 named the unified-attention flag differently and wanted pages of one
        # token for AITER's MLA: not mirrored.
        raise InputError(field, release, "a vLLM release, 0.11.2 or newer (tested: " + ", ".join(TESTED_RELEASES) + ")")
    minor = (int(match[1]), int(match[2]))
    if minor >= (0, 19):
        return "0.19"
    if minor >= (0, 13):
        return "0.13"
    return "0.12" if minor >= (0, 12) else "0.11"


def _standard_sizes(largest: int) -> list[int]:
    """vLLM's candidate sizes up to `largest`: 1, 2, 4, steps of 8 below 256, of 16 from 256."""
    sizes = [size for size in (1, 2, 4) if size <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8))
    sizes += list(range(256, largest + 1, 16))
    return sizes


def capture_sizes(
    release: str, max_num_seqs: int, max_num_batched_tokens: int, decode_query_len: int
) -> tuple[int, ...]:
    """The CUDA-graph capture sizes `release` chooses when the user names none."""
    line = line_of(release, "vllm")
    per_seq = 1 if line in ("0.11", "0.12") else decode_query_len
    largest = min(max_num_seqs * per_seq * 2, 512)
    decode_sizes: list[int] = []
    if line == "0.19":
        if decode_query_len > 1:
            requests = sorted({*_standard_sizes(min(max_num_seqs, 512)), min(max_num_seqs, 512)})
            decode_sizes = [n * decode_query_len for n in requests if n * decode_query_len <= largest]
        elif max_num_seqs <= largest:
            decode_sizes = [max_num_seqs]
    largest = min(largest, max_num_batched_tokens)
    sizes = _standard_sizes(largest)
    if line == "0.19":
        if max_num_batched_tokens <= largest:
            sizes.append(max_num_batched_tokens)
        sizes += [size for size in decode_sizes if size <= max_num_batched_tokens]
    return tuple(sorted(set(sizes)))


def serving_capture_sizes(serving: ServingParams, release: str = DEFAULT_RELEASE) -> tuple[int, ...]:
    """The token counts graphs are captured for under `serving` (empty when eager), as vLLM
    `release` computes them when none are given."""
    if serving.enforce_eager:
        return ()
    if serving.cudagraph_capture_sizes is None:
        return capture_sizes(release, serving.max_num_seqs, serving.max_num_batched_tokens, serving.decode_query_len)
    return tuple(size for size in serving.cudagraph_capture_sizes if size <= serving.max_num_batched_tokens)
