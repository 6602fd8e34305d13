"""The serving side on real AITER kernels: activate, preload, the JIT monitor, the loader hook."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import BAKED_MODEL as MODEL
from helpers import BAKED_SERVING as SERVING
from helpers import SAMPLE_MODULE, baked_manifest, serving_process

from kprecompile.cache.layout import CacheLayout
from kprecompile.errors import NotWarmError
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.serve.monitor import JitMonitor
from kprecompile.serve.runtime import activate
from kprecompile.warmup.preload import _ListenerCounter, load_order, preload, start_preload

HERE = Path(__file__).parent


@pytest.fixture
def cache_copy(warm_copy):
    """A private copy of the baked cache and how many kernels its gfx942 manifest lists."""
    return warm_copy.root, len(baked_manifest(warm_copy, TARGETS["gfx942"]).manifest.jobs)


def test_activate_points_triton_and_aiter_at_the_cache_and_is_idempotent(tmp_path, monkeypatch, caplog):
    from triton import knobs

    monkeypatch.delenv("AITER_JIT_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/a/user/triton/cache")
    with knobs.cache.scope():
        for attempt in range(2):
            caplog.clear()
            layout = activate(tmp_path / "c")
            assert os.environ["TRITON_CACHE_DIR"] == str(layout.triton_dir) == knobs.cache.dir
            assert os.environ["AITER_JIT_DIR"] == str(layout.aiter_jit_dir)
            # The user's Triton cache is replaced with one WARNING naming it; the second call replaces
            # nothing of the user's (the control), and says nothing.
            warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
            if attempt == 0:
                [warning] = warnings
                assert warning.startswith("kprecompile: replacing TRITON_CACHE_DIR=/a/user/triton/cache: ")
                assert "TRITON_CACHE_MANAGER" not in warning
            else:
                assert warnings == []


@pytest.mark.parametrize("background", [False, True], ids=["in-the-caller", "in-a-thread"])
def test_preload_in_a_fresh_process_compiles_nothing_and_strict_mode_stops_what_does(cache_copy, background):
    """Loaded in the caller or in a thread of its own (a server's start), the engine's calls then
    find every planned kernel in memory."""
    cache_dir, kernels = cache_copy
    result, stderr = serving_process(cache_dir, 1, 2, 3, 40, *["background"] * background, strict="error")
    assert result["preload"]["kernels"] == result["preload"]["loaded"] == kernels
    assert (result["preload"]["waited"] is not None) == background
    assert result["preload"]["compiled"] == 0 and result["compiles_during_preload"] == 0
    # Triton did not hash libtriton for its key: preload handed it the cache's memo, its own key.
    assert result["triton_key_handed"] and result["triton_key_equal"]
    # The engine's own calls find the preloaded kernels in memory: straight to launch.
    assert result["outcomes"][:6] == ["reached launch"] * 6 and result["compiles_per_call"][:6] == [0] * 6
    # m = 40 is beyond the planned 3 sequences: its compile is named and raised in the launching call.
    unplanned = result["outcomes"][6:]
    assert len(unplanned) == 2 and result["compiles_per_call"][6:] == [1, 1]
    for outcome in unplanned:
        assert outcome.startswith("strict: ") and "batched_gemm" in outcome and "KPRECOMPILE_STRICT=error" in outcome
    assert "kprecompile: 2 kernels compiled while serving" in stderr


def test_without_the_caches_memo_of_the_triton_key_triton_computes_its_own(cache_copy):
    """The control of the memo handed to Triton: a cache without it (a layer's, a fresh writable
    one) leaves Triton's key to Triton."""
    cache_dir, kernels = cache_copy
    for memo in CacheLayout.of(cache_dir).toolchain_dir.glob("*.json"):
        if "triton_key_text" in json.loads(memo.read_text()):
            memo.unlink()
    result, _ = serving_process(cache_dir, 1)
    assert result["preload"]["loaded"] == kernels and result["preload"]["compiled"] == 0
    assert not result["triton_key_handed"] and result["triton_key_equal"]


def _binary_of_first_job(cache_dir):
    """The compiled binary of the manifest's first kernel, in the writable cache."""
    layout = CacheLayout.of(cache_dir)
    job = baked_manifest(layout, TARGETS["gfx942"]).manifest.jobs[0]
    [binary] = [path for path in layout.triton_entry(job.key).iterdir() if path.suffix == ".hsaco"]
    return binary


@pytest.mark.slow
@pytest.mark.parametrize("checked", [False, True], ids=["copied", "checked-by-a-warm"])
def test_a_binary_altered_in_place_is_not_loaded_but_compiled_again(cache_copy, checked):
    """Same size, other bytes: `verify` without --deep cannot see it; the serving process checks
    the sha256 of what it loads, compiles that kernel again, and says which entry it refused.
    Also where a warm checked every file whole just before (its memo then vouches for files by
    their stat, and the altered one's stat changed)."""
    cache_dir, kernels = cache_copy
    if checked:
        from kprecompile.warmup.warming import warm

        assert warm(Request(MODEL, SERVING, select(MODEL), (TARGETS["gfx942"],)), CacheLayout.of(cache_dir)).ok
    binary = _binary_of_first_job(cache_dir)
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF
    binary.write_bytes(bytes(data))
    result, stderr = serving_process(cache_dir)
    assert result["preload"]["loaded"] == kernels - 1 and result["preload"]["compiled"] == 1
    assert "not serving cache entry" in stderr and "checksums are not the ones recorded" in stderr
    # The kernel compiled again replaced the altered file: the next process loads everything.
    again, _ = serving_process(cache_dir)
    assert again["preload"]["loaded"] == kernels and again["preload"]["compiled"] == 0


def test_a_binary_replaced_by_a_link_is_not_loaded(cache_copy, tmp_path):
    """Same bytes behind a symbolic link: never followed inside the cache."""
    cache_dir, kernels = cache_copy
    binary = _binary_of_first_job(cache_dir)
    outside = tmp_path / "outside.hsaco"
    outside.write_bytes(binary.read_bytes())
    binary.unlink()
    binary.symlink_to(outside)
    result, stderr = serving_process(cache_dir)
    assert result["preload"]["loaded"] == kernels - 1 and result["preload"]["compiled"] == 1


def test_an_entry_directory_others_can_write_is_not_served(cache_copy):
    """The issue's world-writable entry directory, served: anyone could swap its files after the
    check. Guard: `others_can_write` in `LayeredCacheManager.get_group`. Control: every other
    entry, private, is loaded."""
    cache_dir, kernels = cache_copy
    entry = _binary_of_first_job(cache_dir).parent
    entry.chmod(0o777)
    result, stderr = serving_process(cache_dir)
    assert result["preload"]["loaded"] == kernels - 1 and result["preload"]["compiled"] == 1
    assert f"not serving cache entry {entry} ({entry.name} is writable by others (mode 0o777))" in stderr


def test_a_moved_cache_serves_from_itself(cache_copy, tmp_path):
    """Triton's group files name their files by absolute path at compile time; the cache is
    read by name beside them, so a cache moved elsewhere (the old place gone) loads every kernel."""
    cache_dir, kernels = cache_copy
    moved = tmp_path / "moved"
    Path(cache_dir).rename(moved)
    # The place the group files name (the session's bake) is gone too.
    for group in moved.glob("triton-v1/*/__grp__*.json"):
        document = json.loads(group.read_text())
        document["child_paths"] = {name: f"/gone/{Path(path).name}" for name, path in document["child_paths"].items()}
        group.write_text(json.dumps(document))
    result, _ = serving_process(moved)
    assert result["preload"]["loaded"] == kernels and result["preload"]["compiled"] == 0


@pytest.mark.compiles
def test_the_monitor_warns_names_and_counts_a_compile(tmp_path, sm90, caplog):
    """In warn mode (the default) a compile while serving is logged with its kernel and
    specialization, and counted in the summary line."""
    import importlib

    from triton import knobs

    from kprecompile.errors import LaunchRefusedError
    from kprecompile.platforms.triton_driver import active_target
    from kprecompile.tracing.trace import isolated_modules

    monitor = JitMonitor("warn").install()
    try:
        with (
            knobs.cache.scope(),
            caplog.at_level(logging.WARNING),
            active_target(sm90),
            isolated_modules((SAMPLE_MODULE,)),
            pytest.raises(LaunchRefusedError),
        ):
            knobs.cache.dir = str(tmp_path)
            importlib.import_module(SAMPLE_MODULE).launch_add(1000, 64)
    finally:
        monitor.uninstall()
    assert [event.kernel for event in monitor.compiles] == [f"{SAMPLE_MODULE}:add_kernel"]
    assert f"JIT compile while serving: {SAMPLE_MODULE}:add_kernel [" in caplog.text
    assert monitor.summary().startswith("kprecompile: 1 kernel compiled while serving (")


@pytest.mark.parametrize("load", [preload, start_preload], ids=["preload", "start_preload"])
def test_preload_without_a_warm_cache_says_so(tmp_path, load):
    """Also where the kernels would load in a thread: the caller hears it, not the thread."""
    layout = CacheLayout.of(tmp_path / "empty")
    with pytest.raises(NotWarmError, match="no manifest for deepseek-v2-lite on gfx942"):
        load(Request(MODEL, SERVING, select(MODEL, environ={})), layout, target=TARGETS["gfx942"])
    assert not [thread for thread in threading.enumerate() if thread.name == "kprecompile-preload"]


def test_kernels_already_in_memory_are_not_loaded_again(cache_copy):
    """A second preload in one process (a thread's after the engine's own first calls, or another
    configuration sharing kernels) finds each kernel in Triton's memory: none read from the cache.
    Control: the first preload loads every one."""
    cache_dir, kernels = cache_copy
    layout = activate(cache_dir)
    request = Request(MODEL, SERVING, select(MODEL, environ={}))
    first = start_preload(request, layout, target=TARGETS["gfx942"]).join()
    again = preload(request, layout, target=TARGETS["gfx942"])
    assert (first.loaded, first.in_memory) == (kernels, 0) and first.waited is not None
    assert (again.loaded, again.compiled, again.in_memory) == (0, 0, kernels) and again.failures == ()


def test_the_load_order_puts_what_the_engine_runs_while_loading_first(cache_copy):
    """vLLM's MLA layers run the FP8 BMM over every batch size while the weights are processed:
    those kernels load first, the rest in the plan's order, each kernel once."""
    cache_dir, _ = cache_copy
    # The plan's order reversed: the FP8 BMM's kernels last.
    jobs = list(baked_manifest(CacheLayout.of(cache_dir), TARGETS["gfx942"]).manifest.jobs)[::-1]
    assert {job.family for job in jobs} > {"fp8_bmm"} and jobs[0].family != "fp8_bmm"  # else nothing to show
    ordered = load_order(jobs + jobs[:3])
    families = [job.family for job in ordered]
    bmm = families.count("fp8_bmm")
    assert families[:bmm] == ["fp8_bmm"] * bmm and "fp8_bmm" not in families[bmm:]
    assert sorted(ordered, key=jobs.index) == jobs
    assert [job for job in ordered if job.family != "fp8_bmm"] == [job for job in jobs if job.family != "fp8_bmm"]


def test_a_background_preload_counts_its_own_threads_compiles_only():
    """Triton's listener is process-wide: the engine's compiles beside a background preload reach
    it too, and must not be counted as the preload's. Control: its own thread's are."""
    counter = _ListenerCounter(threading.get_ident())
    seen = []
    listen = counter.chained(lambda **event: seen.append(event["cache_hit"]))
    event = {"src": None, "metadata": None, "metadata_group": None, "times": None}
    other = threading.Thread(target=lambda: [listen(**event, cache_hit=hit) for hit in (True, False)])
    other.start()
    other.join()
    assert (counter.hits, counter.misses) == (0, 0) and seen == [True, False]
    listen(**event, cache_hit=True)
    listen(**event, cache_hit=False)
    assert (counter.hits, counter.misses) == (1, 1) and seen == [True, False, True, False]


def test_monitor_modes_are_checked(monkeypatch):
    monkeypatch.setenv("KPRECOMPILE_STRICT", "loud")
    with pytest.raises(ValueError, match="KPRECOMPILE_STRICT: got 'loud', expected one of off, warn, error"):
        JitMonitor()
    assert JitMonitor("off").summary() == "kprecompile: 0 kernels compiled while serving (0 loaded from the cache)"


RANK_SCRIPT = """
import json, sys
from kprecompile.serve.hook import prepare
from kprecompile.selection.engines import select
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
model = load_model("deepseek-v2-lite")
report = prepare(model, ServingParams(max_num_seqs=4), cache_dir=sys.argv[1], target=TARGETS["gfx942"],
                 selection=select(model, environ={}, families=["fp8_bmm"]), rank=int(sys.argv[2]),
                 local_world_size=int(sys.argv[3]), monitor=False)
# A fork server would outlive the warm by this serving process's whole life: the hook spawns.
from multiprocessing import forkserver
print(json.dumps({"compiled": report.warm.compiled if report.warm else 0, "kernels": report.preload.kernels,
                  "loaded": report.preload.loaded, "fork_server": forkserver._forkserver._forkserver_pid}))
"""


@pytest.mark.slow
@pytest.mark.compiles
def test_tensor_parallel_ranks_share_one_warm(tmp_path):
    """Two ranks call the hook at once: each kernel compiles once in all, every rank preloads all."""
    ranks = 2
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(tmp_path / "cache"), str(rank), str(ranks)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    results = [json.loads(process.communicate(timeout=600)[0].strip().splitlines()[-1]) for process in processes]
    kernels = results[0]["kernels"]
    assert sum(result["compiled"] for result in results) == kernels
    assert all(result["loaded"] == result["kernels"] == kernels for result in results)
    assert [result["fork_server"] for result in results] == [None] * ranks


def test_a_group_file_that_swaps_two_files_is_not_served(cache_copy):
    """The binary's name mapped to the IR (and back): each file matches its checksum, but Triton
    would read the wrong bytes. The serving process compiles that kernel again instead."""
    from test_verify import swap_children

    cache_dir, kernels = cache_copy
    swap_children(_binary_of_first_job(cache_dir).parent)
    result, _ = serving_process(cache_dir)
    assert result["preload"]["loaded"] == kernels - 1 and result["preload"]["compiled"] == 1
    again, _ = serving_process(cache_dir)
    assert again["preload"]["loaded"] == kernels and again["preload"]["compiled"] == 0


def test_the_served_check_refuses_a_name_mapped_to_another_file(cache_copy):
    """`ServedFiles.problem` checks which name maps to which file, not only the set of names."""
    from kprecompile.cache.entries import group_children
    from kprecompile.cache.served import ServedFiles

    cache_dir, _ = cache_copy
    layout = CacheLayout.of(cache_dir)
    manifest = baked_manifest(layout, TARGETS["gfx942"]).manifest
    entry = _binary_of_first_job(cache_dir).parent
    [group] = entry.glob("__grp__*.json")
    served = ServedFiles()
    served.record(manifest)
    files = group_children(entry, group.name)
    assert served.problem(entry.name, files, []) is None  # negative control: as written
    [binary] = [name for name in files if name.endswith(".hsaco")]
    [ir] = [name for name in files if name.endswith(".amdgcn")]
    swapped = {**files, binary: files[ir], ir: files[binary]}
    assert served.problem(entry.name, swapped, []) == "its group file maps a file name to another file"


def test_another_configurations_manifest_does_not_vouch_for_this_ones_entries(warm_copy):
    """The issue: any manifest in any root vouched for any entry, so a forged manifest (imported
    with --allow-unsigned) also covered kernels shared with other configurations. Once a process
    has its own configuration's manifest (`preload` hands it over), only that one vouches for its
    entries. Guard: `self._own.get(entry_name)` in `ServedFiles.problem`. Controls: without its own
    manifest the forged one would vouch (it is well-formed); the genuine bytes are served."""
    import dataclasses
    import hashlib

    from kprecompile.cache.entries import group_children, group_file
    from kprecompile.cache.manifest import manifest_key, write_manifest
    from kprecompile.cache.served import ServedFiles

    own = baked_manifest(warm_copy, TARGETS["gfx942"]).manifest
    binary = _binary_of_first_job(warm_copy.root)
    genuine = binary.read_bytes()
    forged = bytearray(genuine)
    forged[len(forged) // 2] ^= 0xFF
    binary.write_bytes(bytes(forged))
    job_key = own.jobs[0].key
    artifacts = {**own.artifacts, job_key: dict(own.artifacts[job_key])}
    artifacts[job_key][binary.name] = {"sha256": hashlib.sha256(forged).hexdigest(), "size": len(forged)}
    parts = {**own.parts, "model_digest": "f" * 64}  # another configuration
    write_manifest(warm_copy, dataclasses.replace(own, key=manifest_key(parts), parts=parts, artifacts=artifacts))
    entry = binary.parent
    files = group_children(entry, group_file(entry).name)
    served = ServedFiles()
    served.record(own)
    # An entry no manifest it has records (another configuration's kernel) makes it read them all.
    assert served.problem("A" * 52, {"x": str(entry / "x")}, [warm_copy.manifests_dir]) == "no manifest records it"
    assert served.problem(entry.name, files, [warm_copy.manifests_dir]) == (
        "its files' checksums are not the ones recorded"
    )
    assert ServedFiles().problem(entry.name, files, [warm_copy.manifests_dir]) is None
    binary.write_bytes(genuine)
    assert ServedFiles().problem(entry.name, files, [warm_copy.manifests_dir]) is None
    assert served.problem(entry.name, files, [warm_copy.manifests_dir]) is None


def test_a_gpu_is_hidden_by_its_own_vendors_variables_only(tmp_path, monkeypatch):
    """An empty HIP_VISIBLE_DEVICES hides no NVIDIA GPU (it took the local GPU for absent, and so
    built no launchers and ran vLLM's layer build where torch could hold the GPU); CUDA's variable
    hides both (HIP honors it). Control: without the driver's device node nothing is visible."""
    from kprecompile.inputs import targets

    nodes = {"cuda": tmp_path / "nvidiactl", "hip": tmp_path / "kfd"}
    for node in nodes.values():
        node.touch()
    monkeypatch.setattr(targets, "_DEVICE_NODES", {backend: str(node) for backend, node in nodes.items()})
    for variable in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(variable, raising=False)

    def visible() -> tuple[bool, bool]:
        return targets.gpu_may_be_visible("cuda"), targets.gpu_may_be_visible("hip")

    assert visible() == (True, True)
    for variable, expected in (
        ("HIP_VISIBLE_DEVICES", (True, False)),
        ("ROCR_VISIBLE_DEVICES", (True, False)),
        ("CUDA_VISIBLE_DEVICES", (False, False)),
    ):
        with monkeypatch.context() as hidden:
            hidden.setenv(variable, "")
            assert visible() == expected, variable
    nodes["cuda"].unlink()
    assert visible() == (False, True)
