"""A compile job: one kernel specialization, by the key its binary has in Triton's cache.

Tracing produces jobs, the pool compiles them, manifests list them and preload replays them:
everything needed to compile exactly that specialization again in a fresh process.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# Options worth showing when a job is reported; the full set is in the specialization data.
_REPORTED_OPTIONS = ("num_warps", "num_stages", "num_ctas", "waves_per_eu", "matrix_instr_nonkdim", "kpack")


@dataclass(frozen=True)
class CompileJob:
    family: str
    target: str
    # `module:qualname` of the JITFunction; the module is importable in a fresh process.
    kernel: str
    # Triton's cache key for this specialization (hex sha256), the name of its cache entry.
    key: str
    # Triton's specialization data (JSON), replayed by `JITFunction.preload`.
    specialization: str

    @property
    def kernel_name(self) -> str:
        return self.kernel.rpartition(":")[2].rpartition(".")[2]

    def describe_specialization(self) -> str:
        """Constexpr values and launch options, e.g. `BLOCK_SIZE_M=16, ..., num_warps=4`."""
        return describe_specialization_data(json.loads(self.specialization))

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def describe_specialization_data(data: dict[str, Any]) -> str:
    """Triton's specialization data in short: constexpr values and launch options."""
    names = list(data["signature"])
    parts = []
    for path, value in zip(data["constant_keys"], data["constant_vals"], strict=True):
        if len(path) == 1 and data["signature"].get(names[path[0]]) == "constexpr":
            parts.append(f"{names[path[0]]}={_short(value)}")
    options = data["options"]
    parts += [f"{name}={options[name]}" for name in _REPORTED_OPTIONS if name in options]
    return ", ".join(parts)


def _short(value: Any) -> str:
    if isinstance(value, dict) and "constexpr" in value:
        value = value["constexpr"]
    return str(value)
