"""vLLM as a kernel source, used while planning: its releases and their rules, its own
configuration for a model (`engine_config`), and its own attention-backend selector (`selector`).

vLLM as the serving host (the plugin inside a running server) is `serve.vllm`. Imports `tracing`,
`platforms`, `inputs` and below.
"""
