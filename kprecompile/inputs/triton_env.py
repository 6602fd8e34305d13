"""Triton's cache-invalidating variables, answered without importing Triton where libtriton already
answered for every variable that is set.

libtriton compiles in the list of variables that invalidate its cache and reports those set
(`get_cache_invalidating_env_vars`); asking it imports Triton, about 0.1 s of the 0.3 s a warm
`warm` or `verify` may take. What it answered is remembered per libtriton build (by its stat) in
the cache: the names it reported (on its list) and the names set but not reported (not on it).
When every variable set now is one or the other, the answer is the listed ones with their
values as libtriton spells them (`_as_libtriton_reports`); otherwise libtriton is asked and the
memo grows.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..cache.files import write_atomic
from ..cache.layout import CacheLayout
from .toolchain import stat_digest, triton_dir

logger = logging.getLogger(__name__)

# Names set but not on libtriton's list: a process's environment has tens; a memo of more than
# this many (every CI job naming its own variables) stops growing.
MAX_REMEMBERED_NAMES = 4096
# A memo is two lists of variable names: far below this.
MAX_MEMO_BYTES = 1 << 20


def _as_libtriton_reports(value: str) -> str:
    """A set variable's value as libtriton reports it: boolean spellings as "true" or "false"."""
    lowered = value.lower()
    if lowered in ("on", "true", "1"):
        return "true"
    if lowered in ("off", "false", "0"):
        return "false"
    return value


def _memo_path(layout: CacheLayout) -> Path:
    libtriton = sorted((triton_dir() / "_C").glob("libtriton.*"))
    return layout.toolchain_dir / f"triton-env-{stat_digest(libtriton)[:32]}.json"


def _read_memo(path: Path) -> tuple[set[str], set[str]]:
    try:
        if path.stat().st_size > MAX_MEMO_BYTES:
            return set(), set()
        document = json.loads(path.read_bytes())
        listed, unlisted = document["listed"], document["unlisted"]
        if all(isinstance(name, str) for name in [*listed, *unlisted]):
            return set(listed), set(unlisted)
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        pass
    return set(), set()


def remembered_triton_values(layout: CacheLayout, remember: bool = True) -> dict[str, str]:
    """What `get_cache_invalidating_env_vars()` returns in this process, from the memo when it
    knows every variable set now, else from libtriton (then remembered, with `remember`)."""
    path = _memo_path(layout)
    listed, unlisted = _read_memo(path)
    set_now = {name for name, value in os.environ.items() if value}
    if set_now <= listed | unlisted:
        return {name: _as_libtriton_reports(os.environ[name]) for name in sorted(set_now & listed)}
    from triton._C.libtriton import get_cache_invalidating_env_vars

    answer = dict(sorted(get_cache_invalidating_env_vars().items()))
    if remember:
        listed |= set(answer)
        unlisted |= set_now - set(answer)
        if len(unlisted) <= MAX_REMEMBERED_NAMES:
            try:
                write_atomic(path, json.dumps({"listed": sorted(listed), "unlisted": sorted(unlisted)}).encode())
            except OSError as error:  # a read-only cache: asked again next time
                logger.debug("cannot remember Triton's variables at %s: %s", path, error)
    return answer
