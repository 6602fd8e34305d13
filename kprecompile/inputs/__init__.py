"""What a user asked for, checked before any work: the model, the serving parameters, the targets,
the environment's flags, kprecompile's own settings, and the installed toolchain.

`models` (presets, config.json, Hugging Face ids), `serving` (a `vllm serve` line's kernel-deciding
settings), `targets` (GPU archs), `environment` (the flags that change which kernels run),
`settings` (kprecompile's own variables), `toolchain` (what must match for binaries to be served).
Imports only `errors` and `cache`.
"""
