import sys
import time

import pytest
from helpers import SAMPLE_MODULE, sample_call

from kprecompile.cache.entries import is_compiled
from kprecompile.cache.layout import CacheLayout
from kprecompile.errors import InputError
from kprecompile.inputs import settings
from kprecompile.tracing.trace import trace_calls
from kprecompile.warmup.pool import CompilePool, compile_jobs
from kprecompile.warmup.worker_start import worker_context

pytestmark = pytest.mark.compiles


def test_failing_and_crashing_jobs_are_reported_and_the_rest_compile(cache_layout, sm90):
    from sample_kernels import SEGFAULT, STATIC_ASSERT

    calls = [sample_call("launch_fault", code) for code in (1, SEGFAULT, 2, STATIC_ASSERT, 3)]
    jobs = trace_calls(calls, sm90, "sample", (SAMPLE_MODULE,)).jobs
    assert len(jobs) == 5

    outcomes = {
        outcome.job.describe_specialization().split(",")[0]: outcome
        for outcome in compile_jobs(jobs, cache_layout, max_workers=2)
    }

    assert {name: outcome.status for name, outcome in outcomes.items()} == {
        "CODE=1": "compiled",
        f"CODE={SEGFAULT}": "failed",
        "CODE=2": "compiled",
        f"CODE={STATIC_ASSERT}": "failed",
        "CODE=3": "compiled",
    }
    assert outcomes[f"CODE={SEGFAULT}"].error == "worker died: killed by SIGSEGV"
    assert "code 15 never compiles" in outcomes[f"CODE={STATIC_ASSERT}"].error
    for outcome in outcomes.values():
        assert is_compiled(cache_layout, outcome.job.key) == (outcome.status == "compiled")


@pytest.mark.slow
def test_a_job_past_its_timeout_fails_alone(cache_layout, sm90):
    from sample_kernels import HANG

    jobs = trace_calls([sample_call("launch_fault", code) for code in (HANG, 4)], sm90, "sample", (SAMPLE_MODULE,)).jobs

    # Workers import the kernels' module before their first job, as warm has them import the
    # library's: the timeout then measures compiling alone (about a second for the good kernel;
    # the margin is for a loaded 2-core machine, where 2 s once failed it).
    with CompilePool(cache_layout, max_workers=2, job_timeout_seconds=8, preload_modules=(SAMPLE_MODULE,)) as pool:
        outcomes = pool.compile(jobs)

    assert [outcome.status for outcome in outcomes] == ["failed", "compiled"]
    assert outcomes[0].error == "timed out after 8 s"


STDIN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from helpers import SAMPLE_MODULE, sample_call
from kprecompile.warmup import pool
from kprecompile.cache.layout import CacheLayout
from kprecompile.inputs.targets import TARGETS
from kprecompile.tracing.trace import trace_calls

pool.WORKER_START_TIMEOUT_SECONDS = 10
jobs = trace_calls([sample_call("launch_add", 100, 32)], TARGETS["sm90"], "sample", (SAMPLE_MODULE,)).jobs
for workers in (1, 2):
    [outcome] = pool.compile_jobs(jobs, CacheLayout.of({cache!r}), max_workers=workers)
    print(workers, outcome.status, outcome.error)
# Jobs handed over as a warm traces them, while and after the workers fail to start.
import time
with pool.CompilePool(CacheLayout.of({cache!r}), max_workers=2) as streaming:
    streaming.submit(jobs)
    time.sleep(5)
    more = trace_calls([sample_call("launch_add", 100, 64)], TARGETS["sm90"], "sample", (SAMPLE_MODULE,)).jobs
    streaming.submit(more)
    for outcome in streaming.compile([*jobs, *more]):
        print("streamed", outcome.status, outcome.error)
