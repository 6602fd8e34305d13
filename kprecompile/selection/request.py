"""What a user asked for, checked before any work: models, serving parameters, engine
selection and targets. Shared by every command; the loader hook and the vLLM plugin build the
same records from the engine's own configuration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..cache.layout import CacheLayout
from ..errors import InputError
from ..inputs.models import ModelConfig, load_model
from ..inputs.serving import ServingParams
from ..inputs.targets import Target, resolve_target
from .engines import Selection, select


@dataclass(frozen=True)
class Request:
    """One model to serve under one engine selection, on these targets."""

    model: ModelConfig
    serving: ServingParams
    selection: Selection
    targets: tuple[Target, ...] = ()

    def on(self, target: Target) -> Request:
        """The same request, for `target` alone."""
        return replace(self, targets=(target,))


def parse_capture_sizes(text: str | None, field: str = "--cudagraph-capture-sizes") -> tuple[int, ...] | None:
    """`1,2,4` -> (1, 2, 4); None stays None (vLLM's rule decides)."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InputError(field, text, "a comma-separated list of positive integers") from None


def resolve_targets(names: Sequence[str]) -> tuple[Target, ...]:
    """Targets by name (or `auto`), in order, each once."""
    return tuple(dict.fromkeys(resolve_target(name) for name in names))


def resolve_requests(
    model_specs: Sequence[str],
    serving: ServingParams,
    target_names: Sequence[str],
    *,
    engine: str,
    attention_backend: str | None = None,
    families: Sequence[str] = (),
    vllm_release: str | None = None,
    layout: CacheLayout | None = None,
    revision: str | None = None,
) -> tuple[Request, ...]:
    """One request per model (each named once); every input is checked here, before any work.

    Where vLLM is installed, its own selector chooses the attention backend for the ROCm targets
    (remembered in `layout`'s cache); elsewhere, and for NVIDIA targets, kprecompile's mirror of
    it does."""
    from ..vllm.model_layers import with_engine_layers
    from ..vllm.selector import installed_selector

    targets = resolve_targets(target_names)
    requests = []
    for spec in dict.fromkeys(model_specs):
        model = load_model(spec, revision)
        selector = None
        served = serving
        if engine != "aiter":
            # A combination the engine would refuse fails before vLLM builds anything.
            serving.check(model)
            model, served = with_engine_layers(model, serving, targets, engine, attention_backend, vllm_release, layout)
            selector = installed_selector(model, served, targets, layout)
        selection = select(
            model,
            engine,
            attention_backend,
            families=families,
            vllm_release=vllm_release,
            block_size=served.block_size,
            selector=selector,
            targets=targets,
            dtype=served.activation_dtype(model) if engine != "aiter" else None,
        )
        # A combination the engine would refuse fails here, before any work.
        served.check(model)
        requests.append(Request(model, served, selection, targets))
    return tuple(requests)
