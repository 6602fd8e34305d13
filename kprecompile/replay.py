"""Replay: the kernels a configuration's serving processes recorded, as this warm's compile jobs.

A record is replayed when it was made on this target by this toolchain (others are kept in the
journal for the builders they belong to) and the kernel can be compiled again exactly: its
module imports, its source hash is the recorded one, and its specialization data, passed
through `JITFunction.preload` under the capture hook as tracing does, gives the Triton key the
serving process compiled (else this warm's binary would never be the one that process looks
for). Every other record is skipped with one warning line saying why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from .cache.jobs import CompileJob
from .cache.journal import Record, read_records
from .cache.layout import CacheLayout
from .cache.manifest import Manifest
from .configuration import ManifestLookup
from .targets import Target

logger = logging.getLogger(__name__)

# The family name of replayed jobs in manifests and reports.
RECORDED_FAMILY = "recorded"
REPLAYED, PLANNED = "replayed", "planned"
NOT_IMPORTABLE = "cannot import it here"


@dataclass(frozen=True)
class Replay:
    jobs: tuple[CompileJob, ...]
    # Per record (Triton key): REPLAYED, PLANNED (the plan compiles it now) or why it was skipped.
    outcomes: dict[str, str]
    seconds: float

    @property
    def skipped(self) -> int:
        return sum(outcome not in (REPLAYED, PLANNED) for outcome in self.outcomes.values())


def replay(records: Sequence[Record], target: Target, planned: Collection[str], triton_key: str | None) -> Replay:
    """The compile jobs for `records` on `target`, except those whose key is in `planned`."""
    from .compile import LIBRARY_MODULES
    from .libraries import resolve_kernel
    from .trace import capturing

    started = time.perf_counter()
    jobs: dict[str, CompileJob] = {}
    outcomes: dict[str, str] = {}
    modules = tuple(dict.fromkeys(record.kernel.partition(":")[0] for record in records))
    with capturing(target, LIBRARY_MODULES + modules, triton_key) as capture:
        for record in records:
            if record.triton_key in planned:
                outcomes[record.triton_key] = PLANNED
                continue
            try:
                job = _job(record, target, capture, resolve_kernel)
            except _Skip as skip:
                outcomes[record.triton_key] = str(skip)
                logger.warning("recorded %s [%s…] not compiled: %s", record.kernel, record.triton_key[:12], skip)
                continue
            jobs[job.key] = job
            outcomes[record.triton_key] = REPLAYED
    return Replay(tuple(jobs.values()), outcomes, time.perf_counter() - started)


def recorded_here(layout: CacheLayout, lookup: ManifestLookup, target: Target) -> list[Record]:
    """The journal's records made on `target` by this toolchain, oldest first; the others stay in
    the journal for the builders they belong to."""
    records = read_records(layout, lookup.journal_key).values()
    toolchain = lookup.toolchain_digest
    mine = [record for record in records if record.target == target.name and record.toolchain == toolchain]
    if len(mine) < len(records):
        logger.info("journal %s: %d records of other targets or toolchains kept, not replayed here",
                    lookup.journal_key[:12], len(records) - len(mine))  # fmt: skip
    return sorted(mine, key=lambda record: record.first_seen)


def unsettled(records: Sequence[Record], manifest: Manifest | None) -> list[Record]:
    """The records `manifest` has not settled (see `settled`): a warm has work to do."""
    outcomes = manifest.recorded if manifest is not None else {}
    return [record for record in records if not settled(record, outcomes.get(record.triton_key))]


def settled(record: Record, outcome: str | None) -> bool:
    """Whether a warm that reached `outcome` for `record` need not consider it again: anything
    but a module that could not be imported then and can be found now (installed since, or on
    this process's path)."""
    if outcome is None:
        return False
    if outcome.startswith(NOT_IMPORTABLE):
        import importlib.util

        package = record.kernel.partition(":")[0].partition(".")[0]
        try:
            return importlib.util.find_spec(package) is None
        except (ImportError, ValueError):
            return True
    return True


class _Skip(Exception):
    """Why a record is not compiled again."""


def _job(record: Record, target: Target, capture, resolve_kernel) -> CompileJob:
    if not record.replayable:
        raise _Skip("compiled outside a Triton kernel launch (Inductor's, or triton.compile): not replayable")
    module = record.kernel.partition(":")[0]
    if module == "__main__":
        raise _Skip("defined in a script (__main__), which another process cannot import")
    try:
        kernel = resolve_kernel(record.kernel)
    except TypeError as error:
        raise _Skip(str(error)) from None
    except Exception as error:
        raise _Skip(f"{NOT_IMPORTABLE} ({type(error).__name__}: {error})") from None
    if kernel.cache_key != record.source_hash:
        raise _Skip("its source changed since it was recorded")
    try:
        data, key = capture.specialization(kernel, record.specialization)
    except Exception as error:
        raise _Skip(f"its specialization does not replay ({type(error).__name__}: {error})") from None
    if key != record.triton_key:
        raise _Skip(f"it compiles under Triton key {key[:12]}… here: this environment differs from the server's")
    return CompileJob(RECORDED_FAMILY, target.name, record.kernel, key, data)
