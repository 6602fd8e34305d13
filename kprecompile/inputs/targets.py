"""GPU targets kprecompile can compile for, and detection of the local one.

A target is what Triton's `GPUTarget` needs (backend, arch, warp size) plus the facts a shape
needs from it, such as which FP8 format the hardware uses. Cross-compiling needs no GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import InputError

if TYPE_CHECKING:
    import torch
    from triton.backends.compiler import GPUTarget

AUTO = "auto"


@dataclass(frozen=True)
class Target:
    name: str
    backend: Literal["hip", "cuda"]
    arch: str | int
    warp_size: int
    # Name of the torch dtype the hardware's FP8 uses, or None where it has no FP8.
    fp8_dtype_name: str | None
    description: str
    # Compute units (AMD) or SMs (NVIDIA) of the target's flagship part. Kernel wrappers size
    # grids and pick kernel variants by it, so tracing must report the serving GPU's count.
    compute_units: int

    def gpu_target(self) -> GPUTarget:
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)

    @property
    def fp8_dtype(self) -> torch.dtype | None:
        import torch

        return getattr(torch, self.fp8_dtype_name) if self.fp8_dtype_name else None

    @property
    def is_rocm(self) -> bool:
        return self.backend == "hip"


TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target("gfx90a", "hip", "gfx90a", 64, None, "AMD Instinct MI250X", 110),
        Target("gfx942", "hip", "gfx942", 64, "float8_e4m3fnuz", "AMD Instinct MI300X / MI325X", 304),
        Target("gfx950", "hip", "gfx950", 64, "float8_e4m3fn", "AMD Instinct MI350X / MI355X", 256),
        Target("sm80", "cuda", 80, 32, None, "NVIDIA A100", 108),
        Target("sm89", "cuda", 89, 32, "float8_e4m3fn", "NVIDIA L40S", 142),
        Target("sm90", "cuda", 90, 32, "float8_e4m3fn", "NVIDIA H100 / H200", 132),
        Target("sm100", "cuda", 100, 32, "float8_e4m3fn", "NVIDIA B200", 148),
    )
}


# The products users name, for the target each one is.
PRODUCTS = {
    "mi210": "gfx90a",
    "mi250": "gfx90a",
    "mi250x": "gfx90a",
    "mi300a": "gfx942",
    "mi300x": "gfx942",
    "mi325x": "gfx942",
    "mi350x": "gfx950",
    "mi355x": "gfx950",
    "a100": "sm80",
    "l40s": "sm89",
    "l4": "sm89",
    "h100": "sm90",
    "h200": "sm90",
    "h20": "sm90",
    "b200": "sm100",
    "gb200": "sm100",
}


def _expected_targets() -> str:
    return "one of " + ", ".join(TARGETS) + f", a product ({', '.join(PRODUCTS)}), or {AUTO}"


def resolve_target(name: str, field: str = "--target") -> Target:
    """Turn a target name, a product name (mi300x, h200) or `auto` into a Target, any case;
    unknown names are an input error."""
    key = name.strip().lower()
    if key == AUTO:
        return detect_local_target(field)
    key = PRODUCTS.get(key, key)
    try:
        return TARGETS[key]
    except KeyError:
        raise InputError(field, name, _expected_targets()) from None


# Device nodes a GPU driver creates, and the variables that hide its GPUs when set empty (HIP
# honors CUDA's too; CUDA ignores HIP's).
_DEVICE_NODES = {"cuda": "/dev/nvidiactl", "hip": "/dev/kfd"}
_HIDING = {
    "cuda": ("CUDA_VISIBLE_DEVICES",),
    "hip": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
}


def gpu_may_be_visible(backend: str) -> bool:
    """Whether this process may see a GPU of `backend`'s kind ("cuda" or "hip"): its driver's
    device node exists and no variable of that vendor's hides it. Asks nothing of torch, so that
    a CPU builder never pays for importing it to learn "no"."""
    if any(os.environ.get(variable) == "" for variable in _HIDING[backend]):
        return False
    return os.path.exists(_DEVICE_NODES[backend])


def detect_local_target(field: str = "--target") -> Target:
    """The target of this process's first visible GPU."""
    import torch

    if not torch.cuda.is_available():
        raise InputError(
            field,
            AUTO,
            "a visible GPU for auto-detection; none is visible to this process "
            "(name a target instead: " + ", ".join(TARGETS) + ")",
        )
    if torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        name = arch
    else:
        major, minor = torch.cuda.get_device_capability(0)
        name = f"sm{major}{minor}"
    if name not in TARGETS:
        raise InputError(field, f"{AUTO} (detected {name})", _expected_targets())
    return TARGETS[name]
