"""`kprecompile cache dir | ls | rm | prune` on real warmed caches (AITER's FP8 BMM, gfx942)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_cli, run_cli_json, serving_process

from kprecompile.cache.layout import CacheLayout
from kprecompile.cache.locks import hold_lock
from kprecompile.cache.manifest import Manifest, manifest_key, read_manifest, write_manifest
from kprecompile.cache.usage import CACHEDIR_TAG, USAGE_LOCK, using
from kprecompile.cli import main

pytestmark = pytest.mark.compiles

SMALL = ["--model", "deepseek-v2-lite", "--family", "fp8_bmm", "--target", "gfx942"]
# m = 1..3 and 1..17: the second adds the kernels of m >= 16 (a specialized integer class).
FEW, MORE = ["--max-num-seqs", "3"], ["--max-num-seqs", "17"]


@pytest.fixture(scope="module")
def two_configurations(tmp_path_factory):
    """A cache warmed for two configurations sharing some kernels, copied per test."""
    cache = tmp_path_factory.mktemp("cache-commands") / "cache"
    for serving in (FEW, MORE):
        with pytest.raises(SystemExit) as exited:
            main(["warm", *SMALL, *serving, "--cache-dir", str(cache)])
        assert exited.value.code == 0
    return cache


@pytest.fixture
def cache(two_configurations, tmp_path):
    copy = tmp_path / "cache"
    shutil.copytree(two_configurations, copy)
    return copy


def _hold_until_killed(path: Path, ready) -> None:
    with hold_lock(path, "test", 60, "KPRECOMPILE_LOCK_TIMEOUT"):
        ready.set()
        time.sleep(600)


def _lock_of_a_killed_holder(path: Path) -> Path:
    """The lock file a process killed (SIGKILL) while holding `path` leaves behind."""
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=_hold_until_killed, args=(path, ready))
    holder.start()
    assert ready.wait(60), "the holder never took the lock"
    holder.kill()
    holder.join()
    assert path.exists()
    return path


def verified(capsys, cache, serving) -> int:
    return run_cli(capsys, "verify", *SMALL, *serving, "--cache-dir", str(cache))[0]


def test_dir_ls_and_the_cachedir_tag(capsys, cache):
    assert run_cli(capsys, "cache", "dir", "--cache-dir", str(cache))[1].strip() == str(cache)
    assert run_cli_json(capsys, "cache", "dir", "--cache-dir", str(cache)) == {
        "schema_version": 1,
        "cache_dir": str(cache),
        "layers": [],
    }
    assert (cache / CACHEDIR_TAG).read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    listing = run_cli_json(capsys, "cache", "ls", "--cache-dir", str(cache))
    assert listing["schema_version"] == 1
    configurations = listing["configurations"]
    assert sorted(c["serving"]["max_num_seqs"] for c in configurations) == [3, 17]
    for configuration in configurations:
        assert configuration["model"] == "deepseek-v2-lite" and configuration["model_source"].startswith("preset")
        assert configuration["target"] == "gfx942" and configuration["toolchain_current"] is True
        assert configuration["status"] == "warm" and configuration["kernels"] > 0 and configuration["bytes"] > 0
    few, more = sorted(configurations, key=lambda c: c["serving"]["max_num_seqs"])
    # The shared kernels are counted once in the totals.
    assert few["kernels"] < more["kernels"] and listing["kernels"] == more["kernels"]
    _, text, _ = run_cli(capsys, "cache", "ls", "--cache-dir", str(cache))
    assert "deepseek-v2-lite  gfx942" in text and "2 configurations" in text


def test_rm_removes_a_configuration_and_only_the_kernels_no_other_one_uses(capsys, cache):
    layout = CacheLayout.of(cache)
    entries = set(os.listdir(layout.triton_dir))
    few = next(
        c
        for c in run_cli_json(capsys, "cache", "ls", "--cache-dir", str(cache))["configurations"]
        if c["serving"]["max_num_seqs"] == 17
    )
    dry = run_cli_json(capsys, "cache", "rm", few["manifest"][:12], "--cache-dir", str(cache), "--dry-run")
    assert dry["dry_run"] and set(os.listdir(layout.triton_dir)) == entries
    assert verified(capsys, cache, MORE) == 0
    done = run_cli_json(capsys, "cache", "rm", few["manifest"][:12], "--cache-dir", str(cache))
    assert done["removals"] == dry["removals"]
    kinds = [removal["kind"] for removal in done["removals"]]
    assert kinds.count("configuration") == 1 and kinds.count("entry") > 0
    # The configuration is gone, its own kernels with it; the other one is still warm.
    assert verified(capsys, cache, MORE) == 1 and verified(capsys, cache, FEW) == 0
    removed = {Path(removal["path"]).name for removal in done["removals"] if removal["kind"] == "entry"}
    assert set(os.listdir(layout.triton_dir)) == entries - removed


def test_rm_by_target_takes_product_names_in_any_case(capsys, cache):
    everything = run_cli_json(capsys, "cache", "rm", "--all", "--dry-run", "--cache-dir", str(cache))
    by_product = run_cli_json(capsys, "cache", "rm", "--target", "MI300X", "--dry-run", "--cache-dir", str(cache))
    assert by_product["removals"] == everything["removals"] and everything["removals"]
    status, _, err = run_cli(capsys, "cache", "rm", "--target", "mi355x", "--dry-run", "--cache-dir", str(cache))
    assert status == 2 and "configurations of the writable cache" in err


def test_prune_removes_what_this_toolchain_can_never_serve_and_keeps_what_it_can(capsys, cache):
    layout = CacheLayout.of(cache)
    [current] = [
        c
        for c in run_cli_json(capsys, "cache", "ls", "--cache-dir", str(cache))["configurations"]
        if c["serving"]["max_num_seqs"] == 3
    ]
    # A configuration another Triton built (a valid manifest, another toolchain in its parts).
    manifest = read_manifest(layout, current["manifest"])
    parts = {**manifest.parts, "toolchain": {**manifest.parts["toolchain"], "triton_key": "0" * 64}}
    foreign = Manifest(manifest_key(parts), parts, manifest.families, manifest.jobs, manifest.artifacts, manifest.model)
    write_manifest(layout, foreign)
    # An old layout version, an old kernel nothing references, free locks, a dead import's staging.
    (cache / "manifests-v5").mkdir()
    (cache / "manifests-v5" / "x.json").write_text("{}")
    orphan = layout.triton_dir / "ORPHAN"
    orphan.mkdir()
    (orphan / "__grp__k.json").write_text("{}")
    os.utime(orphan / "__grp__k.json", (0, 0))
    fresh = layout.triton_dir / "FRESH"
    fresh.mkdir()
    (fresh / "__grp__k.json").write_text("{}")
    launcher = layout.triton_dir / "LAUNCHER"
    launcher.mkdir()
    (launcher / "__triton_launcher.so").write_bytes(b"\x7fELF")
    os.utime(launcher / "__triton_launcher.so", (0, 0))
    (cache / ".import-dead").mkdir()
    # The two warms left no lock file behind (each holder deleted its own); one killed while it
    # held a kernel's lock leaves one.
    assert os.listdir(layout.locks_dir) == [USAGE_LOCK]
    killed = _lock_of_a_killed_holder(layout.lock_path("0" * 64))
    plan = run_cli_json(capsys, "cache", "prune", "--cache-dir", str(cache))
    removed = {(removal["kind"], Path(removal["path"]).name) for removal in plan["removals"]}
    assert ("configuration", f"{foreign.key}.json") in removed
    assert ("bucket", "manifests-v5") in removed and ("entry", "ORPHAN") in removed
    assert ("staging", ".import-dead") in removed
    assert {name for kind, name in removed if kind == "lock"} == {killed.name}
    # Kept: both current configurations, a kernel written moments ago, a launcher module.
    assert not (cache / "manifests-v5").exists() and not orphan.exists() and not (cache / ".import-dead").exists()
    assert os.listdir(layout.locks_dir) == [USAGE_LOCK]
    assert fresh.exists() and launcher.exists()
    assert verified(capsys, cache, FEW) == 0 and verified(capsys, cache, MORE) == 0
    assert run_cli_json(capsys, "cache", "prune", "--cache-dir", str(cache))["removals"] == []


def test_prune_prints_a_summary_and_lists_kernel_entries_and_locks_with_v(capsys, cache):
    """Lock files left behind (an earlier kprecompile left one per kernel): the dry run's text is the
    summary and what is not counted by the thousand; `-v` lists every lock file too."""
    layout = CacheLayout.of(cache)
    for entry in os.listdir(layout.triton_dir):
        layout.lock_path(entry).touch()
    status, out, _ = run_cli(capsys, "cache", "prune", "--dry-run", "--cache-dir", str(cache))
    assert status == 0
    summary = out.splitlines()[-1]
    assert summary.startswith("Would remove ") and "lock files" in summary and summary.endswith("; -v lists each)")
    assert not [line for line in out.splitlines() if line.startswith("  lock")]
    status, out, _ = run_cli(capsys, "-v", "cache", "prune", "--dry-run", "--cache-dir", str(cache))
    locks = [line for line in out.splitlines() if line.startswith("  lock")]
    assert status == 0 and len(locks) > 1 and not out.splitlines()[-1].endswith("; -v lists each)")
    document = run_cli_json(capsys, "cache", "prune", "--dry-run", "--cache-dir", str(cache))
    assert len([removal for removal in document["removals"] if removal["kind"] == "lock"]) == len(locks)


def test_a_cache_rm_typo_is_said_at_once_while_a_warm_uses_the_cache(cache):
    """A warm holds the cache's usage lock: `cache rm` of a model it lacks says so at once; of one it
    has, it waits (the control: the lock is really held), then removes it once the warm is done."""

    def rm(model: str) -> subprocess.Popen:
        command = [sys.executable, "-m", "kprecompile", "cache", "rm", "--model", model, "--cache-dir", str(cache)]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    with using(CacheLayout.of(cache)):  # what a running warm holds
        typo = rm("deepseek-v2-lit")
        assert typo.wait(timeout=120) == 2
        assert typo.stderr.read().strip().startswith("kprecompile: cache rm: got 'deepseek-v2-lit', expected")
        waiting = rm("deepseek-v2-lite")
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=5)
    assert waiting.wait(timeout=120) == 0, waiting.stderr.read()
    assert "waiting for" in waiting.stderr.read()


def test_prune_max_size_evicts_the_least_recently_served(capsys, cache):
    listing = run_cli_json(capsys, "cache", "ls", "--cache-dir", str(cache))
    few, more = sorted(listing["configurations"], key=lambda c: c["serving"]["max_num_seqs"])
    os.utime(more["path"], (time.time() - 86400, time.time() - 86400))  # served a day ago
    limit = listing["cache_bytes"] - 1
    plan = run_cli_json(capsys, "cache", "prune", "--max-size", f"{limit}B", "--cache-dir", str(cache))
    evicted = [removal for removal in plan["removals"] if removal["kind"] == "configuration"]
    assert [Path(removal["path"]).stem for removal in evicted] == [more["manifest"]]
    assert verified(capsys, cache, FEW) == 0 and verified(capsys, cache, MORE) == 1
    after = run_cli_json(capsys, "cache", "ls", "--cache-dir", str(cache))
    assert after["cache_bytes"] <= limit


def _warm_in_progress(cache: str, seconds: float, started) -> None:
    """What a warm does under the usage lock: an old entry it found in the cache lies
    unreferenced until its manifest is written (here: it is taken away again before the lock is
    released, so a prune that waited never sees it)."""
    layout = CacheLayout.of(cache)
    with using(layout):
        entry = layout.triton_dir / "IN-USE"
        entry.mkdir()
        (entry / "__grp__k.json").write_text("{}")
        os.utime(entry / "__grp__k.json", (0, 0))
        started.set()
        time.sleep(seconds)
        shutil.rmtree(entry)


def test_prune_waits_for_a_warm_in_progress(capsys, cache):
    """A warm holds the root's usage lock while its entries are not yet referenced: a prune
    started meanwhile waits for it, and deletes nothing the warm was using."""
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    warm = context.Process(target=_warm_in_progress, args=(str(cache), 3.0, started))
    warm.start()
    assert started.wait(60)
    plan = run_cli_json(capsys, "cache", "prune", "--cache-dir", str(cache))
    warm.join()
    assert warm.exitcode == 0
    assert [removal for removal in plan["removals"] if removal["kind"] in ("configuration", "entry")] == []
    assert verified(capsys, cache, FEW) == 0 and verified(capsys, cache, MORE) == 0


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["cache", "rm"], "kprecompile: cache rm: got 'nothing', expected a MANIFEST key, --model, --target or --all"),
        (
            ["cache", "rm", "--model", "nope"],
            "kprecompile: cache rm: got 'nope', expected configurations of the "
            "writable cache (see kprecompile cache ls)",
        ),
        (
            ["cache", "prune", "--max-size", "lots"],
            "kprecompile: --max-size: got 'lots', expected a size with its unit, such as 10G, 500MB, 2GiB or 4096B",
        ),
        (  # a bare number was once 10 bytes: every configuration evicted
            ["cache", "prune", "--max-size", "10"],
            "kprecompile: --max-size: got '10', expected a size with its unit, such as 10G, 500MB, 2GiB or 4096B",
        ),
        (
            ["misses", "zz"],
            "kprecompile: MANIFEST: got 'zz', expected a manifest key or its prefix (hex digits, see "
            "kprecompile cache ls)",
        ),
        (
            ["misses", "--target", "mi999"],
            "kprecompile: --target: got 'mi999', expected one of gfx90a, gfx942, "
            "gfx950, sm80, sm89, sm90, sm100, a product (mi210, mi250, mi250x, mi300a, mi300x, mi325x, mi350x, mi355x, "
            "a100, l40s, l4, h100, h200, h20, b200, gb200), or auto",
        ),
    ],
)
def test_bad_cache_commands_are_one_line_and_exit_2(capsys, cache, argv, expected):
    entries = sorted(os.listdir(CacheLayout.of(cache).triton_dir))
    status, out, err = run_cli(capsys, *argv, "--cache-dir", str(cache))
    assert (status, out, err) == (2, "", expected + "\n")
    assert sorted(os.listdir(CacheLayout.of(cache).triton_dir)) == entries


def test_last_served_is_when_a_server_loaded_the_configuration_never_when_it_was_warmed(capsys, warm_copy):
    """The session's bake (gfx942 and gfx950, warmed, never served); a serving process preloads
    gfx942's: `cache ls` says so for gfx942 alone; a warm that follows leaves it; `rm` takes the
    stamp with the configuration, and `prune` one whose configuration is gone."""
    root = str(warm_copy.root)

    def listing() -> dict[str, dict]:
        document = run_cli_json(capsys, "cache", "ls", "--cache-dir", root)
        return {configuration["target"]: configuration for configuration in document["configurations"]}

    def column() -> dict[str, str]:
        _, out, _ = run_cli(capsys, "cache", "ls", "--cache-dir", root)
        return {row.split()[1]: " ".join(row.split()[-3:-1]) for row in out.splitlines()[1:-1]}

    assert {target: c["last_served"] for target, c in listing().items()} == {"gfx942": None, "gfx950": None}
    assert [value.split()[-1] for value in column().values()] == ["never", "never"]
    serving_process(root)  # preloads gfx942's kernels, as a server's plugin does
    served = listing()
    assert served["gfx942"]["last_served"] is not None and served["gfx950"]["last_served"] is None
    assert served["gfx942"]["last_used"] >= served["gfx942"]["last_served"]
    assert column()["gfx942"].endswith("just now") and column()["gfx950"].endswith("never")
    baked = ["deepseek-v2-lite", "--max-num-seqs", "3", "--target", "gfx942"]
    status, _, err = run_cli(capsys, "warm", *baked, "--cache-dir", root)
    assert status == 0, err
    assert listing()["gfx942"]["last_served"] == served["gfx942"]["last_served"]
    stamp = Path(served["gfx942"]["path"]).with_suffix(".served")
    assert stamp.is_file()
    assert run_cli(capsys, "cache", "rm", "--target", "gfx942", "--cache-dir", root)[0] == 0
    assert not stamp.exists()
    orphan = Path(served["gfx950"]["path"]).with_name("f" * 64 + ".served")
    orphan.touch()
    plan = run_cli_json(capsys, "cache", "prune", "--cache-dir", root)
    assert [r["path"] for r in plan["removals"] if r["kind"] == "manifest"] == [str(orphan)]
    assert not orphan.exists() and Path(served["gfx950"]["path"]).exists()
