"""One row of a plan: what one family compiles on one target, or why it does not.

Shown by `plan`, kept in each manifest (so a warm configuration reports its plan without
planning again) and in every warm's report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..shapes.family import FamilyName


@dataclass(frozen=True)
class FamilyPlan:
    family: FamilyName
    target: str
    # Library calls enumerated for this family (one per shape record).
    calls: int
    # Unique kernels those calls compile.
    kernels: int
    parameters: dict[str, Any]
    # Why this family is not compiled for this target (a known reason: its limits, a library
    # this builder lacks, a prebuilt kernel), or None.
    skip_reason: str | None = None
    # The engine backend (or flag) that runs this family.
    backend: str = ""
    # Why planning this family failed (its trace raised), or None. A failed family makes the
    # command fail, and its target is never recorded as warm.
    error: str | None = None
    # What this builder lacks to plan the family (`vllm==0.12.0`, `amd-aiter`), where that is why
    # it is skipped: a warm that compiles nothing for that reason fails.
    missing: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
