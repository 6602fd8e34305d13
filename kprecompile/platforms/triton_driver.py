"""A Triton driver that reports a chosen target and never touches a GPU.

Triton asks its active driver for the current target when it builds a kernel's binder and
when it compiles. Making this driver active lets the library's real Python wrappers run on
meta tensors as if on that GPU (they pick the same tuned configs), and lets `preload` compile
for that GPU on a machine without one (docs/design.md, facts 1, 2, 5).

Wrappers also ask torch about the device (`torch.cuda.get_device_properties(...)
.multi_processor_count`) to size grids and choose kernel variants; `device_model` answers those
questions with the target's figures while tracing, on a machine with no GPU or another GPU.

Each target gets its own device index: `JITFunction.device_caches` is keyed by device index
and remembers the target of the first driver it saw (docs/design.md, fact 12), so two targets must
never share one. Indices start far above any real device ordinal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace

from ..errors import LaunchRefusedError
from ..inputs.targets import TARGETS, Target

_FIRST_DEVICE_INDEX = 1000


def device_index(target: Target) -> int:
    return _FIRST_DEVICE_INDEX + list(TARGETS).index(target.name)


def _make_driver_class():
    from triton.backends.driver import DriverBase

    class CrossCompileDriver(DriverBase):
        def __init__(self, target: Target):
            self.target = target
            self.device = device_index(target)
            self._gpu_target = target.gpu_target()

        @classmethod
        def is_active(cls) -> bool:
            return False

        def get_current_target(self):
            return self._gpu_target

        def get_current_device(self) -> int:
            return self.device

        def set_current_device(self, device: int) -> None:
            if device != self.device:
                raise LaunchRefusedError(self.target.name, f"device {device} was asked for")

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_active_torch_device(self):
            import torch

            return torch.device("meta")

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise LaunchRefusedError(self.target.name, "a launcher was to be built")

        def get_benchmarker(self):
            # Autotuners benchmark every config: run each once so that every config's compile
            # is seen, and report equal timings so that the first config wins.
            def run_once(kernel_call, quantiles=None, **_: object):
                kernel_call()
                return [0.0, 0.0, 0.0] if quantiles else 0.0

            return run_once

        def get_empty_cache_for_benchmark(self):
            import torch

            return torch.empty(0, device="meta")

        def clear_cache(self, cache) -> None:
            pass

        @property
        def launcher_cls(self):
            raise LaunchRefusedError(self.target.name, "a kernel reached launch")

        @property
        def utils(self):
            raise LaunchRefusedError(self.target.name, "a kernel reached launch")

    return CrossCompileDriver


_driver_class = None


def cross_compile_driver(target: Target):
    global _driver_class
    if _driver_class is None:
        _driver_class = _make_driver_class()
    return _driver_class(target)


@contextlib.contextmanager
def active_target(target: Target) -> Iterator[None]:
    """Make Triton see `target` as the current GPU for the duration of the block."""
    from triton.runtime import driver

    previous = driver._active
    driver.set_active(cross_compile_driver(target))
    try:
        yield
    finally:
        driver._active = previous


def cross_compile_target() -> Target | None:
    """The target the cross-compile driver reports, or None where it is not active (a serving
    process on its own GPU)."""
    from triton.runtime import driver

    active = driver._active
    if _driver_class is None or not isinstance(active, _driver_class):
        return None
    return active.target


def device_properties(target: Target) -> SimpleNamespace:
    """What `torch.cuda.get_device_properties` reports on the target's GPU, as far as wrappers read it."""
    # gfx942 -> 9.4, as torch reports it on ROCm; sm90 -> 9.0.
    major, minor = (int(target.arch[3]), int(target.arch[4])) if target.is_rocm else divmod(int(target.arch), 10)
    return SimpleNamespace(
        name=target.description,
        gcnArchName=str(target.arch) if target.is_rocm else "",
        multi_processor_count=target.compute_units,
        warp_size=target.warp_size,
        major=major,
        minor=minor,
    )


def meta_allocations():
    """A torch function mode that puts tensors a wrapper allocates on the GPU on the meta device.

    For wrappers that allocate with an explicit `device="cuda"`; it costs every torch call in
    its scope a Python dispatch, so families enter it only around such wrappers.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    class MetaAllocations(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda":
                kwargs = {**kwargs, "device": "meta"}
            return func(*args, **kwargs)

    return MetaAllocations()


@contextlib.contextmanager
def device_model(target: Target) -> Iterator[None]:
    """Make torch's device queries describe `target` for the duration of the block (tracing only)."""
    import torch

    properties = device_properties(target)
    index = device_index(target)
    saved = torch.cuda.current_device, torch.cuda.get_device_properties
    torch.cuda.current_device = lambda: index
    torch.cuda.get_device_properties = lambda device=None: properties
    try:
        yield
    finally:
        torch.cuda.current_device, torch.cuda.get_device_properties = saved
