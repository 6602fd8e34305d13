"""Tests that run inside a real vLLM release (PYTHONPATH=.vllm/<release>, scripts/install_vllm.py).

Every test here takes a `release` parameter and a `vllm_process` marker: the tests that share one
process there (vLLM binds its platform once per process, so a ROCm target's tests and an NVIDIA
target's do not share one; a fresh interpreter's tests have theirs alone).

- In the suite's own run (no vLLM), each test is collected once per release and stands for its
  twin inside that release (over the tested releases, some processes in the oldest and newest
  only: EVERY_RELEASE_PROCESSES). When the session's tests start, one pytest per release and process is
  started with the selected twins' node ids, one at a time beside the suite's own tests, two at a
  time once those are done; these tests run last, and each reports the outcome its twin had there,
  a failure with the assertion it failed on.
- Inside a release (KPRECOMPILE_VLLM_RELEASE names it), the tests run for that release alone and
  their outcomes are written to KPRECOMPILE_VLLM_REPORT. KPRECOMPILE_VLLM_SHARED is a directory
  every process of the release sees (what one process's tests leave for another's, see AFTER).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import CACHE_VARIABLES, UNSET_VARIABLES
from vllm_releases import NAMED_RELEASES, ROOT, SUPPORTED_RELEASES, release_path

from kprecompile.inputs.environment import VARIABLES

INSIDE = os.environ.get("KPRECOMPILE_VLLM_RELEASE")
# Processes that read what another process of the same release leaves in the shared directory:
# they run after it.
AFTER = {"kernels-nvidia": "kernels-rocm"}
# The suite's own run over the tested releases (none named): the processes that check the kernels
# each release launches (their keys against vLLM's launch paths, coverage, capture sizes, AITER's
# attention through the real builder and impl) and vLLM's selector against the mirror (the plugin's)
# run in every tested release, one per Triton series; the others (vLLM's model classes read layer
# by layer, the CLI, the NVIDIA plugin, several models side by side) in WHOLE_RELEASES, the oldest
# and newest. Every process in all four took the suite past CI's 90 minutes on 2 cores. Named
# releases (KPRECOMPILE_TEST_RELEASES, scripts/release_matrix.py) run every process: a matrix row
# is the whole suite.
EVERY_RELEASE_PROCESSES = frozenset(
    {"kernels-rocm", "kernels-nvidia", "capture-rocm", "capture-nvidia", "aiter-fa", "plugin"}
)
WHOLE_RELEASES = (SUPPORTED_RELEASES[0], SUPPORTED_RELEASES[-1])
# Inner runs at once: this machine's cores (each run is one busy process).
PARALLEL_RUNS = 2
RUN_TIMEOUT_SECONDS = 3600
UNSET = {*UNSET_VARIABLES, *(variable.name for variable in VARIABLES)}
# Triton's and its compilers' variables (AMDGCN_USE_BUFFER_OPS changes kernels): an inner run starts
# from a thread while the suite's own tests may have one monkeypatched; it never inherits them.
UNSET_PREFIXES = ("AMDGCN_", "TRITON_", "MLIR_", "LLVM_")


@pytest.fixture(autouse=True)
def release(request) -> str:
    """The vLLM release the test is about (inside, the installed one)."""
    if INSIDE and request.param != INSIDE:
        pytest.skip(f"a test for vLLM {request.param}, this is {INSIDE}")
    return request.param


def pytest_generate_tests(metafunc):
    """A `release` for each release the test runs in (`vllm_releases`, default all), unless the test
    parametrizes it with its other parameters itself."""
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0].split(",") if isinstance(marker.args[0], str) else marker.args[0]
        if "release" in (name.strip() for name in names):
            return
    marker = metafunc.definition.get_closest_marker("vllm_releases")
    wanted = marker.args if marker else SUPPORTED_RELEASES
    releases = [INSIDE] if INSIDE else SUPPORTED_RELEASES
    metafunc.parametrize("release", [version for version in releases if version in wanted])


def process_of(item) -> str:
    marker = item.get_closest_marker("vllm_process")
    assert marker is not None, f"{item.nodeid}: a test inside vLLM names its process (vllm_process marker)"
    return marker.args[0]


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The directory every process of this release sees."""
    return Path(os.environ["KPRECOMPILE_VLLM_SHARED"])


