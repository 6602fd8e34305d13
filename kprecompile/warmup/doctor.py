"""What this machine can do with kprecompile, and why not where it cannot.

`kprecompile doctor` reports the toolchain (Python, torch and its build, Triton, AMD's AITER),
the GPU, the installed vLLM release, and the cache, each with a verdict: `ok`, `warn` (works,
but outside what kprecompile is tested with) or `error` (cannot work, with the fix). The
requirements in `pyproject.toml` are ranges that keep a serving image's own torch, Triton and
AITER; the exact versions kprecompile is tested with are checked here, at run time, instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Literal

from ..cache.layout import CacheLayout
from ..inputs.toolchain import INSTALL_ADVICE, aiter_version
from ..vllm.releases import TESTED_RELEASES, installed_release

Verdict = Literal["ok", "warn", "error"]

# The versions the test suite runs with; other versions in the declared ranges may work.
# Every Triton a supported vLLM release pins, and the newest (each runs the suite: CONTRIBUTING.md).
TESTED_TRITON = ("3.5", "3.6", "3.7", "3.8", "3.9")
TESTED_AITER = ("0.1.7",)


@dataclass(frozen=True)
class Check:
    name: str
    verdict: Verdict
    value: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str, parts: int = 2) -> str:
    return ".".join(version.split("+")[0].split(".")[:parts])


def run_checks(layout: CacheLayout) -> list[Check]:
    checks = [Check("python", "ok", sys.version.split()[0], sys.implementation.cache_tag)]
    checks.append(_torch())
    checks.append(_triton())
    checks.append(_aiter())
    checks.append(_gpu())
    checks.append(_driver_modules())
    checks.append(_vllm())
    checks.append(_cache(layout))
    return checks


def _torch() -> Check:
    version = _version("torch")
    if version is None:
        return Check(
            "torch", "error", "not installed", "install the torch build you serve with (CPU is enough to warm)"
        )
    import torch

    build = (
        f"ROCm {torch.version.hip}"
        if torch.version.hip
        else f"CUDA {torch.version.cuda}"
        if torch.version.cuda
        else "CPU"
    )
    return Check("torch", "ok", version, f"{build} build")


def _triton() -> Check:
    version = _version("triton") or _version("pytorch-triton-rocm")
    if version is None:
        return Check("triton", "error", "not installed", INSTALL_ADVICE["triton"])
    if _release(version) not in TESTED_TRITON:
        return Check(
            "triton",
            "warn",
            version,
            f"tested with Triton {', '.join(TESTED_TRITON)}: keys and "
            "specializations are Triton's own, but a family's call may differ",
        )
    return Check("triton", "ok", version, "cross-compiles for every target (no GPU needed)")


def _aiter() -> Check:
    version = aiter_version()
    if version is None:
        return Check("amd-aiter", "warn", "not installed", "AITER's families are not planned (pip install amd-aiter)")
    if _release(version, 3) not in TESTED_AITER:
        return Check("amd-aiter", "warn", version, f"tested with amd-aiter {', '.join(TESTED_AITER)}")
    return Check("amd-aiter", "ok", version, "AITER's Triton kernels traced without ROCm")


def _gpu() -> Check:
    try:
        import torch

        if not torch.cuda.is_available():
            return Check("gpu", "ok", "none visible", "warm cross-compiles; preload needs the GPU")
        name = torch.cuda.get_device_name(0)
        from ..inputs.targets import detect_local_target

        return Check("gpu", "ok", name, f"target {detect_local_target().name}")
    except Exception as error:  # a broken driver is a finding, not a crash
        return Check("gpu", "warn", "unknown", f"{type(error).__name__}: {error}")


def _driver_modules() -> Check:
    """Whether a bake here builds Triton's driver modules (`warmup/driver_modules.py`): Triton's
    own lookups of the HIP runtime and of libcuda, and a C compiler to build with."""
    import os
    import shutil

    found = []
    lookups = (("ROCm", "amd", "_get_path_to_hip_runtime_dylib"), ("CUDA", "nvidia", "libcuda_dirs"))
    for backend, package, name in lookups:
        try:
            getattr(importlib.import_module(f"triton.backends.{package}.driver"), name)()
            found.append(backend)
        except Exception:  # noqa: BLE001 - Triton's "not found" is a RuntimeError or an AssertionError
            continue
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if found and compiler:
        return Check("driver modules", "ok", ", ".join(found), "a bake here builds Triton's launchers for servers")
    missing = "no C compiler (CC, gcc or clang)" if found else "Triton finds neither libamdhip64.so nor libcuda.so.1"
    return Check(
        "driver modules",
        "warn",
        "not built here",
        f"{missing}: servers build Triton's launchers on their first start (bake in the serving image)",
    )


def _vllm() -> Check:
    from ..vllm.install import installed_engines

    release = installed_release()
    if release is None:
        engines = [path.name for path in installed_engines()]
        if engines:
            return Check("vllm", "ok", "engine install", f"vLLM {', '.join(engines)} (plan with --vllm-version)")
        return Check(
            "vllm",
            "warn",
            "not installed",
            "vLLM's own kernels (every GQA model's, most MLA ones') are not planned here: "
            f"kprecompile engine install vllm=={TESTED_RELEASES[-1]}, or the release you serve",
        )
    if importlib.util.find_spec("vllm") is None:
        return Check("vllm", "error", release, "its metadata is installed but the package is not importable")
    if release not in TESTED_RELEASES:
        return Check(
            "vllm", "warn", release, f"untested, followed by its line's rules (tested: {', '.join(TESTED_RELEASES)})"
        )
    return Check("vllm", "ok", release, "its selector and kernels are read from it; the plugin hooks its loader")


def _cache(layout: CacheLayout) -> Check:
    from ..cache.inventory import configurations

    if not layout.root.exists():
        return Check("cache", "ok", str(layout.root), "empty (created by the first warm)")
    found = configurations(layout)
    return Check("cache", "ok", str(layout.root), f"{len(found)} configuration{'s' if len(found) != 1 else ''}")
