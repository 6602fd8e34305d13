"""kprecompile's own environment variables, each read by one typed reader.

Like Triton's knobs: a variable unset (or empty) means its default; a malformed value is an
input error naming the variable, the value and what was expected. The engine's flags
(`VLLM_*`, AITER's) are not settings but part of the cache key: see `environment.py`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, TypeVar, get_args

from ..cache.layout import CacheLayout
from ..cache.trust import check_layout
from ..errors import InputError

T = TypeVar("T")

StrictMode = Literal["off", "warn", "error"]
STRICT_MODES: tuple[StrictMode, ...] = get_args(StrictMode)
WorkerStart = Literal["forkserver", "spawn"]
WORKER_STARTS: tuple[WorkerStart, ...] = get_args(WorkerStart)
_APP_NAME = "kprecompile"


@dataclass(frozen=True)
class Setting(Generic[T]):
    name: str
    # What a value must look like, for the error message.
    expected: str
    parse: Callable[[str], T]
    default: Callable[[], T]
    why: str

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        raw = (os.environ if environ is None else environ).get(self.name, "")
        if not raw.strip():
            return self.default()
        try:
            return self.parse(raw)
        except ValueError:
            raise InputError(self.name, raw, self.expected) from None


def _positive_seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError(raw)
    return value


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(raw)
    return value


def _strict_mode(raw: str) -> StrictMode:
    mode = raw.strip().lower()
    if mode not in STRICT_MODES:
        raise ValueError(raw)
    return mode  # type: ignore[return-value]


def _worker_start(raw: str) -> WorkerStart:
    method = raw.strip().lower()
    if method not in WORKER_STARTS:
        raise ValueError(raw)
    return method  # type: ignore[return-value]


def _switch(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _paths(raw: str) -> tuple[Path, ...]:
    return tuple(Path(part).expanduser() for part in raw.split(os.pathsep) if part)


def _user_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir(_APP_NAME, appauthor=False))


def _user_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir(_APP_NAME, appauthor=False))


CACHE_DIR = Setting(
    "KPRECOMPILE_CACHE_DIR",
    "a directory path",
    lambda raw: Path(raw).expanduser(),
    _user_cache_dir,
    "the writable cache root (--cache-dir wins)",
)
ENGINES_DIR = Setting(
    "KPRECOMPILE_ENGINES_DIR",
    "a directory path",
    lambda raw: Path(raw).expanduser(),
    lambda: _user_data_dir() / "engines",
    "where `kprecompile engine install` puts engine releases (vLLM's Python)",
)
CACHE_LAYERS = Setting(
    "KPRECOMPILE_CACHE_LAYERS",
    f"directory paths separated by {os.pathsep!r}",
    _paths,
    tuple,
    "read-only baked caches searched after the writable one",
)
LOCK_TIMEOUT = Setting(
    "KPRECOMPILE_LOCK_TIMEOUT",
    "a positive number of seconds",
    _positive_seconds,
    lambda: 1800.0,
    "how long to wait for another process compiling the same kernel",
)
STRICT = Setting(
    "KPRECOMPILE_STRICT",
    "one of " + ", ".join(STRICT_MODES),
    _strict_mode,
    lambda: "warn",
    "what the JIT monitor does when a kernel compiles while serving",
)
VLLM_HOOK = Setting(
    "KPRECOMPILE_VLLM_HOOK",
    "1 or 0 (true or false)",
    _switch,
    lambda: True,
    "whether the vLLM plugin installs the loader hook",
)
WORKER_START = Setting(
    "KPRECOMPILE_WORKER_START",
    "one of " + ", ".join(WORKER_STARTS),
    _worker_start,
    lambda: "forkserver",
    "how compile workers start: forked from one process that imported torch and Triton, or each spawned",
)
TRACE_WORKERS = Setting(
    "KPRECOMPILE_TRACE_WORKERS",
    "a positive whole number",
    _positive_int,
    lambda: len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
    "processes a family's trace is split over once its modules are imported (1: traced in one)",
)
SIGNING_KEY = Setting(
    "KPRECOMPILE_SIGNING_KEY",
    "a private key file path",
    lambda raw: Path(raw).expanduser(),
    lambda: None,
    "the ed25519 private key `export` and `bake --archive` sign archives with (--signing-key wins)",
)
TRUSTED_KEYS = Setting(
    "KPRECOMPILE_TRUSTED_KEYS",
    f"public key files or ssh-ed25519 key lines separated by {os.pathsep!r}",
    lambda raw: tuple(part.strip() for part in raw.split(os.pathsep) if part.strip()),
    tuple,
    "the public keys whose signed archives `import` accepts (with each --trusted-key)",
)

SETTINGS: tuple[Setting, ...] = (
    CACHE_DIR,
    CACHE_LAYERS,
    ENGINES_DIR,
    LOCK_TIMEOUT,
    SIGNING_KEY,
    STRICT,
    TRACE_WORKERS,
    TRUSTED_KEYS,
    VLLM_HOOK,
    WORKER_START,
)


def cache_layout(
    cache_dir: str | os.PathLike[str] | None = None, layers: tuple[str | os.PathLike[str], ...] | None = None
) -> CacheLayout:
    """The cache: `cache_dir` (else $KPRECOMPILE_CACHE_DIR, else the user cache directory) over
    `layers` (else $KPRECOMPILE_CACHE_LAYERS); refused if other users could write what servers
    load from it (`cache.trust`)."""
    root = CACHE_DIR.read() if cache_dir is None else cache_dir
    layout = CacheLayout.of(root, CACHE_LAYERS.read() if layers is None else layers)
    check_layout(layout)
    return layout