# --- Inside a release: the outcomes, for the suite's run -----------------------------------

_OUTCOMES: dict[str, dict] = {}


def pytest_runtest_logreport(report):
    if not INSIDE:
        return
    entry = _OUTCOMES.setdefault(report.nodeid, {"outcome": "passed", "when": "call", "longrepr": ""})
    if report.outcome != "passed" and entry["outcome"] == "passed":
        reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else report.longreprtext
        entry.update(outcome=report.outcome, when=report.when, longrepr=reason)


# --- The suite's run: one test per twin inside each release --------------------------------


@dataclass(frozen=True)
class InnerRun:
    returncode: int
    outcomes: dict[str, dict]
    output_tail: str


class InnerRuns:
    """The pytest runs inside the releases: started when the session's tests start, one at a time
    beside the suite's own tests and PARALLEL_RUNS at a time once those are done."""

    def __init__(self, config, wanted: dict[tuple[str, str], list[str]]):
        self.config = config
        self.wanted = wanted
        self.lock = threading.Lock()
        self.futures: dict[tuple[str, str], Future] | None = None
        self.slots = threading.Semaphore(1)
        self.widened = False
        self.running: set[subprocess.Popen] = set()
        self.stopped = False

    def start(self) -> None:
        with self.lock:
            if self.futures is None:
                self.futures = self._start()

    def result(self, release: str, process: str) -> InnerRun:
        self.start()
        with self.lock:
            if not self.widened:
                # The suite's own tests are done (these tests run last): every slot for the runs.
                for _ in range(PARALLEL_RUNS - 1):
                    self.slots.release()
                self.widened = True
        return self.futures[release, process].result()

    def stop(self) -> None:
        """At the session's end: what still runs (the session was cut short) is ended."""
        with self.lock:
            self.stopped = True
            for process in self.running:
                process.kill()
        # Runs that wait for a slot go on to find the session ended.
        for _ in self.wanted:
            self.slots.release()

    def _start(self) -> dict[tuple[str, str], Future]:
        # The session's temporary directory, made here before any run thread asks for it: made
        # lazily by two threads at once, it was two directories, and a run read another's files.
        self.basetemp = self.config._tmp_path_factory.getbasetemp()
        futures = {key: Future() for key in self.wanted}
        # A process that others read after runs first in their chain; the longest chains start first.
        first = {(release, AFTER[process]) for release, process in self.wanted if process in AFTER}
        chains = []
        for key in self.wanted:
            release, process = key
            if key not in first:
                chains.append([(release, AFTER[process]), key] if process in AFTER else [key])
        chains.sort(key=len, reverse=True)
        pool = ThreadPoolExecutor(max_workers=PARALLEL_RUNS, thread_name_prefix="in-vllm")
        for chain in chains:
            pool.submit(self._run_chain, chain, futures)
        pool.shutdown(wait=False)
        return futures

    def _run_chain(self, chain, futures) -> None:
        for key in chain:
            try:
                with self.slots:
                    futures[key].set_result(self._run(*key))
            except BaseException as error:  # a skip (release not installable) included
                futures[key].set_exception(error)

    def _run(self, release: str, process: str) -> InnerRun:
        path = release_path(release)
        # The session's temporary directory (pytest's own factory: kept and cleaned as it is).
        base = self.basetemp / f"vllm-{release}"
        work = base / process
        work.mkdir(parents=True, exist_ok=True)
        (base / "shared").mkdir(exist_ok=True)
        report = work / "outcomes.json"
        # The suite's isolation, whether or not a test outside set it up yet: caches and HOME
        # under the run's directory, the engine's flags unset.
        home = base / "home"
        environment = {
            **{
                name: value
                for name, value in os.environ.items()
                if name not in UNSET and not name.startswith(UNSET_PREFIXES)
            },
            **{name: str((home / relative).resolve()) for name, relative in CACHE_VARIABLES.items()},
            "PYTHONPATH": str(path),
            "CUDA_VISIBLE_DEVICES": "",
            "KPRECOMPILE_VLLM_RELEASE": release,
            "KPRECOMPILE_VLLM_REPORT": str(report),
            "KPRECOMPILE_VLLM_SHARED": str(base / "shared"),
        }
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "--durations=10",
            f"--basetemp={work / 'tmp'}",
            *self.wanted[release, process],
        ]
        with open(work / "output.txt", "w+") as output:
            with self.lock:
                if self.stopped:
                    raise RuntimeError("the session ended before this run started")
                running = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=output, stderr=subprocess.STDOUT)
                self.running.add(running)
            try:
                returncode = running.wait(timeout=RUN_TIMEOUT_SECONDS)
            finally:
                running.kill()
                with self.lock:
                    self.running.discard(running)
            output.seek(0)
            tail = output.read()[-6000:]
        outcomes = json.loads(report.read_text()) if report.exists() else {}
        return InnerRun(returncode, outcomes, tail)


