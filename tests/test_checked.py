"""A warm `warm` and `verify` at the cost of a stat per file: the memo of the last whole check
(`cache/checked.py`), Triton's identity and variables without importing Triton, and what still
finds every change.

Each test gets a copy of the session's baked cache (DeepSeek-V2-Lite, FP8 BMM and MLA decode).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BAKED_MODEL as MODEL
from helpers import BAKED_SERVING as SERVING
from helpers import baked_manifest

from kprecompile.cache import entries, manifest
from kprecompile.cache.checked import checked_memo
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.warmup.verification import verify
from kprecompile.warmup.warming import warm

GFX942 = TARGETS["gfx942"]


def request() -> Request:
    return Request(MODEL, SERVING, select(MODEL), (GFX942,))


def rewrite_in_place(path, data: bytes) -> None:
    """New bytes of the same size into the same inode, its modification time put back: what
    only the change time (and the content) tells apart."""
    status = path.stat()
    with open(path, "r+b") as file:
        file.write(data)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert path.stat().st_size == status.st_size and path.stat().st_mtime_ns == status.st_mtime_ns


def flipped(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def refuse_hashing(monkeypatch) -> None:
    """Any file hashed by a check (the cache's) or by a server (`served.py`) fails the test."""
    from kprecompile.cache import served

    def hashed(path):
        raise AssertionError(f"{path} was hashed")

    monkeypatch.setattr(entries, "sha256_file", hashed)
    monkeypatch.setattr(served, "sha256_file", hashed)


def test_a_warm_warm_hashes_nothing_until_a_file_changes(warm_copy, monkeypatch):
    layout = warm_copy
    lookup = baked_manifest(layout, GFX942)
    memo = checked_memo(layout, lookup.key)
    # The memo the bake left was copied with the cache: it names the original's inodes, so the
    # copy's first warm checks every file whole.
    copied = memo.read_bytes()
    with monkeypatch.context() as patched:
        refuse_hashing(patched)
        with pytest.raises(AssertionError, match="was hashed"):
            warm(request(), layout)
    assert warm(request(), layout).ok and memo.read_bytes() != copied
    with monkeypatch.context() as patched:
        refuse_hashing(patched)
        report = warm(request(), layout)
        assert report.ok and report.cached == len(lookup.manifest.jobs) and report.replaced == 0
        assert verify(request(), layout).warm
    # A binary rewritten in place, its size and modification time as they were: found, replaced.
    job = lookup.manifest.jobs[-1]
    [binary] = layout.triton_entry(job.key).glob("*.hsaco")
    rewrite_in_place(binary, flipped(binary.read_bytes()))
    with monkeypatch.context() as patched:
        # The control: the memo no longer matches, so the check hashes (and here cannot).
        refuse_hashing(patched)
        with pytest.raises(AssertionError, match="was hashed"):
            warm(request(), layout)
    report = warm(request(), layout)
    assert (report.replaced, report.compiled, report.failed) == (1, 1, 0)
    assert verify(request(), layout, deep=True).warm


def test_verify_deep_hashes_whatever_the_memo_says(warm_copy, monkeypatch):
    layout = warm_copy
    assert warm(request(), layout).ok
    lookup = baked_manifest(layout, GFX942)
    job = lookup.manifest.jobs[0]
    [binary] = layout.triton_entry(job.key).glob("*.hsaco")
    rewrite_in_place(binary, flipped(binary.read_bytes()))
    # Sizes alone cannot see it, and the memo no longer vouches: plain verify says warm, --deep not.
    assert verify(request(), layout).warm
    [deep] = verify(request(), layout, deep=True).targets
    assert [(problem.key, "sha256" in problem.problem) for problem in deep.problems] == [(job.key, True)]


def test_a_manifest_read_again_unchanged_is_not_checked_field_by_field(warm_copy, monkeypatch, caplog):
    layout = warm_copy
    assert warm(request(), layout).ok
    lookup = baked_manifest(layout, GFX942)

    def checked(document, key):
        raise ValueError("checked field by field")

    monkeypatch.setattr(manifest, "_check_document", checked)
    assert manifest.read_manifest(layout, lookup.key) == lookup.manifest
    # The control: the same bytes written again (a new change time) are checked again.
    lookup.path.write_bytes(lookup.path.read_bytes())
    assert manifest.read_manifest(layout, lookup.key) is None
    assert "checked field by field" in caplog.text


def test_a_bundle_carries_no_memo(baked):
    """A memo names this machine's inodes: `bake` leaves it in its cache, out of the bundle."""
    out, _, _ = baked
    assert list(out.glob("manifests-v*/*.checked")), "the bake's warm wrote no memo: nothing to leave out"
    index = json.loads((out / "bundle.json").read_text())
    assert index["files"] and not [name for name in index["files"] if name.endswith(".checked")]


WARM_AGAIN = """
import sys
from kprecompile.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exited:
    assert exited.code == 0, exited.code
print(sorted(name for name in ("torch", "triton") if name in sys.modules))
"""


def test_a_warm_warm_and_verify_import_neither_triton_nor_torch(warm_copy):
    layout = warm_copy
    arguments = ["--model", "deepseek-v2-lite", "--max-num-seqs", "3", "--target", "gfx942"]
    arguments += ["--cache-dir", str(layout.root), "--json"]

    def imported(command: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, "-c", WARM_AGAIN, command, *arguments], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.splitlines()[-1].replace("'", '"'))

    # The control: without the cache's memos of Triton's key and variables, Triton is imported.
    for memo in layout.toolchain_dir.iterdir():
        memo.unlink()
    assert imported("warm") == ["triton"]
    assert imported("warm") == [] and imported("verify") == []


