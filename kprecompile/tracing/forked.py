"""A family's trace split over forked processes, once this process has imported what it needs.

A vLLM family's trace is hundreds of engine steps through vLLM's own builders and impls (684 for
Llama-3.1-8B under ROCM_AITER_FA), each a few milliseconds of Python, after seconds of importing
torch, Triton and vLLM. Forked after the first step, each process inherits those imports and
the capture as it stands, runs its share of the remaining steps, and sends back what it
captured; nothing is imported twice. The steps are independent (each builds its own inputs),
so the union is what one process finds, in the same order (`Capture.jobs` orders by step).

Forking is left out where it is not safe or not worth it: another thread is running (a fork
copies only the calling thread, and what the others hold stays held: a compile pool's threads
beside `warm`'s trace), the platform has no `fork`, or there are too few steps. A process that
fails hands its steps back: this process runs them again, so a failure surfaces with its real
cause, as in a trace that never forked.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Hashable, Sequence

from ..inputs import settings

# Below this many steps per process, forking costs more than it saves.
MIN_STEPS_PER_PROCESS = 32


def processes_for(steps: int) -> int:
    """How many processes `steps` steps are split over here (1: not split)."""
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    return max(1, min(settings.TRACE_WORKERS.read(), steps // MIN_STEPS_PER_PROCESS))


def run_split(
    steps: Sequence[int],
    processes: int,
    run: Callable[[Sequence[int]], None],
    captured_since: Callable[[Sequence[int]], list],
    groups: Sequence[Hashable] | None = None,
) -> list:
    """Run `steps` over `processes` processes: this one runs the first share with `run`, each
    forked one another share, returning `captured_since(its share)`. Returns what the forked
    ones captured; shares whose process failed are run here again. `groups[step]` is the step's
    group (see `shares_of`)."""
    shares = [share for share in shares_of(steps, processes, groups) if share]  # fewer groups than processes
    children: list[tuple[int, int]] = []
    try:
        for share in shares[1:]:
            children.append(_fork(share, run, captured_since))
    except OSError:  # no more processes (memory, a limit): the shares left run here
        pass
    forked = shares[1 : 1 + len(children)]
    try:
        for share in [shares[0], *shares[1 + len(children) :]]:
            run(share)
    finally:  # each forked process is waited for, whatever this one's shares did
        results = [_collected(pid, read) for pid, read in children]
    found = []
    for share, result in zip(forked, results, strict=True):
        if result is None:
            run(share)  # its error, with its cause, as a trace in one process raises it
        else:
            found.extend(result)
    return found


def shares_of(steps: Sequence[int], processes: int, groups: Sequence[Hashable] | None = None) -> list[list[int]]:
    """`steps` dealt over `processes` shares, each in order: step by step in turn (neighbours
    cost alike, so the shares do), or, with `groups`, group by group in the order each group
    first comes, so that a group's steps share in one process what they build once."""
    shares: list[list[int]] = [[] for _ in range(processes)]
    share_of: dict[Hashable, int] = {}
    for position, step in enumerate(steps):
        if groups is None:
            shares[position % processes].append(step)
        else:
            shares[share_of.setdefault(groups[step], len(share_of) % processes)].append(step)
    return shares


def _collected(pid: int, read: int) -> list | None:
    """What a forked process sent, once it has exited; None where it failed."""
    with os.fdopen(read, "rb") as stream:
        payload = stream.read()
    _, status = os.waitpid(pid, 0)
    if status != 0:
        return None
    try:
        return pickle.loads(payload)
    except Exception:
        return None


def _fork(share: list[int], run, captured_since) -> tuple[int, int]:
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        raise
    if pid:
        os.close(write)
        return pid, read
    # The child: no unwinding into the parent's context managers, no atexit, no buffered output.
    status = 1
    try:
        os.close(read)
        _one_thread_for_torch()
        run(share)
        payload = pickle.dumps(captured_since(share))
        with os.fdopen(write, "wb") as stream:
            stream.write(payload)
        status = 0
    finally:
        os._exit(status)


def _one_thread_for_torch() -> None:
    """torch's OpenMP pool, if the parent started one, is not there after a fork: run its CPU
    operators on this thread alone."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
