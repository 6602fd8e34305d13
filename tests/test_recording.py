"""Kernels compiled while serving: recorded in the configuration's journal, compiled by the next
warm, carried by export, import and bake, reported by `misses` (real AITER FP8 BMM and the
tests' own kernel, gfx942, on the session's baked cache)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import logging
import multiprocessing
import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers import (
    BAKED_MODEL,
    BAKED_SERVING,
    SAMPLE_MODULE,
    baked_manifest,
    pack,
    run_cli,
    run_cli_json,
    sample_call,
    serving_process,
    unpack,
)

from kprecompile.cache import journal
from kprecompile.cache.layout import CacheLayout
from kprecompile.cache.manifest import read_manifest, write_manifest
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.serve.runtime import journal_sink
from kprecompile.tracing.trace import trace_calls

HERE = Path(__file__).parent
GFX942 = TARGETS["gfx942"]
# The session bake's configuration on gfx942, as `kprecompile warm` options.
BAKED = ["--model", "deepseek-v2-lite", "--tp", "1", "--max-num-seqs", "3", "--target", "gfx942"]
# m = 40 is beyond the plan's 3 sequences (two FP8 BMM kernels: W_K and W_V products), and
# add_kernel is a kernel no family covers.
UNPLANNED = ("1", "2", "3", "40", "add=1000")


def journal_of(layout):
    return journal_sink(Request(BAKED_MODEL, BAKED_SERVING, select(BAKED_MODEL, environ={})), layout, GFX942).key


def records_of(layout):
    return journal.read_records(layout, journal_of(layout))


def remove_entries(layout, keys):
    """As on another host: the recorded kernels are not in this cache."""
    for key in keys:
        shutil.rmtree(layout.triton_entry(key))


@pytest.mark.slow
def test_what_compiles_while_serving_is_recorded_warmed_and_then_loaded(warm_copy, capsys):
    layout = warm_copy
    planned = len(baked_manifest(layout, GFX942).manifest.jobs)
    first, _ = serving_process(layout.root, *UNPLANNED)
    assert first["compiles_per_call"] == [0] * 6 + [1, 1, 1]
    records = records_of(layout)
    assert len(records) == 3 and all(record.replayable for record in records.values())
    assert {record.kernel for record in records.values()} == {f"{SAMPLE_MODULE}:add_kernel", first["compiles"][0]}
    assert {record.manifest for record in records.values()} == {baked_manifest(layout, GFX942).key}
    remove_entries(layout, records)
    # `cache ls` counts them; `misses` names them, with the family that plans the BMM kernel.
    [listed] = [
        c
        for c in run_cli_json(capsys, "cache", "ls", "--cache-dir", str(layout.root))["configurations"]
        if c["target"] == "gfx942"
    ]
    assert listed["recorded"] == 3
    report = run_cli_json(capsys, "misses", "--cache-dir", str(layout.root), "--target", "MI300X")
    [misses] = report["journals"]
    assert misses["model"] == "deepseek-v2-lite" and len(misses["misses"]) == 3
    by_library = {miss["library"]: miss for miss in misses["misses"]}
    assert by_library["AITER"]["family"] == "fp8_bmm" and by_library[SAMPLE_MODULE]["family"] is None
    assert {miss["status"] for miss in misses["misses"]} == {"not replayed yet"}
    assert "BLOCK=64, EVEN=False" in by_library[SAMPLE_MODULE]["specialization"]
    # `verify` (and so the vLLM plugin and `prepare`, which warm what is not warm) says so.
    status, out, _ = run_cli(capsys, "verify", *BAKED, "--cache-dir", str(layout.root))
    assert status == 1
    assert "not warm: 3 kernels compiled while serving, not by a warm yet (kprecompile misses lists them)" in out

    # The next warm compiles them (with no GPU, as a builder does) and lists them in the manifest.
    warmed = run_cli_json(capsys, "warm", *BAKED, "--cache-dir", str(layout.root))
    assert warmed["compiled"] == 3 and warmed["failed"] == 0
    [row] = [family for family in warmed["families"] if family["family"] == "recorded"]
    assert (row["calls"], row["kernels"], row["parameters"]["skipped"]) == (3, 3, 0)
    manifest = baked_manifest(layout, GFX942).manifest
    assert len(manifest.jobs) == planned + 3 and set(manifest.recorded.values()) == {"replayed"}
    assert {
        miss["status"]
        for miss in run_cli_json(capsys, "misses", "--cache-dir", str(layout.root))["journals"][0]["misses"]
    } == {"compiled"}

    assert run_cli(capsys, "verify", *BAKED, "--cache-dir", str(layout.root))[0] == 0
    # A new serving process loads them with the plan's and compiles nothing.
    again, _ = serving_process(layout.root, *UNPLANNED)
    assert again["preload"]["loaded"] == planned + 3 and again["compiles_per_call"] == [0] * 9
    # Warm again: nothing new in the journal, nothing to do.
    assert run_cli_json(capsys, "warm", *BAKED, "--cache-dir", str(layout.root))["compiled"] == 0


def test_warm_no_recorded_leaves_the_journal_out(warm_copy, capsys):
    layout = warm_copy
    planned = len(baked_manifest(layout, GFX942).manifest.jobs)
    serving_process(layout.root, *UNPLANNED)
    remove_entries(layout, records_of(layout))
    report = run_cli_json(capsys, "warm", *BAKED, "--no-recorded", "--cache-dir", str(layout.root))
    assert report["compiled"] == 0 and "recorded" not in {family["family"] for family in report["families"]}
    assert len(baked_manifest(layout, GFX942).manifest.jobs) == planned


def test_strict_mode_still_records_the_compile_it_stops(warm_copy):
    layout = warm_copy
    result, _ = serving_process(layout.root, "40", strict="error")
    assert all(outcome.startswith("strict: ") for outcome in result["outcomes"])
    assert len(records_of(layout)) == 2 and all(record.replayable for record in records_of(layout).values())


def _rewrite(layout, records):
    path = journal.journal_path(layout, journal_of(layout))
    path.write_bytes(b"".join(record.to_line() for record in records))
    return path


@pytest.mark.slow
def test_records_that_cannot_be_compiled_again_are_skipped_with_one_line_each(warm_copy, capsys, caplog):
    layout = warm_copy
    serving_process(layout.root, "add=1000")
    [real] = records_of(layout).values()
    key = iter(hashlib.sha256(str(n).encode()).hexdigest() for n in range(100))
    gone = dataclasses.replace(real, triton_key=next(key), kernel="no_such_module_here:kernel")
    edited = dataclasses.replace(real, triton_key=next(key), source_hash="0" * 64)
    not_a_kernel = dataclasses.replace(real, triton_key=next(key), kernel=f"{SAMPLE_MODULE}:launch_add")
    no_such_kernel = dataclasses.replace(real, triton_key=next(key), kernel=f"{SAMPLE_MODULE}:gone_kernel")
    standard = dataclasses.replace(real, triton_key=next(key), kernel="json:dumps")
    # A one-letter module must not take `triton` and `torch` out of the process for the others.
    shadow = dataclasses.replace(real, triton_key=next(key), kernel="t:x")
    local = dataclasses.replace(real, triton_key=next(key), kernel=f"{SAMPLE_MODULE}:make.<locals>.kernel")
    data = json.loads(real.specialization)
    misnamed = dataclasses.replace(real, triton_key=next(key), specialization=json.dumps({**data, "name": "x" * 500}))
    script = dataclasses.replace(real, triton_key=next(key), kernel="__main__:kernel")
    inductor = dataclasses.replace(
        real, triton_key=next(key), kernel="triton_poi_fused_add_0", source_hash=None, specialization=None
    )
    other_env = dataclasses.replace(real, triton_key=next(key))
    foreign_toolchain = dataclasses.replace(real, triton_key=next(key), toolchain="f" * 64)
    other_target = dataclasses.replace(real, triton_key=next(key), target="gfx950")
    skipped = [
        gone,
        edited,
        not_a_kernel,
        no_such_kernel,
        standard,
        shadow,
        local,
        misnamed,
        script,
        inductor,
        other_env,
    ]
    # A specialization Triton's compiler refuses (a failing static assertion), as a compiler on a
    # builder may refuse what a GPU host's took: one warning, never a failed warm.
    [fault] = trace_calls([sample_call("launch_fault", 15)], GFX942, "test").jobs
    source_hash = importlib.import_module(SAMPLE_MODULE).fault_kernel.cache_key
    failing = dataclasses.replace(
        real, triton_key=fault.key, kernel=fault.kernel, specialization=fault.specialization, source_hash=source_hash
    )
    path = _rewrite(layout, [real, *skipped, failing, foreign_toolchain, other_target])
    not_triton_data = dataclasses.replace(real, triton_key=next(key), specialization="not json").to_line()
    with path.open("ab") as file:
        file.write(b"{not json\n" + b'{"record": 1, "triton_key": "x"}\n' + b"\xff\xfe\n" + not_triton_data)
    shutil.rmtree(layout.triton_entry(real.triton_key))
    with caplog.at_level(logging.WARNING):
        status, out, err = run_cli(capsys, "warm", *BAKED, "--cache-dir", str(layout.root), "--json")
    assert status == 0, err
    report = json.loads(out)
    assert report["compiled"] == 1 and report["failed"] == 0
    lines = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert sum("skipped 4 damaged lines" in line for line in lines) == 1
    manifest = baked_manifest(layout, GFX942).manifest
    outcomes = manifest.recorded
    assert outcomes[real.triton_key] == "replayed" and real.triton_key in {job.key for job in manifest.jobs}
    assert outcomes[gone.triton_key] == "cannot import it here (no module no_such_module_here)"
    assert outcomes[edited.triton_key] == "its source changed since it was recorded"
    assert outcomes[not_a_kernel.triton_key] == f"{SAMPLE_MODULE}:launch_add is a function, not a Triton kernel"
    assert outcomes[no_such_kernel.triton_key].startswith("cannot resolve it here (AttributeError")
    assert outcomes[standard.triton_key] == "json is a standard library module, not a kernel library"
    assert outcomes[shadow.triton_key] == "cannot import it here (no module t)"
    assert outcomes[local.triton_key].startswith("defined inside a function")
    assert outcomes[misnamed.triton_key].startswith("its specialization does not replay")
    assert len(outcomes[misnamed.triton_key]) <= 300
    assert outcomes[failing.triton_key].startswith("failed to compile here: ")
    assert failing.triton_key not in {job.key for job in manifest.jobs}
    assert outcomes[script.triton_key].startswith("defined in a script")
    assert outcomes[inductor.triton_key].startswith("compiled outside a Triton kernel launch")
    assert outcomes[other_env.triton_key].startswith("it compiles under Triton key")
    # One line for all that were skipped, one for what failed to compile, none per record.
    assert [line for line in lines if "recorded kernel" in line] == [
        "11 recorded kernels not compiled again: 2 not installed here, 1 another environment, 1 in a function, "
        "1 in a script, 1 in the standard library, 1 not a kernel, 1 not replayable, 1 not resolved, "
        "1 source changed, 1 specialization does not replay (kprecompile misses says why for each)",
        "1 recorded kernel failed to compile here, the first with: CompileTimeAssertionFailure: code 15 never "
        "compiles (kprecompile misses says why for each)",
    ]
    assert not any(record.triton_key[:12] in line for record in [*skipped, failing] for line in lines)
    # Every outcome is final: the configuration is warm, and the next warm has nothing to do.
    assert run_cli(capsys, "verify", *BAKED, "--cache-dir", str(layout.root))[0] == 0
    # Records of another toolchain or target are kept for them, not replayed here.
    assert foreign_toolchain.triton_key not in outcomes and other_target.triton_key not in outcomes
    assert {foreign_toolchain.triton_key, other_target.triton_key} <= set(records_of(layout))
    [listed] = run_cli_json(capsys, "misses", "--cache-dir", str(layout.root))["journals"]
    statuses = {miss["triton_key"]: miss["status"] for miss in listed["misses"]}
    assert statuses[foreign_toolchain.triton_key] == "other toolchain"
    assert statuses[gone.triton_key].startswith("cannot import it here")


def _append_many(root: str, key: str, worker: int, count: int, bound: int | None = None) -> None:
    if bound is not None:
        journal.MAX_JOURNAL_BYTES = bound  # this worker process's own module
    layout = CacheLayout.of(root)
    base = _sample_record()
    for n in range(count):
        # Every worker records kernel n (one key), and one of its own.
        shared = dataclasses.replace(base, triton_key=f"{n:064x}", first_seen=1000.0 + worker, last_seen=1000.0 + n)
        own = dataclasses.replace(base, triton_key=f"{worker + 1:08x}{n:056x}", last_seen=2000.0 + n)
        journal.append(layout, key, [shared, own])


# Triton's specialization data's shape (what `JITFunction.preload` reads), for records of tests.
_SPECIALIZATION = json.dumps(
    {
        "name": "k",
        "signature": {},
        "constant_keys": [],
        "constant_vals": [],
        "attrs_keys": [],
        "attrs_vals": [],
        "options": {},
        "key": None,
    }
)


def _sample_record() -> journal.Record:
    return journal.Record(
        triton_key="a" * 64,
        kernel="m:k",
        target="gfx942",
        toolchain="b" * 64,
        source_hash="c" * 64,
        specialization=_SPECIALIZATION,
        manifest="d" * 64,
        model="m",
        first_seen=1.0,
        last_seen=1.0,
        seconds=0.5,
        hosts={"h": 1},
        origin="local",
    )


def _appending_at_once(root, key: str, workers: int, count: int, bound: int | None = None) -> None:
    """`workers` processes running `_append_many` side by side."""
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_append_many, args=(str(root), key, worker, count, bound)) for worker in range(workers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0


def test_ranks_appending_at_once_lose_nothing_and_duplicates_merge(tmp_path):
    key, workers, count = "e" * 64, 4, 60
    _appending_at_once(tmp_path, key, workers, count)
    contents = journal.read_journal(journal.journal_path(CacheLayout.of(tmp_path), key))
    assert contents.damaged == 0 and len(contents.records) == count + workers * count
    shared = contents.records[f"{0:064x}"]
    assert shared.count == workers and shared.first_seen == 1000.0


def test_ranks_appending_while_others_compact_lose_no_recent_record(tmp_path):
    """With a bound small enough that appends keep compacting the journal (a rewrite and rename),
    the lock keeps every append on the file that stays: each worker's newest record is kept."""
    key, workers, count, bound = "e" * 64, 4, 80, 24 << 10
    _appending_at_once(tmp_path, key, workers, count, bound)
    path = journal.journal_path(CacheLayout.of(tmp_path), key)
    contents = journal.read_journal(path)
    assert contents.damaged == 0 and path.stat().st_size <= bound
    for worker in range(workers):
        assert f"{worker + 1:08x}{count - 1:056x}" in contents.records


