import logging
import multiprocessing
import os
import signal
import time

import pytest
from helpers import SAMPLE_MODULE, sample_call

from kprecompile.cache.locks import LOCK_TIMEOUT_VARIABLE, hold_lock, lock_timeout_seconds
from kprecompile.compile import compile_job
from kprecompile.errors import InputError, LockTimeoutError
from kprecompile.trace import trace_calls

SPAWN = multiprocessing.get_context("spawn")


def _hold(path, ready, seconds):
    with hold_lock(path, "test"):
        ready.set()
        time.sleep(seconds)


def _start_holder(path, seconds=60.0):
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=_hold, args=(path, ready, seconds))
    holder.start()
    assert ready.wait(60), "the holder never took the lock"
    return holder


def test_waiting_is_logged_and_times_out_naming_the_variable(tmp_path, caplog):
    path = tmp_path / "job.lock"
    holder = _start_holder(path)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(LockTimeoutError, match=LOCK_TIMEOUT_VARIABLE) as raised:
            with hold_lock(path, "kernel X on gfx942", timeout_seconds=0.5):
                pass
    finally:
        holder.kill()
        holder.join()
    assert f"Waiting to acquire lock for kernel X on gfx942 at {path}" in caplog.text
    assert raised.value.path == str(path)


def test_a_lock_of_a_killed_holder_is_free_at_once(tmp_path):
    path = tmp_path / "job.lock"
    holder = _start_holder(path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()

    started = time.monotonic()
    with hold_lock(path, "test", timeout_seconds=5):
        pass
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("raw", ["abc", "0", "-3"])
def test_a_malformed_lock_timeout_is_an_input_error(monkeypatch, raw):
    monkeypatch.setenv(LOCK_TIMEOUT_VARIABLE, raw)
    with pytest.raises(
        InputError, match=f"{LOCK_TIMEOUT_VARIABLE}: got '{raw}', expected a positive number of seconds"
    ):
        lock_timeout_seconds()


def _compile_in_child(job, layout, queue):
    queue.put("started")
    queue.put(compile_job(job, layout).status)


def test_processes_waiting_on_one_job_compile_it_once(cache_layout, sm90):
    [job] = trace_calls([sample_call("launch_add", 1000, 128)], sm90, "sample", (SAMPLE_MODULE,)).jobs
    queue = SPAWN.Queue()
    children = [SPAWN.Process(target=_compile_in_child, args=(job, cache_layout, queue)) for _ in range(3)]
    # Hold the job's lock until every child is past its first check and waiting for it.
    with hold_lock(cache_layout.lock_path(job.key), "test"):
        for child in children:
            child.start()
        assert [queue.get(timeout=300) for _ in children] == ["started"] * 3
        time.sleep(1.0)
    statuses = sorted(queue.get(timeout=300) for _ in children)
    for child in children:
        child.join()
    assert statuses == ["cached", "cached", "compiled"]
