"""The `vllm.general_plugins` entry point and the hooks it puts into vLLM's model loading.

vLLM calls `register` in every process it starts, before it builds a model. In that order:

1. `register`: point Triton (cache directory, the layered manager over baked layers) and
   AITER's JIT directory at kprecompile's cache and start the JIT monitor, before any model
   code runs, so every kernel compiled in this process, vLLM's load-time FP8 BMM loop included,
   is looked up in the cache and counted.
2. After vLLM built the model (`initialize_model`: the attention backend of its layers is
   known, the weights are not loaded yet): the request is what vLLM resolved (its config, the
   backend of the model's layers) for this worker's GPU, whose platform decides the families
   (vLLM's CUDA rules on NVIDIA, its ROCm rules on AMD); verify in-process; when the
   configuration is not warm, start the warm in a background process, which runs while the
   weights load; when it is, start loading its kernels into the process in a thread
   (`start_preload`), beside the weights. Where no family compiles on the GPU (FLASH_ATTN on
   NVIDIA), one line says why.
3. Before `process_weights_after_loading` (where vLLM's MLA layers run their FP8 BMM loop,
   m = 1..1024): join the warm, so that the loop finds every kernel in the cache; or join the
   loading thread, before the engine launches its first Triton kernel: Triton publishes a
   kernel in its cache before its module and launcher are loaded, and an engine thread launching
   it in between would launch a kernel without a function.
4. After the runner's `load_model`: the kernels of a configuration warmed beside the load are
   loaded (in this thread), a loading thread still running is joined (a loader that does not
   call `process_weights_after_loading`), and one line says how many compiled while loading.
   vLLM's V2 model runner (0.24 on) loads through the same loader functions but is not hooked
   here: under it, a warm configuration's kernels load beside the weights (steps 2 and 3), a
   configuration warmed beside the load is not preloaded.

Operators see one line per event at WARNING through vLLM's own logging, from the first local
rank only. Nothing here ever stops the server: a failure is one WARNING line, and the kernels
then compile on first use as they would without kprecompile.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from ...errors import InputError, KprecompileError
from ...inputs import settings
from ...vllm.releases import installed_release, warn_if_untested
from ...warmup.pool import default_worker_count
from ...wording import plural
from ..monitor import JitMonitor

# A child of vLLM's logger: lines appear in vLLM's format, through vLLM's handlers.
logger = logging.getLogger("vllm.kprecompile")

_HOOK: LoaderHook | None = None
_MARK = "_kprecompile_hook"


def register() -> None:
    """The entry point vLLM calls in each process. Never raises."""
    global _HOOK
    if _HOOK is not None:
        return
    try:
        enabled = settings.VLLM_HOOK.read()
    except InputError as error:
        logger.warning("kprecompile: %s; the hook stays on", error)
        enabled = True
    if not enabled:
        logger.info("kprecompile: the vLLM hook is off (%s=0)", settings.VLLM_HOOK.name)
        return
    release = installed_release()
    if release is None:
        logger.info("kprecompile: vLLM is not installed here; the loader hook does nothing")
        return
    try:
        warn_if_untested(release, logger)
        _HOOK = LoaderHook.install(release)
    except Exception as error:  # the server must start regardless
        logger.warning(
            "kprecompile: hook not installed in vLLM %s (%s: %s); kernels compile on first use",
            release,
            type(error).__name__,
            error,
        )


def loader_hook() -> LoaderHook | None:
    """The hook `register` installed in this process, if any."""
    return _HOOK


@dataclass
class LoaderHook:
    release: str
    layout: Any
    monitor: JitMonitor
    # The GPU this worker compiles for: its own (None: detected when the model is built).
    target: Any = None
    # Set once the model is built: what this worker serves, and the warm running beside it.
    request: Any = None
    hf_config: dict[str, Any] | None = None
    was_warm: bool | None = None
    background: Any = None
    # The configuration's kernels loading into this process beside the weights (`start_preload`),
    # and whether they are loaded.
    preloading: Any = None
    loaded: bool = False
    events: list[str] = field(default_factory=list)

    @classmethod
    def install(cls, release: str) -> LoaderHook:
        from ..runtime import activate

        aiter_first = "aiter" in sys.modules
        layout = activate()
        if aiter_first:
            logger.warning(
                "kprecompile: aiter was imported before the plugin ran, so AITER's own JIT builds use "
                "its default directory instead of %s (set AITER_JIT_DIR before starting vLLM to share them)",
                layout.aiter_jit_dir,
            )
        hook = cls(release, layout, JitMonitor().install())
        hook._patch_vllm()
        return hook

    def _patch_vllm(self) -> None:
        """Wrap vLLM's model construction, weight post-processing and the runner's load_model: the
        V1 runner's where the release has it (up to 0.33), else the V2 runner's (0.34 has no other)."""
        from vllm.model_executor.model_loader import base_loader

        _wrap(base_loader, "initialize_model", after=self._model_built)
        _wrap(base_loader, "process_weights_after_loading", before=self._before_weights_processed)
        _wrap(model_runner_class(), "load_model", after=self._model_loaded)

    # The moments of a load.

    def _model_built(self, result: Any, args: tuple, kwargs: dict) -> None:
        if self.request is not None:
            return  # a drafter's model: the main model decides
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        self._guarded("planning", lambda: self._start(vllm_config, result))

    def _before_weights_processed(self, args: tuple, kwargs: dict) -> None:
        if self.background is not None:
            self._guarded("waiting for the background warm", self._join)
        self._guarded("loading kernels", self._join_preload)

    def _model_loaded(self, result: Any, args: tuple, kwargs: dict) -> None:
        self._guarded("loading kernels", self._join_preload)
        if not self.loaded:
            self._guarded("loading kernels", self._preload)

    # What happens at each.

    def _start(self, vllm_config: Any, model: Any) -> None:
        from ...inputs.targets import detect_local_target
        from ...warmup.verification import verify
        from ..runtime import journal_sink
        from . import background
        from .request import from_vllm_config, hf_config_dict

        self.loaded = False  # a new model: its kernels are not loaded yet
        # The local GPU decides the families (vLLM's CUDA or ROCm rules), the model's layers the backend.
        request = from_vllm_config(vllm_config, model, self.target or detect_local_target)
        self.request, self.hf_config = request, hf_config_dict(vllm_config)
        # From here on (and what compiled before), compiles go to this configuration's journal.
        self.monitor.record_to(journal_sink(request, self.layout, request.targets[0]))
        target = request.targets[0].name
        why = _nothing_to_compile(request)
        if why is not None:
            self._say(
                f"{request.model.name} ({request.selection.attention_backend}) on {target}: "
                f"nothing to compile ahead ({why})"
            )
            return
        report = verify(request, self.layout)
        self.was_warm = report.warm
        if report.warm:
            self._say(
                f"{request.model.name} on {target} is warm in {self.layout.root} "
                f"({plural(report.targets[0].kernels, 'kernel')}): loading them beside the weights"
            )
            self._start_preload()
            return
        ranks = _local_ranks(request.serving.tensor_parallel_size)
        self.background = background.start(
            request,
            self.hf_config,
            str(self.layout.root),
            tuple(map(str, self.layout.layers)),
            workers=max(1, default_worker_count() // ranks),
            rank=_rank(),
            ranks=ranks,
        )
        self._say(
            f"{request.model.name} ({request.selection.attention_backend}) is not warm on {target}: "
            f"warming {self.layout.root} in the background while the weights load"
        )

    def _join(self) -> None:
        report, errors, waited = self.background.join()
        self.background = None
        if report is None:
            raise KprecompileError(f"the background warm did not finish ({errors or 'no output'})")
        failed = f", {report['failed']} failed (they compile on first use)" if report["failed"] else ""
        for failure in report.get("family_failures", ()):
            failed += f"; {failure['family']} failed (its kernels compile on first use): {failure['error']}"
        self._say(
            f"background warm: {plural(report['kernels'], 'kernel')} ({report['compiled']} compiled, "
            f"{report['cached']} cached{failed}) in {report['seconds']:.1f} s; the load waited {waited:.1f} s for it"
        )

    def _start_preload(self) -> None:
        from ...warmup.preload import start_preload

        self.preloading = start_preload(self.request, self.layout, target=self.request.targets[0])

    def _join_preload(self) -> None:
        if self.preloading is None:
            return
        preloading, self.preloading = self.preloading, None
        self._report_loaded(preloading.join())

    def _preload(self) -> None:
        from ...warmup.preload import preload

        if self.request is None:
            raise KprecompileError("vLLM built the model without the hooked loader; nothing was planned")
        if _nothing_to_compile(self.request) is not None:
            self.loaded = True
            self._say(f"{plural(len(self.monitor.compiles), 'kernel')} compiled in this process since it started")
            return
        self._report_loaded(preload(self.request, self.layout, target=self.request.targets[0]))

    def _report_loaded(self, report: Any) -> None:
        self.loaded = True
        failed = f" ({len(report.failures)} could not be loaded: {report.failures[0]})" if report.failures else ""
        in_memory = f", {report.in_memory} already in memory" if report.in_memory else ""
        beside = "" if report.waited is None else f" beside the weights, which waited {report.waited:.1f} s for them"
        self._say(
            f"{plural(report.kernels - len(report.failures), 'kernel')} of the configuration in the process "
            f"({report.loaded} loaded from the cache in {report.seconds:.1f} s{beside}{in_memory}){failed}; "
            f"{plural(len(self.monitor.compiles), 'kernel')} compiled in this process since it started"
        )

    def _say(self, line: str) -> None:
        self.events.append(line)
        if _rank() == 0:
            logger.warning("kprecompile: %s", line)

    def _guarded(self, what: str, step) -> None:
        try:
            step()
        except Exception as error:  # the server must start regardless
            self.background = None  # a loading thread is kept: it is still joined before graph capture
            self.events.append(f"skipped {what}: {error}")
            logger.warning(
                "kprecompile: %s skipped (%s: %s); kernels compile on first use", what, type(error).__name__, error
            )


def _nothing_to_compile(request: Any) -> str | None:
    """Why no family of the request compiles on its target (e.g. FLASH_ATTN on an NVIDIA GPU runs
    prebuilt kernels, nothing through Triton), or None when one does."""
    target = request.targets[0].name
    reasons = [choice.skip_reason or choice.skip_reason_on(target) for choice in request.selection.choices]
    if not all(reasons):
        return None
    return "; ".join(dict.fromkeys(map(str, reasons))) or "no kernel family"


def model_runner_class() -> type:
    """The GPU model runner whose `load_model` the plugin hooks: V1's where the release has it
    (up to 0.33), else V2's (0.34 has no other)."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ModuleNotFoundError:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    return GPUModelRunner


def _wrap(owner: Any, name: str, *, before=None, after=None) -> None:
    """Replace `owner.name` with a wrapper calling `before(args, kwargs)` and `after(result, args,
    kwargs)` around it; wrapping twice changes nothing."""
    original = getattr(owner, name)
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(args, kwargs)
        result = original(*args, **kwargs)
        if after is not None:
            after(result, args, kwargs)
        return result

    setattr(wrapper, _MARK, True)
    setattr(owner, name, wrapper)


def _rank() -> int:
    """This worker's tensor-parallel rank (0 before vLLM's process groups exist)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:
        return int(os.environ.get("LOCAL_RANK", "0") or 0)


def _local_ranks(tensor_parallel_size: int) -> int:
    """Ranks warming on this host at once: they share its CPUs."""
    try:
        import torch

        return max(1, min(tensor_parallel_size, torch.cuda.device_count()))
    except Exception:
        return 1
