"""vLLM plugin: the loader hook, installed by `pip install kprecompile` next to vLLM.

vLLM loads `vllm.general_plugins` entry points in every process it starts, before it builds a
model; `register` (in `plugin.py`) then points Triton and AITER at kprecompile's cache, starts
the JIT monitor and hooks vLLM's model loader. `request.py` reads what vLLM resolved,
`background.py` is the warm that runs beside weight loading.
"""

from __future__ import annotations

from .plugin import register

__all__ = ["register"]
