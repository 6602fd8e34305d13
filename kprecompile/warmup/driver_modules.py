"""Triton's driver modules, built into the cache with Triton's own code so that a server's first
start runs no C compiler.

Before a process launches its first kernel, Triton builds small host modules with gcc: its driver
utilities (`hip_utils`, `cuda_utils`) and, up to Triton 3.6, one launcher per kernel signature.
It keeps them in its cache under a key of their C source (which names the HIP runtime's path on
ROCm, the libcuda directory in Triton 3.8's key on CUDA), so a new container pays them again:
about 0.25 s each on the H200 host. Here Triton's own utility and launcher classes build them
on this machine (no GPU needed), through a cache manager that records every module Triton
writes or finds, and stops Triton before it loads one (loading one runs the GPU driver's code). The
manifest records each module's size and sha256 like a kernel's files, so a server serves them
from a read-only layer, checked (`serve/layered_cache.py`).

What Triton needs to build them is what it needs on the server: the HIP runtime library
(`libamdhip64.so`, in a ROCm image or torch's ROCm wheel) or `libcuda.so.1`. A builder without
it bakes no modules and says why; the server then builds them on its first start, as before.
"""

from __future__ import annotations

import functools
import logging
import os
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cache.entries import group_file
from ..cache.files import sha256_file
from ..cache.inventory import recorded_driver_modules
from ..cache.layout import CacheLayout, entry_key
from ..cache.manifest import Manifest
from ..inputs.targets import Target

logger = logging.getLogger(__name__)

# Per backend: Triton's backend package, its utility class and its launcher class (the same
# names in Triton 3.5 to 3.9).
_CLASSES = {"hip": ("amd", "HIPUtils", "HIPLauncher"), "cuda": ("nvidia", "CudaUtils", "CudaLauncher")}


@dataclass(frozen=True)
class DriverModules:
    # {Triton cache key: {file name: {"sha256", "size"}}}: what the manifest records.
    records: dict[str, dict[str, dict[str, Any]]]
    # Why none were built ("" when they were): what Triton said on this machine.
    missing: str = ""


class _Built(Exception):
    """Raised into Triton where it would load a module this bake has: nothing to load here."""


def bake_driver_modules(manifest: Manifest, layout: CacheLayout, target: Target) -> DriverModules:
    """Build (or find) the driver modules a server of `manifest`'s configuration on `target`
    loads, in the writable root's Triton directory; their records for the manifest."""
    from triton import knobs

    started = time.perf_counter()
    module = _driver_module(target)
    _, utils_name, launcher_name = _CLASSES[target.backend]
    seen: dict[tuple[str, str], str] = {}
    with knobs.cache.scope():
        knobs.cache.dir = str(layout.triton_dir)
        # Read only where a module is found already (not on a builder that builds none).
        known = functools.cache(lambda: recorded_driver_modules(layout.root))
        knobs.cache.manager_class = _recording_manager(seen, known)
        problem = _build(_fresh, getattr(module, utils_name))
        if problem:
            # Info: the warm's report carries it, and `warm` and `bake` print it as one line.
            logger.info(
                "Triton's driver modules for %s not built on this machine (%s): a server builds them on "
                "its first start",
                target.name,
                problem,
            )
            return DriverModules({}, problem)
        _build_launchers(getattr(module, launcher_name), manifest, layout, target)
    records: dict[str, dict[str, dict[str, Any]]] = {}
    for (entry_name, file_name), path in sorted(seen.items()):
        key = entry_key(entry_name)
        if key is not None:
            records.setdefault(key, {})[file_name] = {"sha256": sha256_file(path), "size": os.path.getsize(path)}
    seconds = time.perf_counter() - started
    logger.info("%d of Triton's driver modules for %s in the cache in %.2f s", len(seen), target.name, seconds)
    return DriverModules(records)


def _driver_module(target: Target) -> Any:
    import importlib

    package = _CLASSES[target.backend][0]
    return importlib.import_module(f"triton.backends.{package}.driver")


