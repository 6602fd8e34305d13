"""Ask the installed vLLM which attention backend it selects, instead of mirroring its rule.

Where vLLM is installed and the release planned for is the installed one, `plan`, `warm`,
`verify`, `bake` and `export` take the attention backend from vLLM's own ROCm selector, run
under a stand-in of the target's platform (`platform.rocm_platform`), with the engine's flags in
the environment, in a subprocess (vLLM binds its platform and reads its AITER switches at
import, and importing it takes seconds). `plan`, `warm`, `verify` and `export` remember the
answer in their cache's toolchain bucket, keyed by the question, the stat of vLLM's selector
files and kprecompile's and amd-aiter's versions, so the next command does not import vLLM
again (`bake` asks each time). Only an answer is remembered: a backend, or vLLM's refusal; if
vLLM fails to answer, one WARNING and the mirror decides. The mirror in `selection/engines.py` serves
builders without vLLM (and other releases); the tests hold it equal to this answer for every
tested release.

    python -m kprecompile.vllm.selector < question.json
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ..cache.files import write_atomic
from ..cache.layout import CacheLayout
from ..errors import InputError
from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import TARGETS, Target
from ..inputs.toolchain import aiter_version, stat_digest
from .releases import installed_release

logger = logging.getLogger(__name__)

# The answer's line on stdout (vLLM logs to stdout as well).
_MARK = "kprecompile-selector: "
# Importing vLLM takes about 8 s; a hung import must not hang the command.
_TIMEOUT_SECONDS = 300
# vLLM's files whose change may change its answer (with its version).
_SELECTOR_FILES = (
    "platforms/rocm.py",
    "_aiter_ops.py",
    "envs.py",
    "attention/selector.py",
    "v1/attention/selector.py",
    "attention/backends/registry.py",
    "v1/attention/backends/registry.py",
)


@dataclass(frozen=True)
class Question:
    """What vLLM's selector is asked: the model's attention as vLLM describes it to the selector,
    the serving settings it reads, the backend named (if any) and the engine's flags."""

    target: str
    use_mla: bool
    head_size: int
    num_heads: int
    dtype: str
    kv_cache_dtype: str
    block_size: int
    sliding_window: bool
    requested: str | None
    flags: dict[str, str]
    has_sink: bool = False


