"""Journals: the kernels serving processes compiled, kept for the next warm to compile.

    journals-v1/<journal key>.jsonl    one JSON record per line, appended

A journal belongs to a configuration without its toolchain (`configuration.journal_key`), so a
builder with another Triton build still sees what GPU hosts recorded (and replays only records
of its own toolchain and target). Ranks and hosts sharing the cache append under the journal's
OS lock, each append one `O_APPEND` write of whole lines. Lines are merged by the kernel's Triton key when
read (first and last seen, compiles per host), so one kernel compiled on eight ranks is one
record seen 8 times. An imported journal merges per host by the larger count: importing the
same export twice counts nothing twice.

Everything here is bounded: a line, a record's fields, the number of records and the file's
bytes. An append that would pass the bound first compacts the journal (one line per kernel,
the most recently seen kept); a reader reads at most the bound, skips damaged lines (counting
them), never follows a symbolic link and never reads anything but a regular file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .files import FILE_MODE, make_directories, write_atomic
from .jobs import describe_specialization_data
from .layout import CacheLayout
from .locks import hold_briefly

logger = logging.getLogger(__name__)

RECORD_FORMAT = 1
# A record is a few kilobytes (Triton's specialization data of a kernel with many arguments).
MAX_LINE_BYTES = 256 << 10
MAX_JOURNAL_BYTES = 8 << 20
MAX_RECORDS = 4096
JOURNAL_LOCK_PREFIX = "journal-"
MAX_HOSTS = 64
_MAX_COUNT = 1 << 31
HEX64 = re.compile(r"[0-9a-f]{64}")
# `module:qualified.name` of a JITFunction, or a compiled kernel's bare name (Inductor's).
KERNEL = re.compile(r"[A-Za-z_][\w.]{0,255}(:[A-Za-z_][\w.<>]{0,255})?")
TARGET = re.compile(r"[a-z]{2,4}[0-9a-z]{1,8}")
_TEXT_LIMIT = 512
# Where a record came from: written by a serving process through this cache (`append`), or
# merged from an archive by `import` (never trusted to name a module outside the traced libraries).
Origin = Literal["local", "imported"]
ORIGINS: tuple[Origin, ...] = ("local", "imported")


@dataclass(frozen=True)
class Record:
    """One kernel compiled while serving, with what compiling it again needs."""

    # Triton's cache key of the compiled kernel: the name of its cache entry.
    triton_key: str
    kernel: str
    target: str
    # Digest of the serving process's toolchain (`configuration.toolchain_digest`).
    toolchain: str
    # The JITFunction's source hash and Triton's specialization data; None for a kernel compiled
    # outside a JITFunction launch (Inductor's), which cannot be compiled again by name.
    source_hash: str | None
    specialization: str | None
    # The manifest key of the configuration the process served.
    manifest: str | None
    model: str
    first_seen: float
    last_seen: float
    # Compile time in the serving process.
    seconds: float
    # Host name -> how many times a process there compiled it.
    hosts: dict[str, int]
    origin: Origin

    @property
    def replayable(self) -> bool:
        return self.specialization is not None and self.source_hash is not None and ":" in self.kernel

    @property
    def count(self) -> int:
        return sum(self.hosts.values())

    def describe(self) -> str:
        """The specialization in short (constexprs and launch options), as reports show it."""
        if self.specialization is None:
            return "-"
        try:
            return describe_specialization_data(json.loads(self.specialization))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
            return "(unreadable specialization data)"

    def merged(self, other: Record, imported: bool = False) -> Record:
        """Both sightings of one kernel: first and last seen, the replayable one's data, and per
        host the counts added (lines of one journal) or the larger one (`imported`: another copy
        of the same history). Of two replayable sightings a local one wins: an archive cannot
        rename a kernel this cache recorded itself."""
        richer = max(self, other, key=lambda record: (record.replayable, record.origin == "local"))
        hosts = dict(self.hosts)
        for host, count in other.hosts.items():
            hosts[host] = max(hosts.get(host, 0), count) if imported else min(hosts.get(host, 0) + count, _MAX_COUNT)
        if len(hosts) > MAX_HOSTS:
            hosts = dict(sorted(hosts.items(), key=lambda item: -item[1])[:MAX_HOSTS])
        return dataclasses.replace(
            richer,
            first_seen=min(self.first_seen, other.first_seen),
            last_seen=max(self.last_seen, other.last_seen),
            hosts=hosts,
        )

    def to_line(self) -> bytes:
        document = {"record": RECORD_FORMAT, **dataclasses.asdict(self)}
        return json.dumps(document, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> Record:
        """The record on one journal line, every field checked; ValueError saying what is wrong."""
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"longer than {MAX_LINE_BYTES} bytes")
        try:
            document = json.loads(line)
        except RecursionError:
            raise ValueError("nested too deeply") from None
        if not isinstance(document, dict) or document.get("record") != RECORD_FORMAT:
            raise ValueError(f"not a record of format {RECORD_FORMAT}")
        fields = {field.name: field for field in dataclasses.fields(cls)}
        # A line written before records carried their origin is of unknown origin: imported.
        document = {"origin": "imported", **document}
        if set(document) != {"record", *fields}:
            raise ValueError("its fields are not a record's")
        values = {name: document[name] for name in fields}
        _check_record(values)
        return cls(**values)


def _check_record(values: dict[str, Any]) -> None:
    for name in ("triton_key", "toolchain"):
        if not isinstance(values[name], str) or not HEX64.fullmatch(values[name]):
            raise ValueError(f"{name} is not 64 hex digits")
    if not isinstance(values["kernel"], str) or not KERNEL.fullmatch(values["kernel"]):
        raise ValueError("kernel is not a module:name")
    if not isinstance(values["target"], str) or not TARGET.fullmatch(values["target"]):
        raise ValueError("target is not a target name")
    for name in ("source_hash", "manifest"):
        if values[name] is not None and (not isinstance(values[name], str) or not HEX64.fullmatch(values[name])):
            raise ValueError(f"{name} is not 64 hex digits or null")
    if values["specialization"] is not None:
        _check_specialization(values["specialization"])
    if not isinstance(values["model"], str) or len(values["model"]) > _TEXT_LIMIT:
        raise ValueError("model is not a short string")
    if values["origin"] not in ORIGINS:
        raise ValueError(f"origin is not one of {', '.join(ORIGINS)}")
    for name in ("first_seen", "last_seen", "seconds"):
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e12:
            raise ValueError(f"{name} is not a time")
        values[name] = float(value)
    hosts = values["hosts"]
    if not isinstance(hosts, dict) or not 0 < len(hosts) <= MAX_HOSTS:
        raise ValueError(f"hosts is not 1 to {MAX_HOSTS} host names with counts")
    for host, count in hosts.items():
        if (
            len(host) > _TEXT_LIMIT
            or isinstance(count, bool)
            or not isinstance(count, int)
            or not 0 < count <= _MAX_COUNT
        ):
            raise ValueError("hosts is not host names with positive counts")


# Triton's specialization data (`JITFunction.preload`'s input) as its fields and their JSON types.
_SPECIALIZATION_FIELDS = {
    "name": str,
    "signature": dict,
    "constant_keys": list,
    "constant_vals": list,
    "attrs_keys": list,
    "attrs_vals": list,
    "options": dict,
    "key": object,
}
# Fields later Tritons add: the GPU target the data is for (3.8 on; its `preload` checks it).
_SPECIALIZATION_OPTIONAL = {"target": dict}


def _check_specialization(text: Any) -> None:
    if not isinstance(text, str):
        raise ValueError("specialization is not a string or null")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("specialization is not JSON") from None
    if not isinstance(data, dict) or not set(_SPECIALIZATION_FIELDS) <= set(data) <= {
        *_SPECIALIZATION_FIELDS,
        *_SPECIALIZATION_OPTIONAL,
    }:
        raise ValueError("specialization is not Triton's specialization data")
    for name, kind in {**_SPECIALIZATION_FIELDS, **_SPECIALIZATION_OPTIONAL}.items():
        if name in data and not isinstance(data[name], kind):
            raise ValueError(f"specialization's {name} is not a JSON {kind.__name__}")
    if len(data["constant_keys"]) != len(data["constant_vals"]) or len(data["attrs_keys"]) != len(data["attrs_vals"]):
        raise ValueError("specialization's keys and values differ in number")
    if len(data["name"]) > _TEXT_LIMIT or not all(isinstance(name, str) for name in data["signature"]):
        raise ValueError("specialization names are not short strings")


@dataclass(frozen=True)
class JournalContents:
    # Per Triton key, every sighting merged.
    records: dict[str, Record]
    # Lines that were not records (damaged, foreign, too long), and bytes past the bound unread.
    damaged: int = 0
    truncated: bool = False

    def warn(self, path: Path) -> None:
        """One line for whatever had to be skipped, naming the journal."""
        if self.damaged:
            lines = "1 damaged line" if self.damaged == 1 else f"{self.damaged:,} damaged lines"
            logger.warning("journal %s: skipped %s", path, lines)
        if self.truncated:
            logger.warning("journal %s: larger than %d bytes; read up to that bound", path, MAX_JOURNAL_BYTES)


def journal_path(layout: CacheLayout, key: str, root: Path | None = None) -> Path:
    return layout.journals_dir_of(root) / f"{key}.jsonl"


def merge_records(into: dict[str, Record], records: Iterable[Record], imported: bool) -> dict[str, Record]:
    """Add `records` to `into` (by Triton key), merged as `Record.merged` says; returns `into`."""
    for record in records:
        known = into.get(record.triton_key)
        into[record.triton_key] = record if known is None else known.merged(record, imported)
    return into


class JournalParser:
    """A journal's records from its bytes in blocks: memory bounded by one line, not the file (an
    import reads every journal of an archive this way)."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        # Records read (before merging), for bounds across journals.
        self.count = 0
        self.damaged = 0
        self._partial = bytearray()
        self._overlong = False

    def feed(self, block: bytes) -> None:
        lines = block.split(b"\n")
        for line in lines[:-1]:
            self._line(bytes(self._partial) + line)
            self._partial.clear()
            self._overlong = False
        if not self._overlong:
            self._partial += lines[-1]
            if len(self._partial) > MAX_LINE_BYTES:
                self._partial.clear()
                self._overlong = True

    def _line(self, line: bytes) -> None:
        if self._overlong:
            self.damaged += 1
            return
        if not line.strip():
            return
        try:
            record = Record.from_line(line)
        except ValueError:
            self.damaged += 1
            return
        self.count += 1
        merge_records(self.records, [record], imported=False)

    def contents(self) -> JournalContents:
        """What was read; a torn last line (an append in progress, or cut by the bound) is ignored."""
        return JournalContents(self.records, self.damaged)


