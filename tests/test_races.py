"""Deleting from a cache beside the processes that fill it, with real CLI processes and real
compiles (AITER's FP8 BMM on gfx942): `cache prune` looping and `cache rm` beside a compiling
`warm`, `cache rm` racing an `import`, four overlapping warms beside `prune --max-size`.

Every process exits 0 or 1 with no traceback; afterwards `verify --deep` tells the truth, which
these tests check on their own (each file a manifest records, read and hashed here, and the group
file's mapping); a configuration it calls not warm is warm after one `warm`; and no staging
directory or temporary file is left in a served bucket. The guard all of them hold is the root's
usage lock (`kprecompile/cache/usage.py`): `warm` and `import` hold it shared, `cache rm` and
`cache prune` exclusively.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import pack, unpack

from kprecompile.cache.layout import triton_entry_name
from kprecompile.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.compiles]

SMALL = ["--model", "deepseek-v2-lite", "--family", "fp8_bmm", "--target", "gfx942"]
# m = 1..3: four kernels; m = 1..17 adds four more (m >= 16 is a specialized integer class), so
# the two configurations share four entries.
FEW, MORE = 3, 17
HOUR = 3600


def serving(seqs: int) -> list[str]:
    return [*SMALL, "--max-num-seqs", str(seqs)]


def in_process(*argv) -> int:
    with pytest.raises(SystemExit) as exited:
        main([str(part) for part in argv])
    return exited.value.code


@pytest.fixture(scope="module")
def warm_few(tmp_path_factory) -> Path:
    """A cache warm for FEW only, copied per test."""
    cache = tmp_path_factory.mktemp("races") / "cache"
    assert in_process("warm", *serving(FEW), "--cache-dir", cache) == 0
    return cache


@pytest.fixture(scope="module")
def more_archive(warm_few, tmp_path_factory) -> Path:
    """MORE's signed archive (its eight kernels, four shared with FEW) and 400 more entries, which
    keep an import installing long enough for another process to start beside it."""
    directory = tmp_path_factory.mktemp("races-archive")
    cache = directory / "cache"
    shutil.copytree(warm_few, cache)
    assert in_process("warm", *serving(MORE), "--cache-dir", cache) == 0
    assert in_process("export", *serving(MORE), "--cache-dir", cache, "--archive", directory / "more.tgz") == 0
    index, files = unpack(directory / "more.tgz")
    for number in range(400):
        name = triton_entry_name(hashlib.sha256(b"padding %d" % number).hexdigest())
        files[f"triton-v1/{name}/kernel.hsaco"] = b"kernel %d" % number
        files[f"triton-v1/{name}/__grp__kernel.json"] = json.dumps(
            {"child_paths": {"kernel.hsaco": "/b/kernel.hsaco"}}
        ).encode()
    return pack(directory / "padded.tgz", index, files)


@pytest.fixture
def cache(warm_few, tmp_path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(warm_few, copy)
    return copy


# --- Processes -----------------------------------------------------------------------------

# A CLI process with its modules imported, released by a line on stdin: it starts at once when
# the test decides (a moment inside another process's work), not a process start later.
READY = """
import sys
from kprecompile.cli import main
import kprecompile.cache.pruning, kprecompile.cache.inventory, kprecompile.cli.cache
import kprecompile.inputs.toolchain, kprecompile.inputs.targets
print("ready", flush=True)
sys.stdin.readline()
main(sys.argv[1:])
"""


class Runs:
    """Every CLI process a test started, for the checks all of them share."""

    def __init__(self) -> None:
        self.finished: list[tuple[list[str], int, str, str]] = []
        self._lock = threading.Lock()

    def start(self, *argv) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "kprecompile", *map(str, argv)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def start_ready(self, *argv) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-c", READY, *map(str, argv)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = process.stdout.readline()
        assert ready == "ready\n", ready + process.stderr.read()
        return process

    def release(self, process: subprocess.Popen) -> None:
        process.stdin.write("go\n")
        process.stdin.flush()

    def wait(self, process: subprocess.Popen, argv) -> tuple[int, str, str]:
        out, err = process.communicate(timeout=300)
        with self._lock:
            self.finished.append(([str(part) for part in argv], process.returncode, out, err))
        return process.returncode, out, err

    def run(self, *argv) -> tuple[int, str, str]:
        return self.wait(self.start(*argv), argv)

    def check_clean(self) -> None:
        """Every process exited 0 or 1, without a traceback."""
        for argv, status, _, err in self.finished:
            assert status in (0, 1), f"{argv}: exit {status}: {err[-2000:]}"
            assert "Traceback" not in err, f"{argv}: {err[-2000:]}"


def loop_until(runs: Runs, done: threading.Event, *argv) -> threading.Thread:
    """`kprecompile ARGV` again and again until `done`, then once more."""

    def loop() -> None:
        while True:
            last = done.is_set()
            runs.run(*argv)
            if last:
                return

    thread = threading.Thread(target=loop)
    thread.start()
    return thread


def wait_for(condition, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert process.poll() is None, "the process ended before the moment the test waits for"
        assert time.time() < deadline, "the moment the test waits for never came"
        time.sleep(0.01)


# --- What the cache holds afterwards -------------------------------------------------------


def manifest_problems(root: Path, manifest: Path) -> list[str]:
    """Why `manifest`'s configuration would not be served as recorded, checked here without
    kprecompile's code: the document's checksum, then for each job its entry's group file (each
    name mapped to the file of that name, the recorded names exactly) and each recorded file
    (a regular file of the recorded size and sha256)."""
    document = json.loads(manifest.read_bytes())
    body = {name: value for name, value in document.items() if name != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    if document["checksum"] != hashlib.sha256(canonical).hexdigest():
        return ["the manifest's checksum"]
    problems = []
    for job in document["jobs"]:
        entry = root / "triton-v1" / triton_entry_name(job["key"])
        recorded = job["artifacts"]
        groups = sorted(entry.glob("__grp__*.json")) if entry.is_dir() else []
        if not recorded or len(groups) != 1:
            problems.append(f"{entry.name}: {len(recorded)} files recorded, {len(groups)} group files")
            continue
        children = json.loads(groups[0].read_bytes())["child_paths"]
        if set(children) != set(recorded) or any(Path(path).name != name for name, path in children.items()):
            problems.append(f"{entry.name}: the group file maps {children}")
        for name, expected in recorded.items():
            path = entry / name
            if path.is_symlink() or not path.is_file():
                problems.append(f"{entry.name}/{name}: missing")
                continue
            data = path.read_bytes()
            if (len(data), hashlib.sha256(data).hexdigest()) != (expected["size"], expected["sha256"]):
                problems.append(f"{entry.name}/{name}: not the recorded bytes")
    return problems


def verify_tells_the_truth(runs: Runs, root: Path, seqs: int) -> bool:
    """`verify --deep`'s verdict on the configuration, checked: warm only when every file its
    manifest records is there as recorded; not warm only when its manifest is missing or something
    it records is not, and then one `warm` makes it warm. Whether it was warm."""
    status, out, _ = runs.run("verify", *serving(seqs), "--cache-dir", root, "--deep", "--json")
    [verdict] = json.loads(out)["targets"]
    manifest = Path(verdict["manifest"]) if verdict.get("manifest") else None
    if verdict["status"] == "warm":
        assert status == 0 and manifest is not None
        assert manifest_problems(root, manifest) == [], f"verify says {seqs} is warm"
        return True
    assert status == 1
    assert manifest is None or not manifest.is_file() or manifest_problems(root, manifest), (
        f"verify says {seqs} is not warm: {verdict}"
    )
    assert runs.run("warm", *serving(seqs), "--cache-dir", root)[0] == 0
    status, out, _ = runs.run("verify", *serving(seqs), "--cache-dir", root, "--deep", "--json")
    [verdict] = json.loads(out)["targets"]
    assert status == 0 and verdict["status"] == "warm"
    assert manifest_problems(root, Path(verdict["manifest"])) == []
    return False


def manifests(root: Path) -> list[Path]:
    return sorted((root / "manifests-v8").glob("*.json"))


def nothing_partial(root: Path) -> None:
    """No import's staging, no temporary file of an all-or-nothing write (kprecompile's
    `.NAME.XXXX.tmp`, Triton's `NAME.tmp.pid_...`), no entry whose group file names a file that is
    not there."""
    assert not list(root.glob(".import-*"))
    for bucket in ("triton-v1", "manifests-v8"):
        for path in (root / bucket).rglob("*"):
            assert not path.name.endswith(".tmp") and ".tmp.pid_" not in path.name, path
    for group in (root / "triton-v1").glob("*/__grp__*.json"):
        children = json.loads(group.read_bytes())["child_paths"]
        assert all((group.parent / Path(path).name).is_file() for path in children.values()), group


def new_entries(root: Path, before: set[str]):
    return lambda: bool(set(os.listdir(root / "triton-v1")) - before)


def age(paths, seconds: float) -> None:
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


# --- Deleting beside a compiling warm ------------------------------------------------------


def test_prune_looping_beside_a_compiling_warm_deletes_nothing_the_warm_uses(cache):
    """FEW's entries are an hour old and no manifest references them (an earlier warm killed
    before its manifest): what `prune` removes, past its grace period. MORE's warm finds them
    compiled and compiles its four others; prunes loop from the moment it compiles. They wait for
    it: its manifest then references every entry it counted, and MORE is warm."""
    runs = Runs()
    [few] = manifests(cache)
    few.unlink()
    age([path for path in (cache / "triton-v1").rglob("*")], HOUR)
    before = set(os.listdir(cache / "triton-v1"))
    warm = runs.start("warm", *serving(MORE), "--cache-dir", cache, "--jobs", "1")
    # Compiling: the warm has counted FEW's entries as compiled (it checks every job first).
    wait_for(new_entries(cache, before), warm)
    done = threading.Event()
    pruning = loop_until(runs, done, "cache", "prune", "--cache-dir", cache, "--json")
    status, _, err = runs.wait(warm, ["warm", MORE])
    done.set()
    pruning.join()
    assert status == 0, err
    runs.check_clean()
    prunes = [run for run in runs.finished if run[0][:2] == ["cache", "prune"]]
    assert len(prunes) >= 2
    assert verify_tells_the_truth(runs, cache, MORE), "the warm exited 0, yet MORE is not warm"
    # FEW's own manifest is gone: not warm, and one warm makes it warm (`verify_tells_the_truth`).
    assert not verify_tells_the_truth(runs, cache, FEW)
    nothing_partial(cache)
    runs.check_clean()


def test_rm_of_a_configuration_sharing_kernels_beside_a_compiling_warm(cache):
    """`cache rm` of FEW while MORE's warm compiles, having counted the entries the two share as
    compiled: the rm waits for the warm, then keeps the shared entries MORE's new manifest
    references."""
    runs = Runs()
    [few] = manifests(cache)
    before = set(os.listdir(cache / "triton-v1"))
    rm = runs.start_ready("cache", "rm", few.stem, "--cache-dir", cache, "--json")
    warm = runs.start("warm", *serving(MORE), "--cache-dir", cache, "--jobs", "1")
    wait_for(new_entries(cache, before), warm)
    runs.release(rm)
    assert runs.wait(rm, ["cache", "rm", few.stem])[0] == 0
    assert runs.wait(warm, ["warm", MORE])[0] == 0
    runs.check_clean()
    assert [path.stem for path in manifests(cache)] != [few.stem]
    assert verify_tells_the_truth(runs, cache, MORE), "the warm exited 0, yet MORE is not warm"
    nothing_partial(cache)
    runs.check_clean()


# --- Deleting beside an import -------------------------------------------------------------


@pytest.mark.parametrize("chosen", ["--all", "MORE"])
def test_rm_racing_an_import_waits_and_removes_what_it_installed(cache, more_archive, chosen):
    """An import of MORE (whose kernels include FEW's) into a cache warm for FEW; `cache rm`
    starts while the import is unpacking. It waits for the import: `--all` then removes both
    configurations, and MORE's key finds MORE installed and removes it alone."""
    runs = Runs()
    [few] = manifests(cache)
    importing = runs.start("import", more_archive, "--cache-dir", cache, "--json")
    wait_for(lambda: any(cache.glob(".import-*")), importing)
    if chosen == "MORE":
        # MORE's key, as its archive's bundle names it (not in the cache yet).
        index, _ = unpack(more_archive)
        [chosen] = [configuration["manifest"] for configuration in index["configurations"]]
    rm = runs.start_ready("cache", "rm", chosen, "--cache-dir", cache, "--json")
    runs.release(rm)
    rm_status, rm_out, rm_err = runs.wait(rm, ["cache", "rm", chosen])
    import_status, _, import_err = runs.wait(importing, ["import"])
    assert import_status == 0, import_err
    assert rm_status == 0, rm_err
    runs.check_clean()
    removed = {Path(removal["path"]).stem for removal in json.loads(rm_out)["removals"]}
    left = [path.stem for path in manifests(cache)]
    if chosen == "--all":
        assert left == [], "an rm --all that waited for the import left a manifest"
        assert {few.stem} < removed
    else:
        assert left == [few.stem] and chosen in removed
        assert verify_tells_the_truth(runs, cache, FEW)
    assert not verify_tells_the_truth(runs, cache, MORE)
    nothing_partial(cache)
    runs.check_clean()


# --- Overlapping warms beside prune --max-size ---------------------------------------------


def test_four_overlapping_warms_beside_prune_max_size(cache):
    """Four warms at once (MORE compiles four kernels; the others find every kernel compiled and
    only write their manifests), all sharing FEW's entries, while `prune --max-size` loops with a
    limit that evicts FEW (served a day ago) and whatever else it must. Every configuration whose
    manifest is left is warm, and every other one is warm after one `warm`."""
    runs = Runs()
    [few] = manifests(cache)
    age([few], 24 * HOUR)
    limit = sum(path.stat().st_size for path in cache.rglob("*") if path.is_file()) - 1
    before = set(os.listdir(cache / "triton-v1"))
    sizes = (MORE, 5, 9, 33)
    warms = [runs.start("warm", *serving(seqs), "--cache-dir", cache, "--jobs", "1") for seqs in sizes]
    wait_for(new_entries(cache, before), warms[0])
    done = threading.Event()
    pruning = loop_until(runs, done, "cache", "prune", "--max-size", f"{limit}B", "--cache-dir", cache, "--json")
    for seqs, warm in zip(sizes, warms, strict=True):
        status, _, err = runs.wait(warm, ["warm", seqs])
        assert status == 0, err
    done.set()
    pruning.join()
    runs.check_clean()
    assert not (cache / "manifests-v8" / few.name).exists(), "FEW, the least recently served, stayed"
    left = {path.stem for path in manifests(cache)}
    for path in manifests(cache):
        assert manifest_problems(cache, path) == [], f"{path.name} is left, not as it records"
    verdicts = {seqs: verify_tells_the_truth(runs, cache, seqs) for seqs in (FEW, *sizes)}
    assert sum(verdicts.values()) == len(left)
    nothing_partial(cache)
    runs.check_clean()