class VllmSelector:
    """Calls the installed vLLM's selector for the ROCm targets of a request (see module doc)."""

    def __init__(
        self,
        release: str,
        model: ModelConfig,
        serving: ServingParams,
        targets: Sequence[Target],
        layout: CacheLayout | None,
    ) -> None:
        self.release = release
        self.model = model
        self.serving = serving
        self.targets = tuple(target for target in targets if target.is_rocm)
        self.layout = layout

    @property
    def description(self) -> str:
        return f"vLLM {self.release}'s own selector"

    def __call__(self, release: str, field: str, requested: str | None, flags: Mapping[str, str | None]) -> str | None:
        """The backend vLLM selects, or None where it cannot be asked (another release planned,
        no ROCm target, vLLM failing to answer: the caller uses its mirror)."""
        if release != self.release or not self.targets:
            return None
        answers: dict[str, str] = {}
        for target in self.targets:
            answer = self._answer(self._question(target, requested, flags))
            if answer is None:
                return None
            if "refused" in answer:
                refusal = answer["refused"]
                if requested is None:
                    expected = f"one vLLM {release} selects for these settings; it says: {refusal}"
                    raise InputError("attention backend", "none", expected)
                raise InputError(field, requested, f"a backend vLLM {release} accepts here; it says: {refusal}")
            answers[target.name] = answer["backend"]
        if len(set(answers.values())) > 1:
            chosen = ", ".join(f"{backend} on {name}" for name, backend in answers.items())
            raise InputError("--target", ",".join(answers), f"targets vLLM gives one backend; it selects {chosen}")
        return next(iter(answers.values()))

    def _question(self, target: Target, requested: str | None, flags: Mapping[str, str | None]) -> Question:
        model, serving = self.model, self.serving
        mla = model.mla
        return Question(
            target=target.name,
            use_mla=mla is not None,
            head_size=mla.kv_lora_rank + mla.qk_rope_head_dim if mla else model.head_dim,
            num_heads=serving.heads_per_rank(model),
            dtype=serving.activation_dtype(model),
            kv_cache_dtype="fp8" if serving.kv_cache_is_fp8 else "auto",
            block_size=serving.block_size,
            sliding_window=model.sliding_window is not None,
            requested=requested,
            has_sink=bool(model.sinks),
            flags={name: value for name, value in sorted(flags.items()) if value is not None},
        )

    def _answer(self, question: Question) -> dict[str, str] | None:
        memo = self._memo_path(question)
        if memo is not None:
            try:
                answer = json.loads(memo.read_text())
                if isinstance(answer, dict) and isinstance(answer.get("backend", answer.get("refused")), str):
                    logger.debug("vLLM's selector, remembered at %s: %s", memo, answer)
                    return answer
            except (OSError, ValueError):
                pass
        answer = _ask(question)
        if answer is not None and memo is not None:
            try:
                write_atomic(memo, json.dumps(answer).encode())
            except OSError as error:  # a read-only cache still works, only slower
                logger.debug("cannot remember vLLM's answer at %s: %s", memo, error)
        return answer

    def _memo_path(self, question: Question) -> Path | None:
        if self.layout is None:
            return None
        root = installed_vllm_dir()
        digest = hashlib.sha256(json.dumps(asdict(question), sort_keys=True).encode())
        # The answer is vLLM's, read through kprecompile's stand-in platform, with AITER's presence.
        with contextlib.suppress(metadata.PackageNotFoundError):
            digest.update(f"kprecompile=={metadata.version('kprecompile')}\n".encode())
        digest.update(f"aiter=={aiter_version()}\n".encode())
        digest.update(self.release.encode())
        digest.update(stat_digest([root / name for name in _SELECTOR_FILES if (root / name).is_file()]).encode())
        return self.layout.toolchain_dir / f"vllm-selector-{digest.hexdigest()[:32]}.json"


def installed_selector(
    model: ModelConfig, serving: ServingParams, targets: Sequence[Target], layout: CacheLayout | None
) -> VllmSelector | None:
    """vLLM's own selector where vLLM is installed, else None (the mirror decides)."""
    release = installed_release()
    if release is None or installed_vllm_dir() is None:
        return None
    return VllmSelector(release, model, serving, targets, layout)


def installed_vllm_dir() -> Path | None:
    """The installed vLLM package's directory, or None."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _ask(question: Question) -> dict[str, str] | None:
    """Run this module on `question`: vLLM's answer, or None (one WARNING) if it gives none."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("VLLM_") or name == "VLLM_LOGGING_LEVEL"
    }
    # The flags as the engine profile sets them; no GPU is touched (the platform is a stand-in).
    environment.update(question.flags, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    environment.pop("VLLM_ATTENTION_BACKEND", None)  # asked as `requested`
    environment.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    command = [sys.executable, "-m", __name__]
    try:
        result = subprocess.run(
            command,
            input=json.dumps(asdict(question)),
            capture_output=True,
            text=True,
            env=environment,
            timeout=_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        logger.warning("vLLM's attention-backend selector did not answer (%s); using kprecompile's mirror", error)
        return None
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK) :])
    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
    logger.warning("vLLM's attention-backend selector failed (%s); using kprecompile's mirror", last)
    return None


class _Refused(Exception):
    """vLLM's selector declined the question (as opposed to failing to answer it)."""


