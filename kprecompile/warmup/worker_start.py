"""How compile workers start: forked from one server process that imported torch, Triton and
kprecompile's compile path once (the default), or spawned, each importing them itself
(KPRECOMPILE_WORKER_START=spawn, and wherever Python has no fork server).

A spawned worker pays about 2.5 s of CPU in imports before its first job (docs/design.md, fact
8); sixteen of them pay it sixteen times, beside the parent's tracing. Python's `forkserver`
start method pays it once: the server imports `worker_preload` and forks each worker from
itself. The server never touches a GPU, so what it imported survives the fork (what does not
survive fork is a process that initialized CUDA). Each forked worker still re-imports the
caller's script, as a spawned one does (multiprocessing prepares every child alike), so a
script's `__main__` guard is needed either way.

The server lives as long as this process and keeps the `sys.path` it started with: a process
whose path changed since (another engine release put first, `engine install`'s `use_engine`)
spawns its workers instead, so that they import what the parent would. Each worker takes the
parent's environment as it is when the pool starts (`pool._prepare_worker`). The pool creates
its workers from a thread of its own, so the parent traces while the server imports.
Measured (BENCHMARKS.md), DeepSeek-R1 TP8 cold on the 16-core H200 host, best of three: 13.7 s
forked against 15.1 s spawned (17.3 s spawned before the pool started beside the trace); on the
2-core builder forked workers saved 1.17x. Before the pool started its workers beside the trace,
forking was 3 to 5 s slower on 16 cores: the parent waited for the server's imports instead of
tracing.
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
from multiprocessing.context import BaseContext

from ..inputs import settings
from ..inputs.settings import WorkerStart

logger = logging.getLogger(__name__)

PRELOAD = "kprecompile.warmup.worker_preload"
# The `sys.path` the fork server started with, once this process started it.
_server_path: tuple[str, ...] | None = None


def worker_context(method: WorkerStart | None = None) -> BaseContext:
    """The start method of this pool's workers: `method`, else KPRECOMPILE_WORKER_START's; the
    fork server only where Python has one and it imports what this process would."""
    global _server_path
    method = method or settings.WORKER_START.read()
    if method == "spawn" or "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    path = tuple(sys.path)
    context = multiprocessing.get_context("forkserver")
    if _server_path is None:
        context.set_forkserver_preload([PRELOAD])
        _server_path = path
    elif _server_path != path:
        logger.info("compile workers are spawned: this process's sys.path changed since its fork server started")
        return multiprocessing.get_context("spawn")
    return context
