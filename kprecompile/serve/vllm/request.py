"""What vLLM resolved, as kprecompile's records: the model's config, the serving parameters and
the attention backend the model's layers were built with.

Everything is read from vLLM's own objects (`VllmConfig`, the built model), never re-derived:
vLLM has already applied its defaults, its platform's rules and the user's flags. Field
layouts differ between releases; each read here exists in every supported release.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...inputs.models import model_from_dict
from ...inputs.targets import Target
from ...selection.engines import select
from ...selection.request import Request
from ...vllm.engine_config import serving_from_vllm
from ...vllm.model_layers import built_layers
from ...vllm.releases import installed_release

# A child of vLLM's logger, as the plugin's (`plugin.py`).
logger = logging.getLogger("vllm.kprecompile")


def hf_config_dict(vllm_config: Any) -> dict[str, Any]:
    """The model's config as transformers holds it (JSON-safe: dtypes become their names)."""
    return json.loads(vllm_config.model_config.hf_config.to_json_string(use_diff=False))


def attention_backends(model: Any) -> list[str]:
    """The attention backends the model's layers were built with, in order, by the names vLLM's
    registry gives their classes (what --attention-backend takes); a class the registry does not
    know by the name it gives itself."""
    from ...vllm.selector import registered_name

    names: dict[str, None] = {}
    for _, module in model.named_modules():
        backend = getattr(module, "attn_backend", None)
        get_name = getattr(backend, "get_name", None)
        if not callable(get_name):
            continue
        path = f"{backend.__module__}.{backend.__qualname__}" if isinstance(backend, type) else None
        names[(path and registered_name(path)) or str(get_name())] = None
    return list(names)


def from_vllm_config(
    vllm_config: Any, model: Any = None, target: Target | Callable[[], Target] | None = None
) -> Request:
    """The request vLLM's worker is about to serve on `target` (its GPU, or the function that
    detects it: called once the config is read, so that a config kprecompile cannot read is what
    is reported). With the built `model`, the attention backend is the one its layers use; before
    it is built, vLLM's --attention-backend or the flags'. The families are the target's: vLLM's
    CUDA rules on an NVIDIA GPU, its ROCm rules on an AMD one (and where no target is given)."""
    model_config = vllm_config.model_config
    name = str(model_config.model)
    # A local model's own code (--trust-remote-code) is beside its config; a hub model's is not planned.
    directory = name if Path(name).is_dir() else None
    config = model_from_dict(
        hf_config_dict(vllm_config), name=name, source=f"vLLM's config of {name}", directory=directory
    )
    release = installed_release()
    if model is not None:
        # The layers as this process built them, as the CLI reads them from vLLM's build.
        try:
            layers = built_layers(vllm_config)
        except Exception as error:  # a layer kprecompile cannot read: the config's reading decides
            logger.warning("kprecompile: the built model's layers were not read (%s: %s)", type(error).__name__, error)
            layers = ()
        if layers:
            source = f"vLLM {release}'s {type(model).__name__}"
            config = replace(config, attention_layers=layers, layers_source=source)
    backends = attention_backends(model) if model is not None else []
    backend = backends[0] if backends else _requested_backend(vllm_config)
    serving = serving_from_vllm(vllm_config)
    if callable(target):
        target = target()
    targets = (target,) if target is not None else ()
    # Where the layers name their backends, they decide (`selection/engines.py`).
    backend = None if config.attention_layers else backend
    selection = select(
        config,
        "vllm",
        backend,
        vllm_release=release,
        block_size=serving.block_size,
        targets=targets,
        dtype=serving.activation_dtype(config),
    )
    return Request(config, serving, selection, targets)


def _requested_backend(vllm_config: Any) -> str | None:
    """--attention-backend (kept in attention_config from 0.12 on), else None (the flags decide)."""
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if backend is None:
        return None
    return getattr(backend, "name", str(backend))