def _select(question: Question) -> str:
    """The backend name vLLM's ROCm platform selects; `_Refused` with vLLM's reason when it
    declines. vLLM is imported as on the target's host (`target_imports`: its optional
    dependencies' absence on a builder must not change the answer)."""
    import torch

    from ..platforms.triton_driver import active_target
    from ..platforms.vllm_platform import rocm_platform, target_imports
    from ..tracing.libraries import aiter_hip_absent, installed_aiter_without_hip

    dtype = getattr(torch, question.dtype)
    target = TARGETS[question.target]
    # The ROCm selector asks AITER's switches (0.13 to 0.16 import AITER with them, which reads
    # the GPU's FP8 type): AITER's Triton side under the target's driver, its HIP side absent.
    installed_aiter_without_hip()
    with active_target(target), target_imports(target), rocm_platform(target) as platform, aiter_hip_absent():
        selected = _backend_registry()[question.requested] if question.requested else None
        config_class = _selector_config_class()
        if config_class is None:  # 0.11 and 0.12: positional arguments
            arguments: tuple = (
                selected,
                question.head_size,
                dtype,
                question.kv_cache_dtype,
                question.block_size,
                question.use_mla,
                question.has_sink,
                False,
            )
            keywords: dict = {}
        else:
            features = {
                "head_size": question.head_size,
                "dtype": dtype,
                "kv_cache_dtype": question.kv_cache_dtype,
                "block_size": question.block_size,
                "use_mla": question.use_mla,
                "has_sliding_window": question.sliding_window,
                "has_sink": question.has_sink,
            }
            # The features the release's selector takes (windows from 0.28): it decides on those alone.
            taken = config_class._fields
            config = config_class(**{name: value for name, value in features.items() if name in taken})
            arguments = (selected, config)
            # The head count from 0.19 (0.13 to 0.18 take the record alone).
            asks_heads = "num_heads" in inspect.signature(platform.get_attn_backend_cls).parameters
            keywords = {"num_heads": question.num_heads} if asks_heads else {}
        try:
            path = platform.get_attn_backend_cls(*arguments, **keywords)
        except (ValueError, NotImplementedError) as error:
            _refused_for_this_aiter(selected)
            reason = str(error).strip()
            raise _Refused(reason.splitlines()[0] if reason else type(error).__name__) from error
    return registered_name(path) or path


def _refused_for_this_aiter(selected: Any) -> None:
    """vLLM's selector takes a backend whose module fails to import as invalid: where the module
    imports an AITER module the builder's AITER lacks (vLLM 0.31's ROCM_AITER_FA imports AITER's
    Gluon paged decode), a server with its release's AITER takes it. That is no answer (the caller
    falls back to its mirror, and planning says what the AITER lacks), not vLLM's refusal."""
    from ..tracing.libraries import aiter_module_lacking

    if selected is None:
        return
    try:
        selected.get_class()
    except ModuleNotFoundError as error:
        lacking = aiter_module_lacking(error)
        if lacking is not None:
            raise RuntimeError(f"{selected.name} imports {lacking}, which the installed AITER lacks") from error


def _selector_config_class() -> Any:
    """The record vLLM's selector takes its features in (`AttentionSelectorConfig`: in
    `vllm.attention.selector` from 0.13, `vllm.v1.attention.selector` from 0.19); None up to 0.12,
    whose selector takes them as positional arguments."""
    from ..tracing.libraries import release_attribute

    try:
        return release_attribute("AttentionSelectorConfig", ("vllm.v1.attention.selector", "vllm.attention.selector"))
    except ImportError:
        return None


def _backend_registry() -> Any:
    """vLLM's attention backend registry (`AttentionBackendEnum`), where the release keeps it."""
    from ..tracing.libraries import release_attribute

    # Under v1/ from 0.19.
    modules = ("vllm.v1.attention.backends.registry", "vllm.attention.backends.registry")
    return release_attribute("AttentionBackendEnum", modules)


def registered_name(path: str) -> str | None:
    """The registry's name for the backend class at `path` (`module.Class`), or None. A backend's
    own `get_name()` is not that name: ROCM_AITER_FA's class calls itself FLASH_ATTN."""
    for member in _backend_registry():
        try:
            if member.get_path() == path:
                return member.name
        except Exception:  # members whose class vLLM did not register
            continue
    return None


def main() -> None:
    """Answer one question; only vLLM's own refusal is an answer (remembered): any other failure
    exits non-zero, and the caller falls back to its mirror."""
    question = Question(**json.loads(sys.stdin.read()))
    try:
        answer = {"backend": _select(question)}
    except _Refused as refusal:
        answer = {"refused": str(refusal)}
    print(_MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