_RUNS = pytest.StashKey[InnerRuns]()


class InsideVllm(pytest.Item):
    """A test of this directory as it ran inside one vLLM release (its twin there)."""

    def __init__(self, *, twin, **kwargs):
        super().__init__(**kwargs)
        self.own_markers = list(twin.own_markers)
        self.keywords.update(twin.keywords)
        self.release = twin.callspec.params["release"]
        self.process = process_of(twin)
        self.twin_location = twin.reportinfo()
        # The wait is for the run of every selected test of the release and process, bounded by
        # RUN_TIMEOUT_SECONDS; each test inside has the suite's own timeout.
        self.add_marker(pytest.mark.timeout(0))

    def runtest(self):
        run = self.config.stash[_RUNS].result(self.release, self.process)
        where = f"inside vLLM {self.release} (its {self.process} process)"
        outcome = run.outcomes.get(self.nodeid)
        if outcome is None:
            pytest.fail(
                f"{self.nodeid} did not run {where}: pytest exited {run.returncode}\n{run.output_tail}", pytrace=False
            )
        if outcome["outcome"] == "skipped":
            pytest.skip(f"{where}: {outcome['longrepr']}")
        if outcome["outcome"] == "failed":
            pytest.fail(f"failed {where}, at {outcome['when']}:\n{outcome['longrepr']}", pytrace=False)

    def reportinfo(self):
        return self.twin_location


def _is_twin(item) -> bool:
    return isinstance(item, pytest.Function) and item.path.is_relative_to(Path(__file__).parent)


def _in_the_suites_run(item) -> bool:
    """Whether the suite's run over the tested releases runs this twin (EVERY_RELEASE_PROCESSES)."""
    return process_of(item) in EVERY_RELEASE_PROCESSES or item.callspec.params["release"] in WHOLE_RELEASES


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(session, config, items):
    """Outside vLLM: each selected test here becomes its twin's outcome inside its release."""
    if INSIDE:
        return (yield)
    if not NAMED_RELEASES:
        outside = [item for item in items if _is_twin(item) and not _in_the_suites_run(item)]
        if outside:
            config.hook.pytest_deselected(items=outside)
            left_out = set(outside)
            items[:] = [item for item in items if item not in left_out]
    # Before selection: every test of each process (one that another reads after runs whole).
    every: dict[tuple[str, str], list[str]] = {}
    for item in filter(_is_twin, items):
        every.setdefault((item.callspec.params["release"], process_of(item)), []).append(item.nodeid)
    result = yield
    wanted: dict[tuple[str, str], list[str]] = {}
    for index, item in enumerate(items):
        if _is_twin(item):
            items[index] = InsideVllm.from_parent(item.parent, name=item.name, twin=item)
            wanted.setdefault((items[index].release, items[index].process), []).append(item.nodeid)
    for release, process in list(wanted):
        if process in AFTER:
            wanted.setdefault((release, AFTER[process]), every[release, AFTER[process]])
    # Last: the runs inside the releases go on beside the suite's own tests until these wait for them.
    items.sort(key=lambda item: isinstance(item, InsideVllm))
    config.stash[_RUNS] = InnerRuns(config, wanted)
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    if not INSIDE and not session.config.option.collectonly and session.config.stash.get(_RUNS, None):
        if session.config.stash[_RUNS].wanted:
            session.config.stash[_RUNS].start()


def pytest_sessionfinish(session):
    if INSIDE:
        if os.environ.get("KPRECOMPILE_VLLM_REPORT"):
            Path(os.environ["KPRECOMPILE_VLLM_REPORT"]).write_text(json.dumps(_OUTCOMES))
    elif session.config.stash.get(_RUNS, None):
        session.config.stash[_RUNS].stop()
