"""Cache locks across real processes: waiting says so, times out naming the variable, a dead
holder's lock is free at once, a holder deletes its lock file as it lets go without two processes
ever holding one lock, and processes queued on one kernel compile it once."""

import logging
import logging.handlers
import multiprocessing
import os
import signal

import pytest
from helpers import SAMPLE_MODULE, sample_call

from kprecompile.cache import locks
from kprecompile.cache.locks import hold_lock, remove_if_free, try_lock
from kprecompile.cache.staging import is_held
from kprecompile.errors import InputError, LockTimeoutError
from kprecompile.inputs import settings
from kprecompile.tracing.trace import trace_calls
from kprecompile.warmup.compile import compile_job, job_lock

SPAWN = multiprocessing.get_context("spawn")
VARIABLE = settings.LOCK_TIMEOUT.name


def _hold(path, ready, release):
    with hold_lock(path, "test", 60, VARIABLE):
        ready.set()
        release.wait(120)


def _start_holder(path):
    ready, release = SPAWN.Event(), SPAWN.Event()
    holder = SPAWN.Process(target=_hold, args=(path, ready, release))
    holder.start()
    assert ready.wait(60), "the holder never took the lock"
    return holder, release


def test_waiting_is_logged_and_times_out_naming_the_variable(tmp_path, caplog):
    path = tmp_path / "job.lock"
    holder, release = _start_holder(path)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(LockTimeoutError, match=VARIABLE) as raised:
            with hold_lock(path, "kernel X on gfx942", 0.5, VARIABLE):
                pass
    finally:
        release.set()
        holder.join()
    assert f"Waiting to acquire lock for kernel X on gfx942 at {path}" in caplog.text
    assert raised.value.path == str(path)
    # The advice fits OS locks: a live process holds it; nothing says to delete the lock file.
    assert "stop that process" in str(raised.value) and "remove" not in str(raised.value)


def test_a_lock_of_a_killed_holder_is_free_at_once(tmp_path, caplog):
    path = tmp_path / "job.lock"
    holder, _ = _start_holder(path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()

    with caplog.at_level(logging.WARNING), hold_lock(path, "test", 60, VARIABLE):
        pass
    # Taken on the first try: nobody waited.
    assert "Waiting to acquire" not in caplog.text


def test_a_holder_deletes_its_lock_file_and_a_killed_one_leaves_it_for_prune(tmp_path):
    path = tmp_path / "job.lock"
    with hold_lock(path, "test", 60, VARIABLE):
        assert path.exists()
    assert not path.exists()
    holder, _ = _start_holder(path)
    assert not remove_if_free(path) and path.exists()  # the control: a held lock stays
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    assert path.exists() and remove_if_free(path) and not path.exists()


@pytest.mark.parametrize("check", [True, False], ids=["checked", "control-unchecked"])
def test_a_taker_that_opened_the_file_its_holder_deleted_takes_the_new_one(tmp_path, monkeypatch, check):
    """The race deleting lock files opens: a taker opens the file, the holder deletes it and lets go,
    the taker's lock then succeeds on a file no one else will open. Played in that order here (the
    holder lets go right after the taker's open); the control, without the check, ends up holding
    the deleted file while the path is free for anyone."""
    path = tmp_path / "job.lock"
    holder, release = _start_holder(path)
    real_open = os.open
    opened = []

    def open_then_let_the_holder_go(*args, **kwargs):
        descriptor = real_open(*args, **kwargs)
        if not opened:
            opened.append(descriptor)
            release.set()
            holder.join()
        return descriptor

    monkeypatch.setattr(locks.os, "open", open_then_let_the_holder_go)
    if not check:
        monkeypatch.setattr(locks, "_names", lambda path, descriptor: True)
    descriptor = try_lock(path)
    monkeypatch.undo()
    assert descriptor is not None and opened
    try:
        if check:
            assert os.fstat(descriptor).st_ino == os.stat(path).st_ino and is_held(path)
        else:
            assert not path.exists() and not is_held(path)
    finally:
        os.close(descriptor)


def _count_under_the_lock(path, counter, rounds):
    for _ in range(rounds):
        with hold_lock(path, "test", 60, VARIABLE):
            counter.write_text(str(int(counter.read_text()) + 1))


def test_processes_taking_and_deleting_one_lock_never_hold_it_together(tmp_path):
    path, counter = tmp_path / "job.lock", tmp_path / "count"
    counter.write_text("0")
    workers = [SPAWN.Process(target=_count_under_the_lock, args=(path, counter, 200)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [worker.exitcode for worker in workers] == [0] * 4
    assert counter.read_text() == "800" and not path.exists()


@pytest.mark.parametrize("raw", ["abc", "0", "-3"])
def test_a_malformed_lock_timeout_is_an_input_error(monkeypatch, raw):
    monkeypatch.setenv(VARIABLE, raw)
    with pytest.raises(InputError, match=f"{VARIABLE}: got '{raw}', expected a positive number of seconds"):
        settings.LOCK_TIMEOUT.read()


def _compile_in_child(job, layout, messages):
    """Compile `job`, forwarding this process's log records to the parent."""
    root = logging.getLogger()
    root.addHandler(logging.handlers.QueueHandler(messages))
    root.setLevel(logging.WARNING)
    messages.put(("status", compile_job(job, layout).status))


@pytest.mark.compiles
def test_processes_waiting_on_one_job_compile_it_once(cache_layout, sm90):
    [job] = trace_calls([sample_call("launch_add", 1000, 128)], sm90, "sample", (SAMPLE_MODULE,)).jobs
    messages = SPAWN.Queue()
    children = [SPAWN.Process(target=_compile_in_child, args=(job, cache_layout, messages)) for _ in range(3)]
    statuses = []
    # Hold the job's lock until every child has said it is waiting for it.
    with job_lock(cache_layout, job):
        for child in children:
            child.start()
        waiting = 0
        while waiting < len(children):
            message = messages.get(timeout=300)
            assert not isinstance(message, tuple), f"a child finished while the lock was held: {message}"
            waiting += message.getMessage().startswith("Waiting to acquire lock for add_kernel on sm90")
    while len(statuses) < len(children):
        message = messages.get(timeout=300)
        if isinstance(message, tuple):
            statuses.append(message[1])
    for child in children:
        child.join()
    assert sorted(statuses) == ["cached", "cached", "compiled"]