"""


def test_workers_that_cannot_start_fail_the_jobs_instead_of_hanging(tmp_path):
    # A main module read from stdin cannot be re-imported by spawned workers: they die at start.
    import subprocess
    import sys
    from pathlib import Path

    script = STDIN_SCRIPT.format(tests=str(Path(__file__).parent), cache=str(tmp_path))
    result = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=300)
    lines = result.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["1", "2", "streamed", "streamed"], result.stderr[-2000:]
    for line in lines:
        assert line.split(maxsplit=1)[1].startswith("failed compile workers could not start ("), line
        assert line.endswith("); their own error is on stderr")


def test_workers_take_the_environment_the_pool_starts_with(tmp_path, monkeypatch, sm90):
    """Workers fork from a server that started with an earlier environment: a setting changed
    since applies all the same (here one malformed on purpose, which the worker's job reports)."""
    monkeypatch.setenv(settings.WORKER_START.name, "forkserver")
    jobs = trace_calls([sample_call("launch_add", 100, 32)], sm90, "sample", (SAMPLE_MODULE,)).jobs
    [first] = compile_jobs(jobs, CacheLayout.of(tmp_path / "first"), max_workers=1)
    assert first.status == "compiled"
    monkeypatch.setenv(settings.LOCK_TIMEOUT.name, "abc")
    [second] = compile_jobs(jobs, CacheLayout.of(tmp_path / "second"), max_workers=1)
    assert second.status == "failed" and f"{settings.LOCK_TIMEOUT.name}: got 'abc'" in second.error


def test_workers_fork_from_the_server_where_asked_unless_the_path_changed(monkeypatch):
    monkeypatch.delenv(settings.WORKER_START.name, raising=False)
    assert worker_context().get_start_method() == "forkserver"  # the default
    monkeypatch.setenv(settings.WORKER_START.name, "spawn")
    assert worker_context().get_start_method() == "spawn"
    monkeypatch.setenv(settings.WORKER_START.name, "forkserver")
    assert worker_context().get_start_method() == "forkserver"
    # A caller's own choice wins (a serving process's `prepare` spawns).
    assert worker_context("spawn").get_start_method() == "spawn"
    monkeypatch.setattr(sys, "path", [*sys.path, "/elsewhere"])
    assert worker_context().get_start_method() == "spawn"  # the server would import other modules
    monkeypatch.undo()
    monkeypatch.setenv(settings.WORKER_START.name, "forkserver")
    assert worker_context().get_start_method() == "forkserver"
    monkeypatch.setenv(settings.WORKER_START.name, "fork")
    with pytest.raises(InputError, match="KPRECOMPILE_WORKER_START: got 'fork', expected one of forkserver, spawn"):
        worker_context()


def test_jobs_handed_over_while_the_workers_start_are_collected_not_compiled_again(cache_layout, sm90):
    """A warm hands each family's jobs to the workers as it traces (`submit`), some before the
    workers exist; `compile` then collects those from the workers (they say "compiled" even once
    they are in the cache) and checks the rest here."""
    calls = [sample_call("launch_add", 100, block) for block in (16, 32, 64, 128)]
    jobs = trace_calls(calls, sm90, "sample", (SAMPLE_MODULE,)).jobs
    assert len(jobs) == 4
    with CompilePool(cache_layout, max_workers=2, preload_modules=(SAMPLE_MODULE,)) as pool:
        pool.start()
        pool.submit(jobs[:2])  # the workers are still starting: held, then scheduled
        pool.submit(jobs[1:3])  # one of them again: handed over once
        deadline = time.monotonic() + 300
        while not all(is_compiled(cache_layout, job.key) for job in jobs[:3]) and time.monotonic() < deadline:
            time.sleep(0.2)
        outcomes = pool.compile(jobs)
    assert [outcome.status for outcome in outcomes] == ["compiled"] * 4
    # The control: a new pool finds all four in the cache, in this process.
    with CompilePool(cache_layout, max_workers=2) as pool:
        assert [outcome.status for outcome in pool.compile(jobs)] == ["cached"] * 4
        assert not pool.started


def test_jobs_taken_back_while_the_workers_start_never_compile(cache_layout, sm90):
    """A warm takes back what a family handed over before its trace failed: held while the workers
    start, those jobs are never scheduled; the rest compile."""
    calls = [sample_call("launch_add", 100, block) for block in (16, 32, 64, 128)]
    jobs = trace_calls(calls, sm90, "sample", (SAMPLE_MODULE,)).jobs
    with CompilePool(cache_layout, max_workers=2, preload_modules=(SAMPLE_MODULE,)) as pool:
        pool.start()
        pool.submit(jobs)
        pool.cancel([job.key for job in jobs[2:]])
        outcomes = pool.compile(jobs[:2])
        # The workers are idle now: a job still handed over would compile within these seconds.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not any(is_compiled(cache_layout, job.key) for job in jobs[2:]):
            time.sleep(0.2)
    assert [outcome.status for outcome in outcomes] == ["compiled"] * 2
    assert [is_compiled(cache_layout, job.key) for job in jobs] == [True, True, False, False]


def test_a_plan_hands_jobs_over_while_each_family_traces(gfx942):
    """A warm's workers compile a family's first kernels while its later steps trace: jobs come
    from inside the trace (a capture active), each step's, and once more with each family's end;
    every key the plan holds is handed over, in the plan's order."""
    from kprecompile.inputs.models import load_model
    from kprecompile.inputs.serving import ServingParams
    from kprecompile.selection.engines import select
    from kprecompile.selection.request import Request
    from kprecompile.tracing.trace import active_capture
    from kprecompile.warmup.planning import plan

    model = load_model("deepseek-v2-lite")
    request = Request(model, ServingParams(max_num_seqs=3), select(model), (gfx942,))
    handed: list[tuple[bool, tuple]] = []
    streamed = plan(request, on_jobs=lambda jobs: handed.append((active_capture() is not None, jobs)))
    whole = plan(request)
    during = [jobs for tracing, jobs in handed if tracing]
    # The control: what a family hands over at its end comes outside its trace.
    assert during and len(during) < len(handed)
    traced_families = sum(family.kernels > 0 for family in streamed.families)
    assert traced_families >= 2 and len(during) > traced_families
    firsts = list({job.key: job for _, jobs in handed for job in jobs}.values())
    assert list(streamed.jobs) == list(whole.jobs)
    assert len(firsts) == len(whole.jobs) and {job.key for job in firsts} == {job.key for job in whole.jobs}


def test_workers_take_the_parents_triton_key_instead_of_hashing_libtriton(cache_layout, monkeypatch, sm90):
    """Each worker hashed libtriton for Triton's key (0.35 s of CPU per worker, beside the trace):
    the pool hands them the parent's. Shown by handing a wrong one: the job then compiles under
    another key, which the worker reports; the control, the pool as it is, compiles it."""
    from kprecompile.inputs.toolchain import triton_dir
    from kprecompile.warmup import pool

    jobs = trace_calls([sample_call("launch_add", 100, 32)], sm90, "sample", (SAMPLE_MODULE,)).jobs
    with monkeypatch.context() as patch:
        patch.setattr(pool, "_triton_key_for_workers", lambda layout: (str(triton_dir()), "not Triton's key"))
        [handed] = compile_jobs(jobs, CacheLayout.of(cache_layout.root / "wrong"), max_workers=1)
    assert handed.status == "failed" and "compiled under Triton key" in handed.error
    [control] = compile_jobs(jobs, cache_layout, max_workers=1)
    assert control.status == "compiled" and is_compiled(cache_layout, jobs[0].key)


def test_a_worker_whose_triton_is_not_the_parents_computes_its_own_key(cache_layout, monkeypatch, sm90):
    """The parent's key is taken only by a worker importing the parent's Triton: one whose path
    leads elsewhere would file its compiles under the parent's key. Here a key said to be of
    another Triton's directory, and wrong: the worker computes its own and the job compiles."""
    from kprecompile.warmup import pool

    jobs = trace_calls([sample_call("launch_add", 100, 32)], sm90, "sample", (SAMPLE_MODULE,)).jobs
    monkeypatch.setattr(pool, "_triton_key_for_workers", lambda layout: ("/another/triton", "not Triton's key"))
    [outcome] = compile_jobs(jobs, cache_layout, max_workers=1)
    assert outcome.status == "compiled" and is_compiled(cache_layout, jobs[0].key)
