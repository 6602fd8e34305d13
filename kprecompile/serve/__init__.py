"""The serving side: `runtime.activate` points a process at the cache, `layered_cache` serves checked
entries from read-only layers, `monitor` records what still compiles, `hook.prepare` is the call an
engine's model loader makes, and `serve.vllm` is the vLLM plugin. Imports `warmup` and below.
"""