def _fresh(cls: type) -> Any:
    """Instantiate Triton's utility class for its build, leaving its singleton as it was."""
    had = "instance" in vars(cls)
    try:
        return cls()
    finally:
        if not had and "instance" in vars(cls):
            delattr(cls, "instance")


def _build(construct, *arguments: Any) -> str:
    """Run one of Triton's constructors; "" when it built or found a module, else what it said."""
    try:
        construct(*arguments)
    except _Built:
        return ""
    except Exception as error:  # noqa: BLE001 - Triton's own words are the report
        return _said(error)
    return "it built no module"


def _said(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _build_launchers(launcher_cls: type, manifest: Manifest, layout: CacheLayout, target: Target) -> None:
    """One launcher per kernel signature where Triton builds them (3.5 and 3.6): the first
    kernel tells; where its launcher builds no module (Triton 3.7 on), none is built. Kernels
    are loaded from the writable root (what a bake compiled); one a read-only layer holds is left
    to the server."""
    from ..platforms.triton_driver import active_target
    from ..tracing.libraries import resolve_kernel
    from .preload import load_order

    failed, probed = [], False
    for job in load_order(manifest.jobs):
        if group_file(layout.triton_entry(job.key)) is None:
            continue
        try:
            with active_target(target):
                compiled = _loaded_and_forgotten(resolve_kernel(job.kernel), job.specialization)
        except Exception as error:  # noqa: BLE001 - one kernel never stops the others
            failed.append(f"{job.kernel}: {_said(error)}")
            continue
        with active_target(target):  # a launcher that asks the driver (3.7 on) asks this one, never a GPU's
            problem = _build(launcher_cls, compiled.src, compiled.metadata)
        if not probed and problem:
            # Triton builds no launcher per kernel (3.7 on: one launch function in its utilities).
            logger.debug("no launcher module per kernel: %s", problem)
            return
        probed = True
        if problem:
            failed.append(f"{job.kernel}: {problem}")
    if failed:
        logger.warning("%d kernels' launchers not built, the first: %s", len(failed), failed[0])


def _loaded_and_forgotten(kernel: Any, specialization: str) -> Any:
    """The compiled kernel Triton loads for `specialization`, left out of the kernel's in-memory
    cache (a later preload in this process loads it as a server would)."""
    from triton.runtime.driver import driver

    cache = kernel.device_caches[driver.active.get_current_device()][0]
    before = set(cache)
    try:
        return kernel.preload(specialization)
    finally:
        for key in set(cache) - before:
            del cache[key]


def _module_suffix() -> str:
    return str(sysconfig.get_config_var("EXT_SUFFIX"))


def _recording_manager(seen: dict[tuple[str, str], str], known: Callable[[], dict[tuple[str, str], set[str]]]) -> type:
    """Triton's own cache manager over the writable root, recording the modules Triton builds or
    finds there (by entry and file name; one found only as `known()` records it, where it does),
    each once, and stopping Triton before it loads one."""
    from triton.runtime.cache import FileCacheManager

    suffix = _module_suffix()

    class RecordingCacheManager(FileCacheManager):
        def get_file(self, filename: str) -> str | None:
            if not filename.endswith(suffix):
                return super().get_file(filename)
            if (self.key, filename) in seen:
                raise _Built(filename)
            # One this host's Triton (or an earlier bake, or an import) put in the writable cache is
            # kept and recorded: their builds are not reproducible (gcc writes the temporary
            # source's path into them), so building anew would break every other manifest that
            # records it. Unless manifests record other bytes for it: damage, built anew.
            path = os.path.join(self.cache_dir, filename)
            if os.path.isfile(path) and not os.path.islink(path):
                recorded = known().get((str(entry_key(self.key)), filename))
                if recorded is None or sha256_file(path) in recorded:
                    seen[(self.key, filename)] = path
                    raise _Built(filename)
                logger.warning("Triton's driver module %s is not as recorded: building it again", path)
            return None

        def put(self, data, filename: str, binary: bool = True) -> str:
            path = super().put(data, filename, binary)
            if filename.endswith(suffix):
                seen[(self.key, filename)] = path
                raise _Built(filename)
            return path

    return RecordingCacheManager
