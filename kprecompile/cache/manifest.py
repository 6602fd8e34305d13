"""Manifests: the jobs one configuration needs, written after all of them are in the cache.

A manifest is named by the hash of its parts, a named dict of everything that decides which
kernels a configuration compiles and what their binaries are (the recipe is
`kprecompile.warmup.manifest_key`'s; storage only checks that the parts hash to the name). It
lists each job with its Triton key and the size and sha256 of each of its files, the same of
Triton's driver modules a server of it loads (`warmup/driver_modules.py`), and the plan's family
rows; its `checksum` (sha256 of the rest of the document, canonical JSON) covers all of it, so a
changed job list or record reads as a damaged manifest. "No valid manifest" means "not warm".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checked import manifest_checked_before
from .entries import EntryProblem, artifact_digests, entry_problem
from .files import write_atomic
from .jobs import CompileJob
from .keys import hash_named_dict
from .layout import MANIFEST_SCHEMA, Bucket, CacheLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Manifest:
    key: str
    parts: dict[str, Any]
    # The plan's family rows for this configuration, as `plan --json` shows them.
    families: tuple[dict[str, Any], ...]
    jobs: tuple[CompileJob, ...]
    # Per job key: {file name: {"sha256", "size"}} of its cache entry's files.
    artifacts: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # The model as the user named it ({"name", "source"}: a preset, a path, a Hugging Face id),
    # for `cache ls`; not part of the key (the same config.json under two names is one model).
    model: dict[str, str] = field(default_factory=lambda: {"name": "", "source": ""})
    # The journal records this warm considered, by Triton key: "replayed", "planned" (the plan
    # has the kernel), or why it was not compiled. A warm replays only records not listed here.
    recorded: dict[str, str] = field(default_factory=dict)
    # Triton's driver modules built for it (utilities, launchers), by their Triton cache key:
    # {file name: {"sha256", "size"}}, as `artifacts` records a kernel's files.
    launchers: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        document = {
            "schema": MANIFEST_SCHEMA,
            "key": self.key,
            "parts": self.parts,
            "model": {"name": self.model.get("name", ""), "source": self.model.get("source", "")},
            "families": list(self.families),
            "jobs": [{**job.as_dict(), "artifacts": self.artifacts.get(job.key, {})} for job in self.jobs],
            "recorded": dict(sorted(self.recorded.items())),
            "launchers": dict(sorted(self.launchers.items())),
        }
        return json.dumps({**document, "checksum": document_checksum(document)}, indent=1).encode()


def document_checksum(document: dict[str, Any]) -> str:
    """sha256 of a manifest document without its checksum, as canonical JSON."""
    body = {name: value for name, value in document.items() if name != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def manifest_key(parts: dict[str, Any]) -> str:
    return hash_named_dict(parts)


def locate_manifest(layout: CacheLayout, key: str) -> Path | None:
    """The first root holding a manifest named `key`, or None."""
    return next((path for path in layout.manifest_paths(key) if path.is_file()), None)


def write_manifest(layout: CacheLayout, manifest: Manifest) -> str:
    path = layout.manifest_path(manifest.key)
    write_atomic(path, manifest.to_json())
    return str(path)


def read_manifest(layout: CacheLayout, key: str) -> Manifest | None:
    """The manifest for `key` in any root, or None; a corrupt one is logged and treated as absent.

    A manifest file that a whole check already read, unchanged since (`checked.py`), is not
    checked field by field again (0.07 s for DeepSeek-R1's 1,158 jobs)."""
    path = locate_manifest(layout, key)
    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"larger than {MAX_MANIFEST_BYTES} bytes")
        return parse_manifest(path.read_bytes(), key, checked=manifest_checked_before(layout, key, path))
    except (OSError, ValueError) as error:
        logger.warning("ignoring unreadable manifest %s: %s", path, error)
        return None


def parse_manifest(data: bytes, key: str, checked: bool = False) -> Manifest:
    """The manifest named `key` from its file's bytes, every field checked unless these bytes were
    `checked` before (an import checks a bundle's manifests with this before installing them);
    ValueError saying what is wrong."""
    try:
        document = json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not checked:
        _check_document(document, key)
        if manifest_key(document["parts"]) != key:
            raise ValueError("its parts do not hash to its key")
        if document.get("checksum") != document_checksum(document):
            raise ValueError("its content does not match its checksum")
    return Manifest(
        key=key,
        parts=document["parts"],
        families=tuple(dict(family) for family in document["families"]),
        jobs=tuple(CompileJob(**{k: v for k, v in job.items() if k != "artifacts"}) for job in document["jobs"]),
        artifacts={job["key"]: job["artifacts"] for job in document["jobs"]},
        model=dict(document["model"]),
        recorded=dict(document["recorded"]),
        launchers={key: dict(files) for key, files in document["launchers"].items()},
    )


# A manifest lists a configuration's kernels (DeepSeek-R1 TP8: 1,158, about 9 MB): far below this.
MAX_MANIFEST_BYTES = 256 << 20
HEX64 = re.compile(r"[0-9a-f]{64}")
_JOB_FIELDS = {field.name for field in dataclasses.fields(CompileJob)}
_FIELDS = {"schema", "key", "parts", "model", "families", "jobs", "recorded", "launchers", "checksum"}
# A model's name or source (a preset, a path, a Hugging Face id) is far shorter.
MAX_MODEL_TEXT = 4096
# Names of an entry's files as Triton writes them: plain names, no path.
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}")


