"""The attention layers of a model as the installed vLLM builds them.

vLLM decides in its model classes what each attention layer is: its sliding window, soft-cap,
sinks, dtype, and (in `Attention.__init__`, through its own selector, asked with everything the
layer carries) its backend. Rather than mirror that per architecture, this builds the model with
vLLM's own code (`initialize_model` on the `VllmConfig` `vllm serve` would build) on the meta
device, so no weight is allocated, under the target's platform stand-in and the rank's share of
tensor parallelism, and reads every registered attention layer: its KV-cache spec, its impl's
soft-cap and sinks, the backend chosen. About 0.1 to 1 s past vLLM's import on this builder.

It runs in a subprocess per (model, serving, target platform, flags): vLLM binds its platform and
registers its operators at import, and the build imports every module of the model. Where nothing
of vLLM's is imported yet (a first `plan` on a builder), it runs in the command's own process
instead, under the environment the subprocess would have, so that the trace that follows finds
vLLM imported (the imports are most of a first plan). The answer is remembered in the cache's
toolchain bucket, keyed by the question and vLLM's installed files, like the selector's
(`vllm/selector.py`). Where vLLM cannot build the model here, one WARNING, and
the config's reading decides (`inputs/layers.py`).

    python -m kprecompile.vllm.model_layers < question.json
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..cache.files import write_atomic
from ..cache.layout import CacheLayout
from ..errors import InputError
from ..inputs.layers import AttentionLayer, distinct
from ..inputs.models import ModelConfig
from ..inputs.serving import ServingParams
from ..inputs.targets import TARGETS, Target, gpu_may_be_visible
from ..inputs.toolchain import aiter_version, stat_digest
from .releases import release_line
from .selector import installed_vllm_dir

logger = logging.getLogger(__name__)

_MARK = "kprecompile-layers: "
_TIMEOUT_SECONDS = 300


@dataclass(frozen=True)
class Question:
    """What the build is given: the model's config, the serving parameters as `vllm serve` takes
    them, the target, the backend named (if any) and the engine's flags."""

    config_json: str
    serving: dict[str, Any]
    target: str
    requested: str | None
    flags: dict[str, str]
    release: str
    # Where the model's own code is (--trust-remote-code), or None.
    directory: str | None = None

    @classmethod
    def of(
        cls,
        model: ModelConfig,
        serving: ServingParams,
        target: Target,
        release: str,
        requested: str | None,
        flags: Mapping[str, str | None],
    ) -> Question:
        return cls(
            config_json=model.config_json,
            serving=serving.as_dict(),
            target=target.name,
            requested=requested,
            flags={name: value for name, value in sorted(flags.items()) if value is not None},
            release=release,
            directory=model.directory,
        )


@dataclass(frozen=True)
class BuiltLayers:
    """vLLM's answer: the model class it built, its distinct attention layers, and the serving
    parameters vLLM resolved for it (`engine_config.serving_from_vllm`, as a dict)."""

    architecture: str
    layers: tuple[AttentionLayer, ...]
    # As a dict, or why kprecompile cannot plan what vLLM resolved.
    serving: dict[str, Any] | str

    @property
    def source(self) -> str:
        return f"vLLM's {self.architecture}"


def vllm_layers(
    model: ModelConfig,
    serving: ServingParams,
    target: Target,
    release: str,
    requested: str | None,
    flags: Mapping[str, str | None],
    layout: CacheLayout | None,
) -> BuiltLayers | None:
    """The layers vLLM builds for `model` on `target`, or None (one WARNING) where it cannot."""
    question = Question.of(model, serving, target, release, requested, flags)
    memo = _memo_path(question, layout)
    if memo is not None:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            remembered = _parse(json.loads(memo.read_text()))
            logger.debug("vLLM's layers, remembered at %s", memo)
            return remembered
    answer = _built_here(question)
    if answer is None:
        with _importing_beside(target):
            answer = _ask(question, model.name)
    if answer is not None and memo is not None:
        try:
            write_atomic(memo, json.dumps(answer).encode())
        except OSError as error:  # a read-only cache still works, only slower
            logger.debug("cannot remember vLLM's layers at %s: %s", memo, error)
    return None if answer is None else _parse(answer)