def test_the_journal_never_grows_past_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "MAX_JOURNAL_BYTES", 64 << 10)
    layout, key = CacheLayout.of(tmp_path), "e" * 64
    base = _sample_record()
    line = len(base.to_line())
    for n in range(3 * journal.MAX_JOURNAL_BYTES // line):
        journal.append(layout, key, [dataclasses.replace(base, triton_key=f"{n:064x}", last_seen=float(n + 1))])
    path = journal.journal_path(layout, key)
    assert path.stat().st_size <= journal.MAX_JOURNAL_BYTES
    kept = journal.read_journal(path).records
    newest = 3 * journal.MAX_JOURNAL_BYTES // line - 1
    # The most recently seen are kept.
    assert f"{newest:064x}" in kept and f"{0:064x}" not in kept
    # A file beyond the bound (written by something else) is read up to it, and says so.
    path.write_bytes(base.to_line() * (2 * journal.MAX_JOURNAL_BYTES // line))
    assert journal.read_journal(path).truncated


def test_a_journal_that_is_a_link_or_not_a_file_is_neither_read_nor_written_through(tmp_path, caplog):
    layout, key = CacheLayout.of(tmp_path / "cache"), "e" * 64
    path = journal.journal_path(layout, key)
    path.parent.mkdir(parents=True)
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(_sample_record().to_line())
    path.symlink_to(outside)
    with caplog.at_level(logging.WARNING):
        assert journal.read_records(layout, key) == {}
    assert "not read" in caplog.text
    with pytest.raises(OSError, match="not a regular file"):
        journal.append(layout, key, [dataclasses.replace(_sample_record(), triton_key="f" * 64)])
    assert outside.read_bytes() == _sample_record().to_line()
    path.unlink()
    os.mkfifo(path)
    assert journal.read_records(layout, key) == {}


@pytest.mark.slow
def test_export_import_and_bake_carry_the_journal_to_a_builder(warm_copy, capsys, tmp_path):
    """A GPU host records and exports; a builder imports (merging the journal into its cache) and
    bakes an image that compiles what the host recorded."""
    layout = warm_copy
    serving_process(layout.root, "40", "add=1000")
    archive = tmp_path / "host.tgz"
    run_cli_json(capsys, "export", *BAKED, "--cache-dir", str(layout.root), "--archive", str(archive))
    builder = tmp_path / "builder"
    imported = run_cli_json(capsys, "import", str(archive), "--cache-dir", str(builder))
    assert imported["journal_records"] == 3
    assert set(records_of(CacheLayout.of(builder))) == set(records_of(layout))
    # Importing the same archive again counts nothing twice; a later export of the host's grown
    # history merges with what the builder recorded itself, per host the larger count.
    run_cli_json(capsys, "import", str(archive), "--cache-dir", str(builder))
    assert {record.count for record in records_of(CacheLayout.of(builder)).values()} == {1}
    recorded = next(record for record in records_of(layout).values() if record.kernel.startswith("aiter."))
    [host] = recorded.hosts
    journal.append(CacheLayout.of(builder), journal_of(layout), [dataclasses.replace(recorded, hosts={"builder": 5})])
    journal.append(layout, journal_of(layout), [dataclasses.replace(recorded, hosts={host: 2})])
    run_cli_json(capsys, "export", *BAKED, "--cache-dir", str(layout.root), "--archive", str(archive))
    run_cli_json(capsys, "import", str(archive), "--cache-dir", str(builder))
    merged = records_of(CacheLayout.of(builder))
    assert merged[recorded.triton_key].hosts == {host: 3, "builder": 5} and len(merged) == 3
    image = tmp_path / "image"
    baked = run_cli_json(capsys, "bake", *BAKED, "--cache-dir", str(builder), "--out", str(image))
    assert baked["failed"] == 0
    manifest = baked_manifest(CacheLayout.of(image), GFX942).manifest
    # The AITER kernels; the tests' own kernel came from an archive, which names no module outside
    # the traced libraries that a warm would import.
    assert sum(job.family == "recorded" for job in manifest.jobs) == 2
    [sample] = [record for record in merged.values() if record.kernel.startswith(SAMPLE_MODULE)]
    assert manifest.recorded[sample.triton_key].startswith(f"{SAMPLE_MODULE} is not a module of aiter or vllm")
    # The image carries the journal (listed in its bundle.json); with --no-recorded, none of it.
    assert any(name.startswith("journals-v1/") for name in json.loads((image / "bundle.json").read_text())["files"])
    plain = tmp_path / "plain"
    run_cli_json(capsys, "bake", *BAKED, "--cache-dir", str(builder), "--out", str(plain), "--no-recorded")
    assert not any(job.family == "recorded" for job in baked_manifest(CacheLayout.of(plain), GFX942).manifest.jobs)


def test_an_imported_journal_with_damaged_lines_is_merged_without_them(warm_copy, capsys, tmp_path, caplog):
    layout = warm_copy
    serving_process(layout.root, "add=1000")
    exported = tmp_path / "host.tgz"
    run_cli_json(capsys, "export", *BAKED, "--cache-dir", str(layout.root), "--archive", str(exported))
    index, files = unpack(exported)
    [name] = [name for name in files if name.startswith("journals-v1/")]
    oversized = b'{"record": 1, "kernel": "' + b"x" * journal.MAX_LINE_BYTES + b'"}'
    files[name] += b"garbage\n" + oversized + b"\n" + b"[1, 2]\n"
    archive = pack(tmp_path / "edited.tgz", index, files)
    builder = tmp_path / "builder"
    with caplog.at_level(logging.WARNING):
        status, out, err = run_cli(capsys, "import", str(archive), "--cache-dir", str(builder), "--json")
    assert status == 0, err
    assert json.loads(out)["journal_records"] == 1 and len(records_of(CacheLayout.of(builder))) == 1
    assert caplog.text.count("skipped 3 damaged lines") == 1
    assert read_manifest(CacheLayout.of(builder), baked_manifest(layout, GFX942).key) is not None


def test_a_journal_in_a_layer_and_in_the_writable_root_counts_each_compile_once(tmp_path):
    """A baked image carries the journal of the host that then serves from it as a layer: the
    copies are one history."""
    key, record = "e" * 64, _sample_record()
    image, user = CacheLayout.of(tmp_path / "image"), CacheLayout.of(tmp_path / "user")
    journal.append(image, key, [dataclasses.replace(record, hosts={"h": 3})])
    journal.append(user, key, [dataclasses.replace(record, hosts={"h": 3, "other": 1})])
    [merged] = journal.read_records(CacheLayout.of(user.root, (image.root,)), key).values()
    assert merged.hosts == {"h": 3, "other": 1}


def test_a_record_holds_the_specialization_data_of_every_supported_triton_and_nothing_else():
    """Triton 3.8 adds the GPU target to its specialization data (its `preload` checks it); other
    fields, or a target of another JSON type, make the line damaged."""
    record = _sample_record()
    with_target = {**json.loads(_SPECIALIZATION), "target": {"backend": "hip", "arch": "gfx942", "warp_size": 64}}
    line = dataclasses.replace(record, specialization=json.dumps(with_target)).to_line()
    assert journal.Record.from_line(line.strip()).specialization == json.dumps(with_target)
    for damaged in ({**with_target, "target": "gfx942"}, {**json.loads(_SPECIALIZATION), "other": {}}):
        line = dataclasses.replace(record, specialization=json.dumps(damaged)).to_line()
        with pytest.raises(ValueError, match="specialization"):
            journal.Record.from_line(line.strip())


# Modules a crafted journal could name, each leaving a marker file when its code runs.
_PLANTED = {
    "planted_cli/__init__.py": "",
    # As `tqdm.__main__` or `numpy.f2py.__main__`: a command line that runs at import.
    "planted_cli/__main__.py": "import pathlib; pathlib.Path({marker!r}, 'planted_cli').touch()\n",
    "planted_kernels.py": (
        "import pathlib; pathlib.Path({marker!r}, 'planted_kernels').touch()\n"
        "import triton\n\n\n@triton.jit\ndef kernel(x_ptr):\n    pass\n"
    ),
}


def _plant(tmp_path, monkeypatch, files) -> Path:
    """Write `files` into a directory on the import path; returns the directory their markers go to."""
    markers = tmp_path / "markers"
    markers.mkdir()
    planted = tmp_path / "planted"
    for name, text in files.items():
        (planted / name).parent.mkdir(parents=True, exist_ok=True)
        (planted / name).write_text(text.format(marker=str(markers)))
    monkeypatch.syspath_prepend(str(planted))
    return markers


def _records_naming(*kernels: str, origin: str = "imported") -> list[journal.Record]:
    base = dataclasses.replace(_sample_record(), origin=origin)
    return [
        dataclasses.replace(base, kernel=kernel, triton_key=hashlib.sha256(kernel.encode()).hexdigest())
        for kernel in kernels
    ]


def test_replay_imports_no_module_an_imported_record_names(tmp_path, monkeypatch, caplog):
    """A record from an archive naming a module outside the traced libraries is refused before
    anything imports it (one naming a command line's `__main__` too, from anywhere); a local
    record naming the same module is imported (the negative control: the markers work). Many
    refused records are one warning line with counts by reason."""
    from kprecompile.warmup.replay import replay

    markers = _plant(tmp_path, monkeypatch, _PLANTED)
    imported = _records_naming("planted_cli.__main__:x", "tqdm.__main__:x", "planted_kernels:kernel")
    many = [dataclasses.replace(imported[2], triton_key=f"{n:064x}") for n in range(200)]
    with caplog.at_level(logging.WARNING):
        result = replay([*imported, *many], GFX942, set(), None)
    assert result.jobs == () and not list(markers.iterdir())
    assert result.outcomes[imported[0].triton_key] == (
        "planted_cli.__main__:x is not a plain module and name (no dunder or relative names)"
    )
    assert result.outcomes[imported[2].triton_key].startswith(
        "planted_kernels is not a module of aiter or vllm, and the record came from an archive"
    )
    [line] = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert line == (
        "203 recorded kernels not compiled again: 201 imported, outside the traced libraries, 2 odd names "
        "(kprecompile misses says why for each)"
    )

    [local] = _records_naming("planted_kernels:kernel", origin="local")
    [dunder] = _records_naming("planted_cli.__main__:x", origin="local")
    result = replay([local, dunder], GFX942, set(), None)
    assert {path.name for path in markers.iterdir()} == {"planted_kernels"}
    assert result.outcomes[local.triton_key] == "its source changed since it was recorded"
    assert result.outcomes[dunder.triton_key].startswith("planted_cli.__main__:x is not a plain module")


@pytest.fixture
def planted_library(tmp_path, monkeypatch):
    """A `vllm` package of the tests' own (this venv has none), its code leaving markers."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("a real vLLM is importable here")
    marker = "import pathlib; pathlib.Path({marker!r}, __name__).touch()\n"
    markers = _plant(
        tmp_path,
        monkeypatch,
        {
            "vllm/__init__.py": marker,
            "vllm/attention/__init__.py": marker,
            "vllm/attention/ops/__init__.py": marker,
            "vllm/attention/ops/planted.py": marker
            + "import triton\n\n\ndef kernel():\n    pass\n\n\n@triton.jit\ndef real(x_ptr):\n    pass\n",
        },
    )
    yield markers
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        del sys.modules[name]


def test_a_library_record_is_found_in_its_source_before_anything_is_imported(planted_library):
    """A record naming a library module that defines no Triton kernel of that name (or no such
    module) imports nothing, not even the packages above it; one whose source defines the
    kernel goes on to the import (the negative control)."""
    from kprecompile.warmup.replay import replay

    not_a_kernel, missing, hidden, real = _records_naming(
        "vllm.attention.ops.planted:kernel",
        "vllm.attention.ops.missing:kernel",
        "vllm.attention.__main__:kernel",
        "vllm.attention.ops.planted:real",
        origin="local",
    )
    result = replay([not_a_kernel, missing, hidden], GFX942, set(), None)
    assert result.jobs == () and not list(planted_library.iterdir())
    assert result.outcomes[not_a_kernel.triton_key] == (
        "vllm.attention.ops.planted's source defines no Triton kernel kernel; not imported"
    )
    assert result.outcomes[missing.triton_key] == (
        "cannot resolve it here (the installed vllm has no module vllm.attention.ops.missing)"
    )
    # The import begins (the package's code runs; vLLM's platform stand-ins then stop this one).
    replay([real], GFX942, set(), None)
    assert "vllm" in {path.name for path in planted_library.iterdir()}


def test_the_kernel_source_reader_finds_jit_functions_where_libraries_define_them(tmp_path):
    from kprecompile.tracing.kernel_source import defines_kernel, well_formed_module

    source = tmp_path / "kernels.py"
    source.write_text(
        "import triton\nfrom triton import jit\n\n"
        "@triton.heuristics({})\n@triton.jit(do_not_specialize=['n'])\ndef decorated(n):\n    pass\n\n"
        "if platform.is_rocm():\n    @jit\n    def under_if(n):\n        pass\n\n"
        "class Holder:\n    @triton.jit\n    def method(n):\n        pass\n\n"
        "def plain(n):\n    pass\n\n"
        "def outer():\n    @triton.jit\n    def inner(n):\n        pass\n"
    )
    assert [defines_kernel(source, name) for name in ("decorated", "under_if", "Holder.method")] == [True] * 3
    assert [defines_kernel(source, name) for name in ("plain", "inner", "outer.inner", "Holder", "gone")] == [False] * 5
    plain = ("aiter.ops.triton", "vllm._custom_ops", "sample_kernels")
    assert [well_formed_module(name) for name in plain] == [True] * 3
    odd = ("tqdm.__main__", "numpy.f2py.__main__", ".relative", "a..b", "a.", "class.x", "x.__init__", "é-x")
    assert [well_formed_module(name) for name in odd] == [False] * len(odd)


def test_a_settled_outcome_never_makes_verify_import_the_module_it_names(tmp_path, monkeypatch):
    """A manifest's outcome (an archive's, possibly) names a missing module; deciding whether it
    is found now searches a top-level name only, which runs nothing."""
    from kprecompile.warmup.replay import settled

    markers = _plant(
        tmp_path, monkeypatch, {"plantedpkg/__init__.py": "import pathlib; pathlib.Path({marker!r}, 'ran').touch()\n"}
    )
    record = _sample_record()
    assert settled(record, "cannot import it here (no module plantedpkg.sub)")
    assert not settled(record, "cannot import it here (no module plantedpkg)")  # found now: retried
    assert settled(record, "cannot import it here (no module no_such_package_here)")
    assert not list(markers.iterdir())


def test_a_journal_line_without_an_origin_reads_as_imported():
    line = json.loads(_sample_record().to_line())
    assert journal.Record.from_line(json.dumps(line).encode()).origin == "local"
    del line["origin"]
    assert journal.Record.from_line(json.dumps(line).encode()).origin == "imported"
    with pytest.raises(ValueError, match="origin is not one of local, imported"):
        journal.Record.from_line(json.dumps({**line, "origin": "trusted"}).encode())


def test_an_imported_record_stays_imported_and_a_local_one_wins_a_merge():
    local, imported = _sample_record(), dataclasses.replace(_sample_record(), origin="imported", kernel="n:k")
    assert local.merged(imported).kernel == imported.merged(local).kernel == "m:k"
    assert imported.merged(imported).origin == "imported"


def test_import_marks_every_record_of_an_archive_imported_whatever_its_lines_say(warm_copy, capsys, tmp_path):
    layout = warm_copy
    exported = tmp_path / "host.tgz"
    run_cli_json(capsys, "export", *BAKED, "--cache-dir", str(layout.root), "--archive", str(exported))
    index, files = unpack(exported)
    [claims_local] = _records_naming("planted_kernels:kernel", origin="local")
    files[f"journals-v1/{journal_of(layout)}.jsonl"] = claims_local.to_line()
    archive = pack(tmp_path / "edited.tgz", index, files)
    builder = CacheLayout.of(tmp_path / "builder")
    assert run_cli_json(capsys, "import", str(archive), "--cache-dir", str(builder.root))["journal_records"] == 1
    assert [record.origin for record in records_of(builder).values()] == ["imported"]
    # Negative control: what a serving process of this cache appends stays local.
    journal.append(builder, journal_of(layout), [dataclasses.replace(claims_local, triton_key="f" * 64)])
    assert sorted(record.origin for record in records_of(builder).values()) == ["imported", "local"]


def test_a_model_name_with_a_newline_prints_escaped_in_misses(tmp_path, capsys):
    """A journal's model name (an archive's) cannot add a line to `misses`; --json keeps it as is."""
    layout = CacheLayout.of(tmp_path / "cache")
    forged = "m\nKERNEL  LIBRARY  FAMILY  SEEN  LAST SEEN  STATUS  compiled"
    journal.append(layout, "e" * 64, [dataclasses.replace(_sample_record(), model=forged)])
    _, out, _ = run_cli(capsys, "misses", "--cache-dir", str(layout.root))
    lines = out.splitlines()
    assert lines[0].startswith("m\\nKERNEL  LIBRARY") and len(lines) == 3  # the title, the header, the kernel
    assert run_cli_json(capsys, "misses", "--cache-dir", str(layout.root))["journals"][0]["model"] == forged


def test_a_model_name_with_a_newline_is_one_row_of_cache_ls(warm_copy, capsys):
    layout = warm_copy
    lookup = baked_manifest(layout, GFX942)
    forged = {"name": "/models/m\n/models/other  gfx950  forged row", "source": "path /models/m\n"}
    write_manifest(layout, dataclasses.replace(lookup.manifest, model=forged))
    _, plain, _ = run_cli(capsys, "cache", "ls", "--cache-dir", str(layout.root))
    configurations = run_cli_json(capsys, "cache", "ls", "--cache-dir", str(layout.root))["configurations"]
    lines = plain.splitlines()
    assert len(lines) == 1 + len(configurations) + 1  # the header, one row each, the totals
    assert sum(line.startswith("/models/m\\n/models/other  gfx950  forged row") for line in lines) == 1
    assert forged["name"] in {configuration["model"] for configuration in configurations}
