"""Capturing the exact kernel specializations a library's real calls would compile.

`libraries` imports kernel libraries (AITER, vLLM) on machines they were not built for; `trace`
runs calls on meta tensors under the target's driver and turns each launch Triton would compile
into a compile job. Imports `platforms`, `inputs` and below.
"""