def _check_document(document: Any, key: str) -> None:
    """Every field of a manifest as kprecompile writes it, or ValueError saying which is not."""
    if not isinstance(document, dict):
        raise ValueError(f"a JSON {type(document).__name__}, not an object")
    if document.get("schema") != MANIFEST_SCHEMA or document.get("key") != key:
        raise ValueError("schema or key mismatch")
    if not isinstance(document.get("parts"), dict):
        raise ValueError("parts is not an object")
    families, jobs = document.get("families"), document.get("jobs")
    if not isinstance(families, list) or not all(isinstance(family, dict) for family in families):
        raise ValueError("families is not a list of objects")
    if not isinstance(jobs, list):
        raise ValueError("jobs is not a list")
    if set(document) != _FIELDS:
        raise ValueError(f"its fields are not {', '.join(sorted(_FIELDS))}")
    recorded = document["recorded"]
    if not isinstance(recorded, dict) or not all(
        HEX64.fullmatch(key) and isinstance(outcome, str) and len(outcome) <= MAX_MODEL_TEXT
        for key, outcome in recorded.items()
    ):
        raise ValueError("recorded is not Triton keys with what became of each")
    model = document["model"]
    if (
        not isinstance(model, dict)
        or set(model) != {"name", "source"}
        or not all(isinstance(value, str) and len(value) <= MAX_MODEL_TEXT for value in model.values())
    ):
        raise ValueError("model is not a name and a source")
    for index, job in enumerate(jobs):
        if not isinstance(job, dict) or set(job) != _JOB_FIELDS | {"artifacts"}:
            raise ValueError(f"job {index} does not have the fields {sorted(_JOB_FIELDS | {'artifacts'})}")
        if not all(isinstance(job[name], str) for name in _JOB_FIELDS):
            raise ValueError(f"job {index} has a field that is not a string")
        if not HEX64.fullmatch(job["key"]):
            raise ValueError(f"job {index}'s key is not a Triton cache key (64 hex digits)")
        artifacts = job["artifacts"]
        if not isinstance(artifacts, dict):
            raise ValueError(f"job {index}'s artifacts is not an object")
        for name, record in artifacts.items():
            if not FILE_NAME.fullmatch(name) or ".." in name:
                raise ValueError(f"job {index} names a file {name[:80]!r} that is not a plain file name")
            if not is_file_record(record):
                raise ValueError(f"job {index}'s record of {name!r} is not a size and a sha256")
    launchers = document["launchers"]
    if not isinstance(launchers, dict) or not all(
        HEX64.fullmatch(key) and _is_files_record(files) for key, files in launchers.items()
    ):
        raise ValueError("launchers is not Triton keys with the plain names, sizes and sha256 of their files")


def _is_files_record(files: Any) -> bool:
    return isinstance(files, dict) and all(
        isinstance(name, str) and FILE_NAME.fullmatch(name) and ".." not in name and is_file_record(record)
        for name, record in files.items()
    )


def is_file_record(record: Any) -> bool:
    """A `{"sha256", "size"}` record as manifests and `bundle.json` list a file."""
    if not isinstance(record, dict) or set(record) != {"sha256", "size"}:
        return False
    size, digest = record["size"], record["sha256"]
    return (
        isinstance(size, int)
        and not isinstance(size, bool)
        and size >= 0
        and isinstance(digest, str)
        and HEX64.fullmatch(digest) is not None
    )


def read_all_manifest_parts(layout: CacheLayout) -> list[dict[str, Any]]:
    """`{"path", "parts"}` of every readable manifest in every root (to explain a missing key)."""
    paths: list[Path] = []
    for root in layout.roots:
        try:
            paths += sorted(layout.bucket(Bucket.MANIFESTS, root).glob("*.json"))
        except OSError:
            continue
    documents = []
    for path in paths:
        try:
            if path.stat().st_size > MAX_MANIFEST_BYTES:
                continue
            document = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(document, dict) and document.get("schema") == MANIFEST_SCHEMA:
            if isinstance(document.get("parts"), dict):
                documents.append({"path": str(path), "parts": document["parts"]})
    return documents


def job_problems(layout: CacheLayout, manifest: Manifest, deep: bool) -> list[tuple[CompileJob, EntryProblem]]:
    """Each job of `manifest` whose cache entry is missing or does not match its record."""
    problems = []
    for job in manifest.jobs:
        if problem := entry_problem(layout, job.key, manifest.artifacts.get(job.key, {}), deep):
            problems.append((job, problem))
    return problems


def record_artifacts(
    layout: CacheLayout, jobs: tuple[CompileJob, ...], known: Mapping[str, dict[str, dict[str, Any]]] | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """Sizes and checksums of every job's cache entry, for the manifest: `known`'s where it has
    the key (hashed earlier and still true: `entries.still_true`), else hashed now."""
    known = known or {}
    return {job.key: known[job.key] if job.key in known else artifact_digests(layout, job.key) or {} for job in jobs}
