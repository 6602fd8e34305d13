"""Serving parameters: the engine settings that, with the model config, decide kernel shapes.

One frozen record used by the CLI, the Python API and the engine hook. Defaults are vLLM's
(`vllm serve` on a GPU with at least 70 GiB, which covers MI300X, MI325X, MI355X, H100, H200);
`None` means "derived as vLLM derives it": the model length from the config, the CUDA-graph
capture sizes from vLLM's rule. Errors name the CLI option, which is also the engine's name
for the setting (`--max-num-seqs` is vLLM's `max_num_seqs`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:
    from .models import ModelConfig

DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# Bounds far beyond any real deployment, so that a typo cannot make planning take minutes or
# gigabytes (plans grow with sequences, tokens and draft tokens).
MAX_TENSOR_PARALLEL = 1024
MAX_NUM_SEQS = 16384
MAX_BATCHED_TOKENS = 1 << 20
MAX_MODEL_LEN = 1 << 24
MAX_SPECULATIVE_TOKENS = 32
MAX_CAPTURE_SIZES = 1024
DEFAULT_BLOCK_SIZE = 16
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
DTYPES = ("auto", "bfloat16", "float16")


@dataclass(frozen=True)
class ServingParams:
    tensor_parallel_size: int = 1
    # Most sequences in one step: the largest decode batch.
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    # Most tokens in one step: the largest prefill chunk.
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    # Longest sequence (prompt + output); None: the config's max_position_embeddings.
    max_model_len: int | None = None
    # Tokens per KV-cache block (page).
    block_size: int = DEFAULT_BLOCK_SIZE
    # "auto" stores the KV cache in the model dtype; "fp8" / "fp8_e4m3" in the target's FP8.
    kv_cache_dtype: str = "auto"
    # "auto": the config's dtype, float32 downcast to bfloat16 (vLLM's rule: `inputs/layers.py`).
    dtype: str = "auto"
    # Token counts the engine captures CUDA/HIP graphs for; None: vLLM's default rule.
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    # No graphs at all: every batch runs at its exact size.
    enforce_eager: bool = False
    # Draft tokens per step (MTP / speculative decoding): decode queries are 1 + this long.
    num_speculative_tokens: int = 0
    # vLLM's --trust-remote-code: the model's own code (its config's `auto_map`) may define its
    # config. It decides no kernel, so it enters no key (`resolved`).
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        _require_positive_int("--tp", self.tensor_parallel_size, MAX_TENSOR_PARALLEL)
        _require_positive_int("--max-num-seqs", self.max_num_seqs, MAX_NUM_SEQS)
        _require_positive_int("--max-num-batched-tokens", self.max_num_batched_tokens, MAX_BATCHED_TOKENS)
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM's scheduler refuses it too: every sequence needs a token in a step.
            raise InputError(
                "--max-num-batched-tokens",
                self.max_num_batched_tokens,
                f"at least --max-num-seqs = {self.max_num_seqs} (vLLM refuses fewer)",
            )
        if self.max_model_len is not None:
            _require_positive_int("--max-model-len", self.max_model_len, MAX_MODEL_LEN)
        _require_choice("--block-size", self.block_size, BLOCK_SIZES)
        _require_choice("--kv-cache-dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        _require_choice("--dtype", self.dtype, DTYPES)
        if not isinstance(self.enforce_eager, bool):
            raise InputError("--enforce-eager", self.enforce_eager, "true or false")
        if not isinstance(self.trust_remote_code, bool):
            raise InputError("--trust-remote-code", self.trust_remote_code, "true or false")
        if isinstance(self.num_speculative_tokens, bool) or not isinstance(self.num_speculative_tokens, int):
            raise InputError("--num-speculative-tokens", self.num_speculative_tokens, "a non-negative integer")
        if not 0 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise InputError(
                "--num-speculative-tokens",
                self.num_speculative_tokens,
                f"a non-negative integer up to {MAX_SPECULATIVE_TOKENS}",
            )
        if self.cudagraph_capture_sizes is not None:
            sizes = self.cudagraph_capture_sizes
            if not isinstance(sizes, tuple) or not sizes:
                raise InputError("--cudagraph-capture-sizes", sizes, "a non-empty list of positive integers")
            if len(sizes) > MAX_CAPTURE_SIZES:
                raise InputError("--cudagraph-capture-sizes", f"{len(sizes)} sizes", f"at most {MAX_CAPTURE_SIZES}")
            for size in sizes:
                _require_positive_int("--cudagraph-capture-sizes", size, MAX_BATCHED_TOKENS)
            object.__setattr__(self, "cudagraph_capture_sizes", tuple(sorted(set(sizes))))

    @property
    def decode_query_len(self) -> int:
        """Tokens per sequence in a decode step."""
        return 1 + self.num_speculative_tokens

    @property
    def kv_cache_is_fp8(self) -> bool:
        return self.kv_cache_dtype != "auto"

    def decode_token_counts(self) -> tuple[int, ...]:
        """Every number of decode tokens a step can hand a kernel: 1..max_num_seqs x query length.

        Decodes mixed into a prefill step run eagerly at their exact count, so every count is
        reachable; pure-decode steps replayed from a full graph are padded to a captured size,
        and vLLM captures those only up to max_num_seqs x query length, inside the same range.
        """
        return tuple(range(1, self.max_num_seqs * self.decode_query_len + 1))

    def decode_batch_sizes(self) -> tuple[int, ...]:
        """Every number of decoding sequences a step can hand a kernel (see decode_token_counts)."""
        per_seq = self.decode_query_len
        return tuple(sorted({count // per_seq for count in self.decode_token_counts() if count % per_seq == 0}))

    def check(self, model: ModelConfig) -> None:
        """Fail now, naming the option, if these settings cannot serve `model`."""
        self.heads_per_rank(model)
        if model.mla is None:
            self.kv_heads_per_rank(model)
        self.model_len(model)

    def heads_per_rank(self, model: ModelConfig) -> int:
        heads, tp = model.num_attention_heads, self.tensor_parallel_size
        if heads % tp:
            raise InputError("--tp", tp, f"a divisor of num_attention_heads = {heads} of {model.name}")
        return heads // tp

    def kv_heads_per_rank(self, model: ModelConfig) -> int:
        """vLLM splits KV heads across ranks, replicating them when tp exceeds their number."""
        kv_heads, tp = model.num_key_value_heads, self.tensor_parallel_size
        if kv_heads % tp and tp % kv_heads:
            raise InputError("--tp", tp, f"a divisor or multiple of num_key_value_heads = {kv_heads} of {model.name}")
        return max(1, kv_heads // tp)

    def model_len(self, model: ModelConfig) -> int:
        """The longest sequence served: --max-model-len, or the config's limit."""
        limit = model.max_position_embeddings
        if self.max_model_len is None:
            if limit is None:
                raise InputError(
                    "--max-model-len", None, f"a value: {model.name} has no max_position_embeddings to derive it from"
                )
            return limit
        if limit is not None and self.max_model_len > limit:
            raise InputError(
                "--max-model-len", self.max_model_len, f"at most max_position_embeddings = {limit} of {model.name}"
            )
        return self.max_model_len

    def activation_dtype(self, model: ModelConfig) -> str:
        """The dtype activations and (with kv-cache-dtype auto) the KV cache are held in."""
        from .layers import resolved_dtype

        return resolved_dtype(model, self)

    def resolved(self, model: ModelConfig, capture_sizes: tuple[int, ...]) -> dict[str, Any]:
        """The effective settings for `model`, the part of a cache key: settings spelled
        differently but meaning the same (the default model length and its explicit value, vLLM's
        capture sizes and the same list given by hand, fp8 and fp8_e4m3) are equal.
        `capture_sizes` are the planned release's (`vllm.releases.serving_capture_sizes`)."""
        return {
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.model_len(model),
            "block_size": self.block_size,
            "kv_cache_dtype": "fp8" if self.kv_cache_is_fp8 else "auto",
            "dtype": self.activation_dtype(model),
            "cudagraph_capture_sizes": list(capture_sizes),
            "num_speculative_tokens": self.num_speculative_tokens,
        }

    def as_dict(self) -> dict[str, Any]:
        record = asdict(self)
        if self.cudagraph_capture_sizes is not None:
            record["cudagraph_capture_sizes"] = list(self.cudagraph_capture_sizes)
        return record


def _require_positive_int(field: str, value: object, limit: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field, value, "a positive integer")
    if value > limit:
        raise InputError(field, value, f"at most {limit:,}")


def _require_choice(field: str, value: object, choices: tuple[object, ...]) -> None:
    if isinstance(value, bool) or value not in choices:
        raise InputError(field, value, "one of " + ", ".join(str(choice) for choice in choices))