def parse(data: bytes) -> JournalContents:
    """Merge the records of a journal's bytes (a torn last line, an append in progress, is ignored)."""
    parser = JournalParser()
    parser.feed(data)
    return parser.contents()


def read_journal(path: Path) -> JournalContents:
    """The journal at `path` (empty when there is none), without following links, up to the bound."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return JournalContents({})
    except OSError as error:
        logger.warning("journal %s: not read (%s)", path, error.strerror or error)
        return JournalContents({})
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            logger.warning("journal %s: not a regular file; ignored", path)
            return JournalContents({})
        data = file.read(MAX_JOURNAL_BYTES + 1)
    contents = parse(data[:MAX_JOURNAL_BYTES])
    return dataclasses.replace(contents, truncated=len(data) > MAX_JOURNAL_BYTES)


def read_records(layout: CacheLayout, key: str) -> dict[str, Record]:
    """Every root's records for journal `key`, merged (the writable root's and each layer's: copies
    of one history, such as a baked image's on the host that recorded it, count once)."""
    records: dict[str, Record] = {}
    for root in layout.roots:
        path = journal_path(layout, key, root)
        contents = read_journal(path)
        contents.warn(path)
        merge_records(records, contents.records.values(), imported=True)
    return records


def journal_keys(layout: CacheLayout) -> list[str]:
    """The keys of every root's journals."""
    keys: dict[str, None] = {}
    for root in layout.roots:
        with contextlib.suppress(OSError):
            for path in sorted(layout.journals_dir_of(root).glob("*.jsonl")):
                if HEX64.fullmatch(path.stem):
                    keys[path.stem] = None
    return list(keys)


