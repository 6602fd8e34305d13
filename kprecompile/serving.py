"""Serving parameters: the engine settings that, with the model config, decide kernel shapes."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import InputError

# vLLM's ROCm MLA backend precompiles the FP8 BMM for m = 1..1024 at weight-load time.
DEFAULT_MAX_BATCH_SIZE = 1024


@dataclass(frozen=True)
class ServingParams:
    tensor_parallel_size: int = 1
    # Largest m the FP8 BMM is planned for: decode tokens in one step.
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE

    def __post_init__(self) -> None:
        _require_positive_int("--tp", self.tensor_parallel_size)
        _require_positive_int("--max-batch", self.max_batch_size)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _require_positive_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field, value, "a positive integer")
