"""The serving side: point a process at the cache, and say where it records what still compiles.

`activate` makes Triton (and AITER's JIT builds) use kprecompile's cache. It must run before the
first kernel compiles (for AITER's JIT directory, before `import aiter`); calling it again, or
from every rank, changes nothing. Loading the planned kernels is `warmup/preload.py`; the JIT
monitor that watches what still compiles afterwards is `monitor.py`.
"""

from __future__ import annotations

import contextlib
import logging
import os

from ..cache.layout import CacheLayout
from ..cache.trust import make_writable_root
from ..inputs import settings
from ..inputs.targets import Target
from ..selection.request import Request
from ..warmup.manifest_key import find_manifest
from .monitor import JournalSink

logger = logging.getLogger(__name__)


def activate(
    cache_dir: str | os.PathLike[str] | None = None, layers: tuple[str | os.PathLike[str], ...] | None = None
) -> CacheLayout:
    """Point this process (and the processes it starts) at the cache; returns its layout.

    `layers` (default $KPRECOMPILE_CACHE_LAYERS) are read-only baked caches searched after the
    writable one, through kprecompile's layered Triton cache manager; nothing is written there.
    """
    from triton import knobs

    from .layered_cache import LayeredCacheManager

    layout = settings.cache_layout(cache_dir, layers)
    triton_dir = str(layout.triton_dir)
    manager = f"{LayeredCacheManager.__module__}:{LayeredCacheManager.__name__}"
    # kprecompile's manager, layers or not: entries found by name beside their group file, and
    # served only as a manifest recorded them (`layered_cache.py`). A user's own setting is replaced
    # out loud: the server would otherwise compile into, and load from, a cache nobody checks.
    replaced = [
        f"{name}={os.environ[name]}"
        for name, ours in (("TRITON_CACHE_DIR", triton_dir), ("TRITON_CACHE_MANAGER", manager))
        if os.environ.get(name, ours) != ours
    ]
    if replaced:
        logger.warning(
            "kprecompile: replacing %s: Triton's kernels come from %s, each checked against its manifest",
            " and ".join(replaced),
            layout.root,
        )
    with contextlib.suppress(OSError):  # a server that cannot write there still serves its layers
        make_writable_root(layout)
    os.environ["TRITON_CACHE_DIR"] = triton_dir
    knobs.cache.dir = triton_dir
    os.environ[settings.CACHE_LAYERS.name] = os.pathsep.join(str(layer) for layer in layout.layers)
    os.environ["TRITON_CACHE_MANAGER"] = manager
    knobs.cache.manager_class = LayeredCacheManager
    aiter_dir = str(layout.aiter_jit_dir)
    if os.environ.get("AITER_JIT_DIR", aiter_dir) != aiter_dir:
        logger.info("AITER_JIT_DIR is set to %s: AITER's JIT builds stay there", os.environ["AITER_JIT_DIR"])
    else:
        os.environ["AITER_JIT_DIR"] = aiter_dir
    return layout


def journal_sink(request: Request, layout: CacheLayout, target: Target) -> JournalSink:
    """Where this process records what it compiles while serving this configuration (pass it to
    `JitMonitor.record_to`): the configuration's journal, which the next warm compiles."""
    lookup = find_manifest(request, target, layout, remember=False)
    return JournalSink(layout, lookup.journal_key, target.name, lookup.toolchain_digest, lookup.key, request.model.name)