def append(layout: CacheLayout, key: str, records: Iterable[Record], lock_timeout_seconds: float = 2.0) -> None:
    """Add `records` to journal `key` of the writable root, under its lock, in one `O_APPEND`
    write; compacts first when the journal would pass its bound. A serving process calls this
    after a compile: it waits for the lock a short time only."""
    lines = [record.to_line() for record in records]
    data = b"".join(line for line in lines if len(line) <= MAX_LINE_BYTES)
    if not data:
        return
    path = journal_path(layout, key)
    make_directories(path.parent)
    with _journal_lock(layout, key, lock_timeout_seconds):
        size = _regular_size(path)
        if size + len(data) > MAX_JOURNAL_BYTES:
            _compact(path, parse(data).records, imported=False)
            return
        descriptor = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        try:
            if size and os.pread(descriptor, 1, size - 1) != b"\n":
                data = b"\n" + data  # a writer died mid-line: the torn line stays one damaged line
            while data:
                data = data[os.write(descriptor, data) :]
        finally:
            os.close(descriptor)


def merge(
    layout: CacheLayout,
    key: str,
    records: Iterable[Record],
    lock_timeout_seconds: float = 30.0,
    backup: Path | None = None,
) -> None:
    """Merge `records` (an imported journal, another cache's) into journal `key` of the writable
    root, compacted; per host the larger count (see the module's doc). `backup`: where to copy
    the journal as it was, under the same lock (an import's undo)."""
    path = journal_path(layout, key)
    make_directories(path.parent)
    with _journal_lock(layout, key, lock_timeout_seconds):
        if _regular_size(path) and backup is not None:
            make_directories(backup.parent)
            shutil.copy2(path, backup)
        _compact(path, merge_records({}, records, imported=True), imported=True)