def _built_here(question: Question) -> dict[str, Any] | None:
    """The answer built in this process, under the environment the subprocess would have, where
    nothing of vLLM's is imported yet and no GPU is visible (a first `plan` or `warm`): what it
    traces next then imports vLLM once, not once here and once in a child. None (a process of its
    own answers, as where this does not hold) where the build fails here."""
    # A GPU this process may see: torch may hold it before the build could hide it.
    if any(name == "vllm" or name.startswith("vllm.") for name in sys.modules.copy()) or any(
        gpu_may_be_visible(backend) for backend in ("cuda", "hip")
    ):
        return None
    from ..platforms.vllm_platform import quiet_vllm_logging

    quiet_vllm_logging()  # before vLLM's first import here: this process's stdout carries `--json`
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(build_environment(question))
        quiet_vllm_logging()  # and under the build's environment, which has only some of vLLM's variables
        return build(question)
    except Exception as error:
        logger.debug("vLLM did not build the layers in this process (%s: %s)", type(error).__name__, error)
        return None
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _importing_beside(target: Target) -> Iterator[None]:
    """While vLLM builds the model in a process of its own, this one imports what tracing vLLM's
    kernels needs next (torch, Triton, vLLM's engine arguments, under the target's platform as a
    trace imports them): the two imports overlap instead of following each other. Joined before
    the block ends: a trace may fork, which only a process with one thread does."""

    def import_for_tracing() -> None:
        from ..platforms.triton_driver import active_target
        from ..tracing.libraries import import_library_module

        try:
            with active_target(target):
                import_library_module("vllm.engine.arg_utils")
        except Exception as error:  # the trace imports them again and says what fails
            logger.debug("importing vLLM beside its model build failed: %s", error)

    thread = threading.Thread(target=import_for_tracing, name="kprecompile-import", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _parse(answer: dict[str, Any]) -> BuiltLayers:
    names = {field.name for field in fields(AttentionLayer)}
    layers = tuple(AttentionLayer(**{key: layer[key] for key in names}) for layer in answer["layers"])
    serving = answer["serving"]
    return BuiltLayers(
        str(answer["architecture"]), layers, dict(serving) if isinstance(serving, dict) else str(serving)
    )


# What an answer holds: a remembered answer of another schema is asked again.
_ANSWER_SCHEMA = "layers-v2"


def _memo_path(question: Question, layout: CacheLayout | None) -> Path | None:
    root = installed_vllm_dir()
    if layout is None or root is None:
        return None
    digest = hashlib.sha256(json.dumps(asdict(question), sort_keys=True).encode())
    digest.update(f"{_ANSWER_SCHEMA}\n".encode())
    for distribution in ("kprecompile", "transformers"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            digest.update(f"{distribution}=={metadata.version(distribution)}\n".encode())
    digest.update(f"aiter=={aiter_version()}\n".encode())
    # Any of vLLM's files may be the model's: its RECORD changes with every install.
    records = list(root.parent.glob(f"vllm-{question.release}.dist-info/RECORD"))
    digest.update(stat_digest([root / "__init__.py", *records]).encode())
    return layout.toolchain_dir / f"vllm-layers-{digest.hexdigest()[:32]}.json"


# vLLM variables that are no engine flag and pass to the build: its logging, and where it keeps its
# model-info cache (without the cached answer vLLM inspects the model's class in a child process
# that imports its platform, which a GPU host with vLLM's Python files only cannot load).
_PASSED = ("VLLM_LOGGING_LEVEL", "VLLM_CACHE_ROOT")


def build_environment(question: Question) -> dict[str, str]:
    """The environment of the process that builds the model: this one's, with vLLM's variables
    exactly the question's flags, and no GPU."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_") or key in _PASSED}
    environment.update(question.flags, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    environment.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if question.requested and release_line(question.release).backend_variable:
        environment["VLLM_ATTENTION_BACKEND"] = question.requested
    return environment


def _ask(question: Question, name: str) -> dict[str, Any] | None:
    try:
        result = subprocess.run(
            [sys.executable, "-m", __name__],
            input=json.dumps(asdict(question)),
            capture_output=True,
            text=True,
            env=build_environment(question),
            timeout=_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        logger.warning("vLLM did not build %s's layers (%s); reading them from its config", name, error)
        return None
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK) :])
    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
    logger.warning("vLLM could not build %s's layers here (%s); reading them from its config", name, last)
    return None


def _operator_defined(qualified: str) -> bool:
    import torch

    namespace, _, name = qualified.partition("::")
    return torch._C._dispatch_has_kernel(f"{namespace}::{name}") or bool(
        torch._C._jit_get_schemas_for_operator(f"{namespace}::{name}")
    )


@contextlib.contextmanager
def _prebuilt_operators() -> Iterator[None]:
    """vLLM's layers look up their compiled operators (`torch.ops._C.gelu_tanh_and_mul`) when they
    are built, some at import; a builder has none registered. In the block a missing one is a
    stand-in that fails if called (the build calls none)."""
    import torch

    class Prebuilt:
        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, name: str) -> Prebuilt:
            return Prebuilt(f"{self._name}.{name}")

        def __call__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError(f"{self._name} is a compiled operator, absent on this builder")

    class Namespace:
        def __init__(self, inner: Any, name: str) -> None:
            self._inner, self._name = inner, name

        def __getattr__(self, name: str) -> Any:
            try:
                return getattr(self._inner, name)
            except AttributeError:
                return Prebuilt(f"torch.ops.{self._name}.{name}")

    names = ("_C", "_rocm_C", "_moe_C", "_C_cache_ops", "_C_custom_ar", "aiter", "_vllm_fa2_C", "_vllm_fa3_C")
    saved = {name: torch.ops.__dict__.get(name) for name in names}
    for name in names:
        setattr(torch.ops, name, Namespace(getattr(torch.ops, name), name))

    # A stand-in answers `hasattr(torch.ops._C, name)` too, and vLLM 0.34 then registers a fake for
    # the operator it found (`_cpu_ops`): a fake for an operator no library defined is left out.
    register_fake = torch.library.register_fake

    def register_fake_if_defined(op: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(op, str) and "::" in op and not _operator_defined(op):
            return (lambda function: function) if not args or not callable(args[0]) else args[0]
        return register_fake(op, *args, **kwargs)

    torch.library.register_fake = register_fake_if_defined

    class Handle:  # MoE layers take an auxiliary CUDA stream and events when built
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

    handles = {name: getattr(torch.cuda, name) for name in ("Stream", "Event")}
    for name in handles:
        setattr(torch.cuda, name, Handle)
    try:
        yield
    finally:
        torch.library.register_fake = register_fake
        for name, handle in handles.items():
            setattr(torch.cuda, name, handle)
        for name, namespace in saved.items():
            if namespace is None:
                delattr(torch.ops, name)
            else:
                setattr(torch.ops, name, namespace)


def _rank_groups(tensor_parallel_size: int) -> None:
    """vLLM's process groups as one rank of `tensor_parallel_size` sees them: layers read only
    their sizes and rank when built (no collective runs)."""
    parallel_state = sys.modules["vllm.distributed.parallel_state"]

    def group(size: int) -> SimpleNamespace:
        process_group = SimpleNamespace(size=lambda: size, rank=lambda: 0)
        return SimpleNamespace(
            world_size=size,
            rank_in_group=0,
            rank=0,
            local_rank=0,
            ranks=list(range(size)),
            is_first_rank=True,
            is_last_rank=True,
            device_group=process_group,
            cpu_group=process_group,
        )

    for name in ("_WORLD", "_TP", "_EP"):
        setattr(parallel_state, name, group(tensor_parallel_size))
    for name in ("_PP", "_DP", "_DCP", "_PCP", "_ETP"):
        if hasattr(parallel_state, name):
            setattr(parallel_state, name, group(1))


def _layer(layer: Any, config: Any, spec: Any) -> AttentionLayer:
    """One of vLLM's built attention layers, read from the objects vLLM made."""
    from .selector import registered_name

    impl = getattr(layer, "impl", None)
    sinks = getattr(impl, "sinks", None)
    backend = layer.attn_backend
    path = f"{backend.__module__}.{backend.__qualname__}"
    soft_cap = getattr(impl, "logits_soft_cap", None) or 0.0
    mla = type(spec).__name__.startswith("MLA") or "MLA" in type(spec).__name__
    # MLA's kv_b_proj as the checkpoint's quantization built it (the impl holds it in every
    # release, the layer too in later ones): its weight's dtype decides FP4 against FP8 BMM.
    kv_b_proj = getattr(layer, "kv_b_proj", None) or getattr(impl, "kv_b_proj", None)
    weight = getattr(kv_b_proj, "weight", None) if mla else None
    return AttentionLayer(
        mla=mla,
        num_heads=layer.num_heads,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        sliding_window=getattr(spec, "sliding_window", None) or 0,
        logits_soft_cap=float(soft_cap),
        sinks=str(sinks.dtype).removeprefix("torch.") if sinks is not None else "",
        dtype=str(config.model_config.dtype).removeprefix("torch."),
        kv_cache_dtype="auto" if layer.kv_cache_dtype == "auto" else "fp8",
        backend=registered_name(path) or backend.get_name(),
        kv_b_proj_dtype=str(weight.dtype).removeprefix("torch.") if weight is not None else "",
    )


def built_layers(vllm_config: Any) -> tuple[AttentionLayer, ...]:
    """The distinct attention layers of the model vLLM built for `vllm_config` (its forward
    context's registered layers): what this module's subprocess reads, and what the plugin reads
    in the server's own process."""
    layers = []
    for layer in vllm_config.compilation_config.static_forward_context.values():
        if hasattr(layer, "attn_backend") and hasattr(layer, "get_kv_cache_spec"):
            spec = layer.get_kv_cache_spec(vllm_config)
            if spec is not None:
                layers.append(_layer(layer, vllm_config, spec))
    return distinct(layers)


def build_model(question: Question) -> tuple[Any, Any]:
    """(VllmConfig, model): the model vLLM builds for `question`, on meta, in this process (a
    subprocess of the command: module doc)."""
    import torch

    from ..platforms.triton_driver import active_target, meta_allocations
    from ..platforms.vllm_platform import target_imports, use_target_platform
    from ..tracing.libraries import aiter_hip_absent, import_library_module
    from ..tracing.prebuilt import aiter_attention_prebuilt
    from .engine_config import cutlass_answered, engine_config, remember_model_directory

    remember_model_directory(question.config_json, question.directory)
    target = TARGETS[question.target]
    serving = ServingParams(
        **{
            **question.serving,
            "cudagraph_capture_sizes": question.serving.get("cudagraph_capture_sizes")
            and tuple(question.serving["cudagraph_capture_sizes"]),
        }
    )
    with active_target(target):
        use_target_platform(target)
        if target.is_rocm:
            import_library_module("aiter")  # AITER's Triton side, without HIP (`tracing/libraries.py`)
        requested = None if release_line(question.release).backend_variable else question.requested
        config = engine_config(question.config_json, serving, target, requested)
        import_library_module("vllm.distributed.parallel_state")
        _rank_groups(serving.tensor_parallel_size)
        # AITER's prebuilt attention, which its backends' impls import when built (ROCm).
        aiter_prebuilt = aiter_attention_prebuilt() if target.is_rocm else contextlib.nullcontext()
        with (
            target_imports(target),
            aiter_hip_absent(),
            cutlass_answered(target),
            aiter_prebuilt,
            _prebuilt_operators(),
        ):
            loader = import_library_module("vllm.model_executor.model_loader.utils")
            try:
                set_default_dtype = import_library_module("vllm.utils.torch_utils").set_default_torch_dtype
            except (ImportError, AttributeError):  # 0.11
                set_default_dtype = loader.set_default_torch_dtype
            with set_default_dtype(config.model_config.dtype), torch.device("meta"), meta_allocations():
                model = loader.initialize_model(vllm_config=config)
    return config, model


def build(question: Question) -> dict[str, Any]:
    """The answer to `question`, as the subprocess prints it."""
    from .engine_config import serving_from_vllm

    config, model = build_model(question)
    try:
        serving: dict[str, Any] | str = serving_from_vllm(config).as_dict()
    except InputError as error:  # the layers stand; the command says why the serving does not
        serving = str(error)
    return {
        "architecture": type(model).__name__,
        "layers": [layer.as_dict() for layer in built_layers(config)],
        "serving": serving,
    }


def main() -> None:
    question = Question(**json.loads(sys.stdin.read()))
    print(_MARK + json.dumps(build(question)), flush=True)


if __name__ == "__main__":
    main()


def with_engine_layers(
    model: ModelConfig,
    serving: ServingParams,
    targets: tuple[Target, ...],
    engine: str,
    requested: str | None,
    release: str | None,
    layout: CacheLayout | None,
) -> tuple[ModelConfig, ServingParams]:
    """`model` with the attention layers the installed vLLM builds for these targets, and the
    serving parameters vLLM resolves for it (what the plugin reads in the server, so that both
    compute one key), where it is the release planned for; else both as they are (the config's
    reading and kprecompile's rules decide). vLLM's kernels for NVIDIA and ROCm targets are
    planned in requests of their own: the ROCm targets decide."""
    from dataclasses import replace

    from ..inputs.environment import registered_values
    from .releases import installed_release, resolve_release

    installed = installed_release()
    if installed is None or installed_vllm_dir() is None or resolve_release(release) != installed or not targets:
        return model, serving
    rocm = tuple(target for target in targets if target.is_rocm)
    flags = registered_values(os.environ, engine, installed)
    if requested is None and release_line(installed).backend_variable:
        requested = flags.get("VLLM_ATTENTION_BACKEND") or None
    flags = {name: value for name, value in flags.items() if name != "VLLM_ATTENTION_BACKEND"}
    answers = {}
    for target in rocm or targets:
        built = vllm_layers(model, serving, target, installed, requested, flags, layout)
        if built is None:
            return model, serving
        answers[target.name] = built
    if len({built.layers for built in answers.values()}) > 1:
        chosen = ", ".join(
            f"{', '.join(layer.backend for layer in built.layers)} on {name}" for name, built in answers.items()
        )
        raise InputError("--target", ",".join(answers), f"targets vLLM builds alike; it builds {chosen}")
    if len({json.dumps(built.serving, sort_keys=True) for built in answers.values()}) > 1:
        resolved = "; ".join(f"{name}: {built.serving}" for name, built in answers.items())
        raise InputError("--target", ",".join(answers), f"targets vLLM resolves alike; it resolves {resolved}")
    built = next(iter(answers.values()))
    source = f"vLLM {installed}'s {built.architecture}"
    model = replace(model, attention_layers=built.layers, layers_source=source)
    if rocm and len(rocm) != len(targets):
        # NVIDIA targets beside ROCm ones: vLLM resolved for ROCm; keep the flags for all.
        return model, serving
    return model, _resolved_serving(built, serving, model)


def _resolved_serving(built: BuiltLayers, serving: ServingParams, model: ModelConfig) -> ServingParams:
    """The serving parameters vLLM resolved, where kprecompile can plan them for `model` (one
    WARNING and the flags as given where it cannot)."""
    problem = built.serving if isinstance(built.serving, str) else None
    if problem is None:
        resolved = dict(built.serving)
        if resolved.get("cudagraph_capture_sizes") is not None:
            resolved["cudagraph_capture_sizes"] = tuple(resolved["cudagraph_capture_sizes"])
        try:
            adopted = ServingParams(**resolved)
            adopted.check(model)
            return adopted
        except (InputError, TypeError) as error:
            problem = str(error)
    logger.warning(
        "vLLM's %s resolved serving parameters kprecompile cannot plan (%s); planning with the flags as given",
        built.architecture,
        problem,
    )
    return serving
