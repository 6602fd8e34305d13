"""Replay: the kernels a configuration's serving processes recorded, as this warm's compile jobs.

A record is replayed when it was made on this target by this toolchain (others are kept in the
journal for the builders they belong to) and the kernel can be compiled again exactly: its
module imports, its source hash is the recorded one, and its specialization data, passed
through `JITFunction.preload` under the capture hook as tracing does, gives the Triton key the
serving process compiled (else this warm's binary would never be the one that process looks
for).

Importing a module runs its code, and journals travel in archives, so which modules a record
may make this process import is the rule:

- a kernel of the libraries kprecompile traces (`aiter.*`, `vllm.*`) is first found by reading
  the library's source (`tracing/kernel_source.py`): its module located through the package's
  path without executing anything, and the file must define a `jit` function of that name;
  only then is it imported, as tracing imports the library anyway;
- any other module only when the record is local (`Record.origin`: written by a serving
  process through this cache); a record an `import` brought is never trusted with one;
- never a name that is not plain (`x.__main__`, dunder or relative names, keywords), a script
  (`__main__`), a function's local, or a standard library module.

Every skipped record's reason goes into the manifest (`kprecompile misses` shows each); the
warm says one line with the counts by reason.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..cache.jobs import CompileJob
from ..cache.journal import Record, read_records
from ..cache.layout import CacheLayout
from ..cache.manifest import Manifest
from ..inputs.targets import Target
from ..tracing import kernel_source
from ..wording import plural
from .manifest_key import ManifestLookup

logger = logging.getLogger(__name__)

# The family name of replayed jobs in manifests and reports.
RECORDED_FAMILY = "recorded"
REPLAYED, PLANNED = "replayed", "planned"
# The one retried outcome: "cannot import it here (no module NAME)", NAME a top-level module.
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
    from ..tracing.libraries import resolve_kernel
    from ..tracing.trace import capturing
    from .compile import library_modules

    started = time.perf_counter()
    jobs: dict[str, CompileJob] = {}
    outcomes: dict[str, str] = {}
    skipped: Counter[str] = Counter()
    modules = library_modules()
    packages = frozenset(module.partition(".")[0] for module in modules)
    # The libraries' modules are imported anew for the target, as tracing does; a record's own
    # module is imported as it is (never matched by prefix: a record named `t:x` must not take
    # `triton` and `torch` out of the process).
    with capturing(target, modules, triton_key) as capture:
        for record in records:
            if record.triton_key in planned:
                outcomes[record.triton_key] = PLANNED
                continue
            try:
                job = _job(record, target, capture, resolve_kernel, packages)
            except _Skip as skip:
                outcomes[record.triton_key] = outcome = shorten(str(skip))
                skipped[skip.reason] += 1
                logger.info("recorded %s [%s…] not compiled: %s", record.kernel, record.triton_key[:12], outcome)
                continue
            jobs[job.key] = job
            outcomes[record.triton_key] = REPLAYED
    if skipped:
        by_reason = sorted(skipped.items(), key=lambda item: (-item[1], item[0]))
        logger.warning(
            "%s not compiled again: %s (kprecompile misses says why for each)",
            plural(skipped.total(), "recorded kernel"),
            ", ".join(f"{count:,} {reason}" for reason, count in by_reason),
        )
    return Replay(tuple(jobs.values()), outcomes, time.perf_counter() - started)


def recorded_here(layout: CacheLayout, lookup: ManifestLookup, target: Target) -> list[Record]:
    """The journal's records made on `target` by this toolchain, oldest first; the others stay in
    the journal for the builders they belong to."""
    records = read_records(layout, lookup.journal_key).values()
    toolchain = lookup.toolchain_digest
    mine = [record for record in records if record.target == target.name and record.toolchain == toolchain]
    if len(mine) < len(records):
        logger.info(
            "journal %s: %d records of other targets or toolchains kept, not replayed here",
            lookup.journal_key[:12],
            len(records) - len(mine),
        )
    return sorted(mine, key=lambda record: record.first_seen)


def unsettled(records: Sequence[Record], manifest: Manifest | None) -> list[Record]:
    """The records `manifest` has not settled (see `settled`): a warm has work to do."""
    outcomes = manifest.recorded if manifest is not None else {}
    return [record for record in records if not settled(record, outcomes.get(record.triton_key))]


# An outcome is a line in a manifest (whose fields are bounded) and a log line.
MAX_OUTCOME = 300


def shorten(text: str) -> str:
    return text if len(text) <= MAX_OUTCOME else text[: MAX_OUTCOME - 1] + "…"


def settled(record: Record, outcome: str | None) -> bool:
    """Whether a warm that reached `outcome` for `record` need not consider it again: anything
    but a top-level module that was not installed then and can be found now (installed since,
    or on this process's path). Found without importing anything."""
    if outcome is None:
        return False
    if outcome.startswith(NOT_IMPORTABLE):
        import importlib.util

        missing = outcome.removeprefix(NOT_IMPORTABLE).strip(" ()").removeprefix("no module ")
        if not missing.isidentifier():
            return True  # finding `a.b` would import `a`: an outcome (an imported manifest's) never names one
        try:
            return importlib.util.find_spec(missing) is None
        except (ImportError, ValueError):
            return True
    return True


class _Skip(Exception):
    """Why a record is not compiled again: `reason` in a few words (the warm's summary counts
    them), the message in full (the manifest's outcome)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _job(record: Record, target: Target, capture, resolve_kernel, packages: frozenset[str]) -> CompileJob:
    if not record.replayable:
        raise _Skip(
            "not replayable", "compiled outside a Triton kernel launch (Inductor's, or triton.compile): not replayable"
        )
    module, _, qualname = record.kernel.partition(":")
    if module == "__main__":
        raise _Skip("in a script", "defined in a script (__main__), which another process cannot import")
    if "<locals>" in qualname:
        raise _Skip("in a function", "defined inside a function, which another process cannot look up by name")
    if not kernel_source.well_formed_module(module) or not kernel_source.well_formed_qualname(qualname):
        raise _Skip("odd names", f"{module}:{qualname} is not a plain module and name (no dunder or relative names)")
    if module.partition(".")[0] in sys.stdlib_module_names:
        raise _Skip("in the standard library", f"{module} is a standard library module, not a kernel library")
    if module.partition(".")[0] in packages:
        _find_in_source(module, qualname)
    elif record.origin != "local":
        raise _Skip(
            "imported, outside the traced libraries",
            f"{module} is not a module of {' or '.join(sorted(packages))}, and the record came from an "
            "archive: only a record this cache's serving processes wrote may name another module",
        )
    try:
        kernel = resolve_kernel(record.kernel)
    except TypeError as error:
        raise _Skip("not a kernel", str(error)) from None
    except ModuleNotFoundError as error:
        if error.name and "." not in error.name and error.name == module.partition(".")[0]:
            raise _Skip("not installed here", f"{NOT_IMPORTABLE} (no module {error.name})") from None
        raise _Skip("not resolved", f"cannot resolve it here ({type(error).__name__}: {error})") from None
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # a module that exits or fails at import: skipped, never fatal
        raise _Skip("not resolved", f"cannot resolve it here ({type(error).__name__}: {error})") from None
    if kernel.cache_key != record.source_hash:
        raise _Skip("source changed", "its source changed since it was recorded")
    try:
        data, key = capture.specialization(kernel, record.specialization)
    except Exception as error:
        raise _Skip(
            "specialization does not replay",
            f"its specialization does not replay ({type(error).__name__}: {error})",
        ) from None
    if key != record.triton_key:
        raise _Skip(
            "another environment",
            f"it compiles under Triton key {key[:12]}… here: this environment differs from the server's",
        )
    return CompileJob(RECORDED_FAMILY, target.name, record.kernel, key, data)


def _find_in_source(module: str, qualname: str) -> None:
    """A library's kernel, found in its module's source before anything imports the module."""
    try:
        path = kernel_source.module_file(module)
    except kernel_source.KernelSourceError as error:
        raise _Skip("not in the library", f"cannot resolve it here ({error})") from None
    except OSError as error:
        raise _Skip("not in the library", f"cannot resolve it here ({error.strerror or error})") from None
    if path is None:
        raise _Skip("not installed here", f"{NOT_IMPORTABLE} (no module {module.partition('.')[0]})")
    try:
        found = kernel_source.defines_kernel(path, qualname)
    except OSError as error:
        raise _Skip("not in the library", f"cannot read {path} ({error.strerror or error})") from None
    if not found:
        raise _Skip("not in the library", f"{module}'s source defines no Triton kernel {qualname}; not imported")