def _bounded_lines(records: Iterable[Record]) -> list[bytes]:
    """The lines of the most recently seen records that fit the journal's bounds, oldest first."""
    kept: list[bytes] = []
    size = 0
    for record in sorted(records, key=lambda record: record.last_seen, reverse=True)[:MAX_RECORDS]:
        line = record.to_line()
        if len(line) > MAX_LINE_BYTES or size + len(line) > MAX_JOURNAL_BYTES // 2:
            continue
        kept.append(line)
        size += len(line)
    return kept[::-1]


def _compact(path: Path, incoming: dict[str, Record], imported: bool) -> None:
    """Rewrite the journal with `incoming` as one line per kernel, within its bounds (the lock is
    held)."""
    merged = merge_records(dict(read_journal(path).records), incoming.values(), imported)
    kept = _bounded_lines(merged.values())
    if len(kept) < len(merged):
        logger.warning("journal %s: kept the %d most recently seen of %d kernels", path, len(kept), len(merged))
    write_atomic(path, b"".join(kept))


def _regular_size(path: Path) -> int:
    """The journal's size; a link or anything but a regular file in its place is an error."""
    try:
        status = path.lstat()
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(status.st_mode):
        raise OSError(f"{path} is not a regular file; kprecompile does not write through it")
    return status.st_size


def _journal_lock(layout: CacheLayout, key: str, timeout_seconds: float) -> contextlib.AbstractContextManager[None]:
    """The journal's OS lock, held for one append or rewrite (milliseconds): a short wait, then an
    OSError naming the lock (a serving process logs it and goes on)."""
    return hold_briefly(layout.locks_dir / f"{JOURNAL_LOCK_PREFIX}{key}.lock", timeout_seconds)
