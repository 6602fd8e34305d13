"""Kernels recorded while serving (what `kprecompile misses` lists): what serving processes
compiled beyond the plan, per configuration, for whoever maintains the families.

Reads the journals (`cache/journal.py`) of every root and the manifests beside them, without
torch or Triton: each record with its kernel, specialization, when it was first and last seen
and how often, the family (a kernel some family plans at other shapes) or library it belongs
to, and what became of it: compiled by a later warm, not replayed yet, or why not.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..cache.inventory import Configuration, configurations
from ..cache.journal import Record, journal_keys, read_records
from ..cache.layout import CacheLayout
from .manifest_key import journal_key, toolchain_digest
from .replay import PLANNED, RECORDED_FAMILY, REPLAYED

# Libraries by their top-level module, as users name them.
_LIBRARIES = {"aiter": "AITER", "vllm": "vLLM", "sglang": "SGLang", "torch": "PyTorch (Inductor)", "triton": "Triton"}


@dataclass(frozen=True)
class RecordedKernel:
    kernel: str
    triton_key: str
    target: str
    specialization: str
    first_seen: str
    last_seen: str
    count: int
    # The family that plans this kernel at other shapes, or None.
    family: str | None
    library: str
    # "compiled" (a warm replayed it, or the plan has it now), "not replayed yet", "other
    # toolchain", or why a warm did not compile it.
    status: str
    replayable: bool
    # Host name -> compiles there.
    hosts: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JournalReport:
    journal: str
    model: str
    targets: tuple[str, ...]
    # Manifest keys of the configurations that recorded (and of those in this cache sharing it).
    manifests: tuple[str, ...]
    # The recorded kernels (named `misses` in `kprecompile misses --json`: the kernels the plan missed).
    misses: tuple[RecordedKernel, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "targets": list(self.targets),
            "manifests": list(self.manifests),
            "misses": [kernel.as_dict() for kernel in self.misses],
        }


Selector = Callable[[Record], bool]


def find_recorded(layout: CacheLayout, chosen: Selector = lambda record: True) -> list[JournalReport]:
    """Every journal with records that `chosen` accepts, most recently seen first."""
    known = configurations(layout)
    families = {job.kernel: job.family for c in known for job in c.manifest.jobs if job.family != RECORDED_FAMILY}
    # Per journal key, the configurations sharing it, each with its toolchain digest.
    by_journal: dict[str, list[tuple[Configuration, str]]] = {}
    for configuration in known:
        parts = configuration.manifest.parts
        by_journal.setdefault(journal_key(parts), []).append((configuration, toolchain_digest(parts)))
    reports = []
    for key in journal_keys(layout):
        records = [record for record in read_records(layout, key).values() if chosen(record)]
        if not records:
            continue
        sharing = by_journal.get(key, [])
        misses = tuple(
            _recorded_kernel(record, sharing, families) for record in sorted(records, key=lambda r: -r.last_seen)
        )
        manifests = sorted({record.manifest for record in records if record.manifest} | {c.key for c, _ in sharing})
        reports.append(
            JournalReport(key, records[0].model, tuple(sorted({r.target for r in records})), tuple(manifests), misses)
        )
    return sorted(reports, key=lambda report: report.misses[0].last_seen, reverse=True)


def _recorded_kernel(
    record: Record, sharing: list[tuple[Configuration, str]], families: dict[str, str]
) -> RecordedKernel:
    return RecordedKernel(
        kernel=record.kernel,
        triton_key=record.triton_key,
        target=record.target,
        specialization=record.describe(),
        first_seen=_iso(record.first_seen),
        last_seen=_iso(record.last_seen),
        count=record.count,
        family=families.get(record.kernel),
        library=library_of(record.kernel),
        status=_status(record, sharing),
        replayable=record.replayable,
        hosts=dict(record.hosts),
    )


def _status(record: Record, sharing: list[tuple[Configuration, str]]) -> str:
    """What the configurations in this cache sharing the journal did with the record."""
    same_target = [(c, toolchain) for c, toolchain in sharing if c.target == record.target]
    mine = [c for c, toolchain in same_target if toolchain == record.toolchain]
    if same_target and not mine:
        return "other toolchain"
    outcomes = [c.manifest.recorded.get(record.triton_key) for c in mine]
    if any(outcome in (REPLAYED, PLANNED) for outcome in outcomes):
        return "compiled"
    return next((outcome for outcome in outcomes if outcome), "not replayed yet")


def library_of(kernel: str) -> str:
    module = kernel.partition(":")[0]
    if ":" not in kernel:
        return "Inductor or triton.compile"
    top = module.partition(".")[0]
    return _LIBRARIES.get(top, top)


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="seconds")
