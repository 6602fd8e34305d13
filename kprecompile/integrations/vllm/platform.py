"""Make the installed vLLM see a target's platform on a machine without that GPU.

vLLM decides per platform: its ROCm platform's attention-backend selector, its config defaults,
its FP8 range. To ask the real code what it would do on an MI300X from a CPU builder (or a test),
`rocm_platform(target)` imports vLLM's ROCm platform under torch device queries that describe
the target (the same stand-in the tracer uses, plus the CUDA-availability queries vLLM makes)
and makes it vLLM's current platform for the rest of the process. vLLM modules bind
`current_platform` at import: use this in a process that has not imported them yet.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ...driver import device_model
from ...errors import InputError
from ...targets import Target


@contextlib.contextmanager
def rocm_platform(target: Target) -> Iterator[Any]:
    """vLLM's ROCm platform for `target`, current for vLLM; torch's device queries describe the
    target inside the block."""
    import torch

    if not target.is_rocm:
        raise InputError("--target", target.name, "a ROCm target for vLLM's ROCm platform")
    import vllm.platforms as platforms

    major, minor = int(target.arch[3]), int(target.arch[4])
    queries = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "get_device_capability": lambda device=None: (major, minor),
        "get_device_name": lambda device=None: target.description,
    }
    saved = {name: getattr(torch.cuda, name) for name in queries}
    for name, answer in queries.items():
        setattr(torch.cuda, name, answer)
    try:
        with device_model(target):
            # The module asks the device its arch at import (and caches it): import it here.
            sys.modules.pop("vllm.platforms.rocm", None)
            from vllm.platforms.rocm import RocmPlatform

            platforms._current_platform = RocmPlatform()
            yield platforms._current_platform
    finally:
        for name, answer in saved.items():
            setattr(torch.cuda, name, answer)