def test_a_server_takes_files_unchanged_since_the_whole_check_at_a_stat_each(warm_copy, monkeypatch):
    from kprecompile.cache import served
    from kprecompile.cache.checked import checked_files
    from kprecompile.cache.entries import group_children, group_file

    layout = warm_copy
    assert warm(request(), layout).ok  # the memo of a whole check of this copy
    lookup = baked_manifest(layout, GFX942)
    files = served.ServedFiles()
    files.record(lookup.manifest)
    checked = checked_files(layout, lookup.key, lookup.path, (job.key for job in lookup.manifest.jobs))
    assert checked is not None
    files.checked(checked)
    entry = layout.triton_entry(lookup.manifest.jobs[0].key)
    children = group_children(entry, group_file(entry).name)
    with monkeypatch.context() as patched:
        refuse_hashing(patched)
        assert files.problem(entry.name, children, [layout.manifests_dir]) is None
        # The control: the binary rewritten in place (its size and modification time kept) is hashed.
        [binary] = entry.glob("*.hsaco")
        rewrite_in_place(binary, flipped(binary.read_bytes()))
        with pytest.raises(AssertionError, match="was hashed"):
            files.problem(entry.name, children, [layout.manifests_dir])
    problem = files.problem(entry.name, children, [layout.manifests_dir])
    assert problem == "its files' checksums are not the ones recorded"


def test_entries_hashed_as_they_compiled_are_recorded_only_while_their_files_are_unchanged(warm_copy, monkeypatch):
    """A warm hashes each entry as its kernel comes from the worker; the manifest takes that hash
    where every file still has the stat it had then, and hashes again an entry written since."""
    from kprecompile.cache.checked import entries_stats

    layout = warm_copy
    jobs = baked_manifest(layout, GFX942).manifest.jobs[:2]
    early = {job.key: entries.hashed_entry(layout, job.key) for job in jobs}
    kept, changed = jobs
    [binary] = layout.triton_entry(changed.key).glob("*.hsaco")
    rewrite_in_place(binary, flipped(binary.read_bytes()))
    _, identities = entries_stats(layout, [job.key for job in jobs])
    hashed_now = []
    original = entries.sha256_file
    monkeypatch.setattr(entries, "sha256_file", lambda path: hashed_now.append(str(path)) or original(path))
    recorded = manifest.record_artifacts(layout, jobs, entries.still_true(early, identities))
    # The kept entry's early hash is taken, not hashed again; the rewritten one is hashed again.
    assert not [path for path in hashed_now if path in early[kept.key].identities]
    assert str(binary) in hashed_now
    assert recorded[kept.key] == early[kept.key].digests == entries.artifact_digests(layout, kept.key)
    # The control: the early hash of the rewritten entry is not the file's any more, nor recorded.
    now = entries.artifact_digests(layout, changed.key)
    assert recorded[changed.key] == now != early[changed.key].digests
    assert now[binary.name]["sha256"] != early[changed.key].digests[binary.name]["sha256"]


def test_an_entry_whose_group_file_names_another_file_since_it_was_hashed_is_hashed_again(warm_copy):
    """An entry's group file rewritten after the early hash (Triton's write: a new file beside,
    the group file replaced to name it too) leaves every file hashed as it was: the early hash no
    longer holds, and the manifest records the file it lacked. Control: the untouched entry's does."""
    from kprecompile.cache.checked import entries_stats

    layout = warm_copy
    jobs = baked_manifest(layout, GFX942).manifest.jobs[:2]
    early = {job.key: entries.hashed_entry(layout, job.key) for job in jobs}
    kept, changed = jobs
    [group] = layout.triton_entry(changed.key).glob(entries.GROUP_PREFIX + "*")
    added = group.parent / "extra.json"
    added.write_text("{}")
    document = json.loads(group.read_text())
    document["child_paths"]["extra.json"] = str(added)
    replacement = group.with_name(group.name + ".tmp")
    replacement.write_text(json.dumps(document))
    os.replace(replacement, group)
    _, identities = entries_stats(layout, [job.key for job in jobs])
    assert all(
        identities[path] == identity for path, identity in early[changed.key].identities.items() if path != str(group)
    )
    holding = entries.still_true(early, identities)
    assert kept.key in holding and changed.key not in holding
    recorded = manifest.record_artifacts(layout, jobs, holding)
    assert "extra.json" in recorded[changed.key] and "extra.json" not in early[changed.key].digests


@pytest.mark.compiles
def test_a_cold_warm_hashes_each_entry_as_its_kernel_compiles(tmp_path, caplog):
    import logging

    from kprecompile.cache.layout import CacheLayout

    layout = CacheLayout.of(tmp_path)
    with caplog.at_level(logging.INFO, logger="kprecompile.warmup.warming"):
        report = warm(request(), layout, max_workers=2)
    assert report.ok and report.compiled == report.kernels > 0
    [line] = [record.getMessage() for record in caplog.records if record.getMessage().startswith("manifest of")]
    assert f"manifest of {report.kernels} kernels (every file hashed, {report.kernels} as it compiled)" in line
    [written] = report.manifests
    recorded = manifest.read_manifest(layout, Path(written).stem).artifacts
    assert len(recorded) == report.kernels
    assert all(entries.artifact_digests(layout, key) == files for key, files in recorded.items())
