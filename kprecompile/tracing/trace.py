"""Capture the exact kernel specializations a library's real calls would compile.

The calls run on meta tensors while the cross-compile driver reports the target and Triton's
`jit_cache_hook` intercepts every launch that would compile: the hook records Triton's own
specialization data and returns True, so nothing compiles and nothing launches. Because
Triton's binder computes the specialization, it is the one a real launch computes
(docs/design.md, fact 2). Each unique specialization becomes a `CompileJob` keyed by the hash
Triton's cache uses for it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib
import json
import logging
import os
import sys
import time
import types
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..cache.jobs import CompileJob
from ..errors import TracingError
from ..inputs.targets import Target
from ..platforms.triton_driver import active_target, device_model
from .libraries import aiter_wrappers_as_python, operators_keep_first_definition

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceResult:
    family: str
    target: str
    calls: int
    jobs: tuple[CompileJob, ...]
    seconds: float
    # How many processes the steps were split over (`forked.py`).
    processes: int = 1


Call = tuple[str, Callable[[], object]]


def trace_calls(
    calls: Iterable[Call],
    target: Target,
    family: str,
    fresh_modules: tuple[str, ...] = (),
    triton_key: str | None = None,
    on_jobs: Callable[[tuple[CompileJob, ...]], None] | None = None,
    groups: Sequence[Hashable] | None = None,
) -> TraceResult:
    """Run `calls` (label, function) under `target` and collect the kernels they would compile.

    Modules whose names start with one of `fresh_modules` are imported anew for this trace
    and put back afterwards, so that per-arch state a library keeps in its modules (tuned
    config tables, autotuner results, kernels' per-device caches) never leaks between targets.
    `triton_key` is Triton's `triton_key()` when the caller has it remembered. `on_jobs` is
    handed the kernels each step found first, after the step (a warm's workers compile them
    while the trace goes on); what forked processes found comes with the result alone. A trace
    that fails later has handed over what it found before (a warm takes it back). `groups` gives
    each call's group (`KernelFamily.step_group`): a split trace runs a group's calls in one
    process, where they share what `Capture.shared` holds.
    """
    from .forked import processes_for, run_split

    started = time.perf_counter()
    calls = list(calls)

    def run(steps: Iterable[int]) -> None:
        for step in steps:
            label, call = calls[step]
            capture.step = step
            try:
                call()
            except Exception as error:
                raise TracingError(family, label, f"{type(error).__name__}: {error}") from error
            if on_jobs is not None and os.getpid() == parent:  # a forked process hands back at its end
                found = capture.take_new(family)
                if found:
                    on_jobs(found)

    processes = 1
    parent = os.getpid()
    with capturing(target, fresh_modules, triton_key) as capture:
        run(range(min(1, len(calls))))  # the first step imports what the others need
        rest = range(1, len(calls))
        processes = processes_for(len(rest))
        if processes > 1:
            capture.add_found(run_split(rest, processes, run, capture.captured_in, groups))
        else:
            run(rest)
    jobs = capture.jobs(family)
    seconds = time.perf_counter() - started
    logger.info(
        "traced %s on %s: %d calls, %d kernels in %.2f s (%d processes)",
        family,
        target.name,
        len(calls),
        len(jobs),
        seconds,
        processes,
    )
    return TraceResult(family, target.name, len(calls), jobs, seconds, processes)


class Capture:
    """The specializations launches under `capturing` would compile, each with its cache key."""

    def __init__(self, target: Target, triton_key: str | None):
        self.target = target
        self.triton_key = triton_key
        self.options = _OptionsParser(target)
        # Specialization data -> (JITFunction, Triton cache key), in the order first seen.
        self.captured: dict[str, tuple[Any, str]] = {}
        # Specializations captured since `take_new` last ran.
        self.new: list[str] = []
        # The step of a trace running now, and the one each specialization was first seen in.
        self.step = 0
        self.first_step: dict[str, int] = {}
        # What forked processes captured (`forked.py`): (step, order, data, kernel path, key).
        self.found: list[tuple[int, int, str, str, str]] = []
        self.last: tuple[str, str] | None = None
        # What a family's step does once per capture (a merge's widening to every token count):
        # every later step finds its kernels captured already.
        self.done: set[object] = set()
        # What a family's steps build once and share (`KernelFamily.step_group`), by the
        # family's own key; objects of the libraries as imported for this capture's target.
        self.shared: dict[Hashable, Any] = {}

    def hook(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002
        data = compile["specialization_data"]
        if data not in self.captured:
            jit_function = fn.jit_function
            self.captured[data] = (jit_function, _cache_key(jit_function, compile, data, self.options, self.triton_key))
            self.first_step[data] = self.step
            self.new.append(data)
        self.last = (data, self.captured[data][1])
        return True  # nothing compiles, nothing launches

    def key_of(self, launch: Callable[[], object]) -> str:
        """The cache key of the one kernel `launch` launches, as Triton specializes it."""
        self.last = None
        launch()
        if self.last is None:
            raise TracingError("launch", getattr(launch, "__name__", "call"), "it launched no Triton kernel")
        return self.last[1]

    def specialization(self, kernel: Any, specialization_data: str) -> tuple[str, str]:
        """Replay `specialization_data` (`JITFunction.preload`'s input) through the hook: Triton's
        own re-serialized data for it and its cache key under this process's toolchain."""
        self.last = None
        kernel.preload(specialization_data)
        if self.last is None:
            raise TracingError("recorded", kernel.fn.__qualname__, "preloading it did not reach Triton's compile hook")
        return self.last

    def captured_in(self, steps: Iterable[int]) -> list[tuple[int, int, str, str, str]]:
        """What was first captured in `steps`, as `found` holds it."""
        wanted = set(steps)
        return [
            (self.first_step[data], order, data, _import_path(jit_function), key)
            for order, (data, (jit_function, key)) in enumerate(self.captured.items())
            if self.first_step[data] in wanted
        ]

    def take_new(self, family: str) -> tuple[CompileJob, ...]:
        """A job for each specialization captured since the last call."""
        new, self.new = self.new, []
        return tuple(
            CompileJob(family, self.target.name, _import_path(self.captured[data][0]), self.captured[data][1], data)
            for data in new
        )

    def add_found(self, found: Iterable[tuple[int, int, str, str, str]]) -> None:
        self.found.extend(found)

    def jobs(self, family: str) -> tuple[CompileJob, ...]:
        """One job per cache key, in the order of the steps that first launched them (the order
        of a trace in one process, however many it was split over)."""
        seen = [
            (self.first_step.get(data, 0), order, data, _import_path(jit_function), key)
            for order, (data, (jit_function, key)) in enumerate(self.captured.items())
        ]
        jobs: dict[str, CompileJob] = {}
        for _, _, data, path, key in sorted([*seen, *self.found], key=lambda entry: entry[:2]):
            jobs.setdefault(key, CompileJob(family, self.target.name, path, key, data))
        return tuple(jobs.values())


@contextlib.contextmanager
def capturing(target: Target, fresh_modules: tuple[str, ...] = (), triton_key: str | None = None) -> Iterator[Capture]:
    """Inside the block, launches of Triton kernels under `target` are captured, not compiled
    (see `trace_calls`)."""
    from triton import knobs

    capture = Capture(target, triton_key)
    with (
        active_target(target),
        device_model(target),
        aiter_wrappers_as_python(fresh_modules),
        isolated_modules(fresh_modules),
        knobs.runtime.scope(),
    ):
        knobs.runtime.jit_cache_hook = capture.hook
        token = _ACTIVE.set(capture)
        try:
            yield capture
        finally:
            _ACTIVE.reset(token)


_ACTIVE: contextvars.ContextVar[Capture | None] = contextvars.ContextVar("kprecompile_capture", default=None)


def active_capture() -> Capture | None:
    """The capture the current launches go to (None outside `capturing`: launches compile)."""
    return _ACTIVE.get()


def _import_path(jit_function: Any) -> str:
    return f"{jit_function.module}:{jit_function.fn.__qualname__}"


class _OptionsParser:
    """Parses serialized launch options the way `JITFunction.preload` does, once per target."""

    def __init__(self, target: Target):
        from triton.compiler.compiler import make_backend

        self.backend = make_backend(target.gpu_target())

    def parse(self, options: dict[str, Any]) -> Any:
        # JSON turns tuples into lists; preload turns them back before parsing.
        return self.backend.parse_options({k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})


def _cache_key(
    jit_function: Any, compile: dict[str, Any], data: str, parser: _OptionsParser, triton_key: str | None
) -> str:
    """The hash `triton.compile` will compute for this specialization: its cache entry's name.

    With `triton_key` given, the key string is assembled as `get_cache_key` assembles it; the
    compile step checks every compiled kernel's hash against this key, so a drift in that
    format fails loudly instead of missing the cache.
    """
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler.compiler import ASTSource
    from triton.runtime.cache import get_cache_key

    source = ASTSource(jit_function, compile["signature"], compile["constants"], compile["configs"][0])
    options = parser.parse(json.loads(data)["options"])
    # `triton.compile` re-parses the options dict together with the source's own options.
    options = parser.backend.parse_options(dict(options.__dict__, **source.parse_options()))
    env_vars = get_cache_invalidating_env_vars()
    if triton_key is None:
        key = get_cache_key(source, parser.backend, options, env_vars=env_vars)
    else:
        key = f"{triton_key}-{source.hash()}-{parser.backend.hash()}-{options.hash()}-{sorted(env_vars.items())}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _matching(prefixes: tuple[str, ...]) -> dict[str, Any]:
    return {name: module for name, module in sys.modules.copy().items() if name.startswith(prefixes)}


def _swap_modules(prefixes: tuple[str, ...], replacement: dict[str, Any]) -> dict[str, Any]:
    """Put `replacement` in place of the modules matching `prefixes`; return those it replaced."""
    current = _matching(prefixes)
    if current:
        # What is dropped may be imported again, its operators with it.
        operators_keep_first_definition()
    for name in current:
        del sys.modules[name]
    sys.modules.update(replacement)
    # Importing a submodule binds it on its parent package: point parents at the new set.
    for name, module in replacement.items():
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)
    return current


@contextlib.contextmanager
def isolated_modules(prefixes: tuple[str, ...]) -> Iterator[None]:
    """Import the modules matching `prefixes` anew inside the block; put the old ones back after.

    A module kept in place that bound a function of a dropped one at its import (vLLM 0.26 and
    0.27's `mla_attention.py` does `from vllm.v1.attention.ops.triton_merge_attn_states import
    mask_empty_context`) would still call the old import's function, and so launch the old
    import's kernel: one imported under another target, or compiled for real earlier in the
    process (a launch then reaches the cross-compile driver). Inside the block such names call
    the fresh import's function of the same name (`_forward_to_fresh_imports`). So does a
    module first imported inside an earlier block, whose names hold that block's imports."""
    if not prefixes:
        yield
        return
    saved = _swap_modules(prefixes, {})
    forwarded = _forward_to_fresh_imports(prefixes)
    try:
        yield
    finally:
        for namespace, name, original, forward in forwarded:
            if namespace.get(name) is forward:
                namespace[name] = original
        _swap_modules(prefixes, saved)


def _forward_to_fresh_imports(prefixes: tuple[str, ...]) -> list[tuple[dict[str, Any], str, Any, Any]]:
    """In the modules of the same packages that stay in place, each name bound to a module-level
    function of a module matching `prefixes` (none is imported at this point: each one is an
    earlier import's) is replaced by one that calls the function of that name in the module as
    imported anew (on the first call, so under the block's target). Returns (namespace, name,
    original, replacement) for each, to put back."""
    packages = {prefix.partition(".")[0] for prefix in prefixes}
    forwarded = []
    for module_name, module in sys.modules.copy().items():
        if module_name.partition(".")[0] not in packages or module_name.startswith(prefixes):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if (
                isinstance(value, types.FunctionType)
                and isinstance(value.__module__, str)
                and value.__module__.startswith(prefixes)
                and value.__qualname__ == value.__name__
            ):
                forward = _fresh_import_of(value)
                namespace[name] = forward
                forwarded.append((namespace, name, value, forward))
    return forwarded


def _fresh_import_of(original: Any) -> Any:
    """A function that calls `original`'s namesake in its module as `sys.modules` holds it then."""
    module_name, name = original.__module__, original.__name__

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module_name), name, original)(*args, **kwargs)

    return forward


class ModuleSets:
    """One set of library modules per target, for a process that handles several targets.

    Libraries compute per-arch state at import (FP8 types, tuned tables, arch flags that
    kernels read as globals); a kernel must come from modules imported for its own target,
    or its source's dependencies, and so its cache key, may differ from the traced one.
    """

    def __init__(self, prefixes: tuple[str, ...]):
        self.prefixes = prefixes
        self._sets: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def entered(self, target: str) -> Iterator[None]:
        saved = _swap_modules(self.prefixes, self._sets.get(target, {}))
        try:
            yield
        finally:
            self._sets[target] = _swap_modules(self.prefixes, saved)
