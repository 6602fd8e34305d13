"""Helpers shared by the tests (test modules import these, never each other)."""

import contextlib
import hashlib
import importlib
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from triton import knobs

from kprecompile.cache.bundle import BUNDLE_FILE
from kprecompile.cache.signing import SIGNATURE_FILE, load_signing_key, sign
from kprecompile.errors import LaunchRefusedError
from kprecompile.inputs.models import load_model
from kprecompile.inputs.serving import ServingParams
from kprecompile.platforms.triton_driver import active_target, device_model
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.shapes import fp8_bmm
from kprecompile.tracing.trace import isolated_modules
from kprecompile.warmup.manifest_key import find_manifest

SAMPLE_MODULE = "sample_kernels"
FP8_BMM = fp8_bmm.FAMILY
# The session's baked configuration (conftest.baked): DeepSeek-V2-Lite, 3 sequences.
BAKED_MODEL = load_model("deepseek-v2-lite")
BAKED_SERVING = ServingParams(max_num_seqs=3)
# Variables that point a process at a cache, set for the session (relative to its HOME).
CACHE_VARIABLES = {
    "HOME": ".",
    "XDG_CACHE_HOME": ".cache",
    "KPRECOMPILE_CACHE_DIR": "kprecompile",
    "KPRECOMPILE_ENGINES_DIR": "engines",
    "TRITON_CACHE_DIR": "triton",
    "AITER_JIT_DIR": "aiter",
    "TRITON_HOME": ".",
}
# Variables a test may have set in the test process, unset for each test: `activate()` names its
# layers and manager (a process would serve someone else's cache), and tracing vLLM's kernels quiets
# vLLM's logging (`quiet_vllm_logging`: a server started by a later test would log nowhere it reads).
UNSET_VARIABLES = ("KPRECOMPILE_CACHE_LAYERS", "TRITON_CACHE_MANAGER", "VLLM_LOGGING_STREAM", "VLLM_LOGGING_LEVEL")


def sample_call(launcher: str, *args, **kwargs):
    """A (label, call) pair that imports the sample kernels at call time, so a trace that
    re-imports them fresh sees its own copy."""

    def call():
        return getattr(importlib.import_module(SAMPLE_MODULE), launcher)(*args, **kwargs)

    return f"{launcher}{args}", call


def fp8_bmm_shapes(m_values, model="deepseek-r1", tp=8):
    """FP8 BMM shapes of a preset, both products, for the given m values only."""
    serving = ServingParams(tensor_parallel_size=tp, max_num_seqs=max(m_values))
    return tuple(
        shape for shape in FP8_BMM.enumerate_shapes(load_model(model), serving, None) if shape.m in set(m_values)
    )


def fp8_bmm_calls(shapes, target):
    return FP8_BMM.calls(shapes, target)


def baked_manifest(layout, target):
    """The manifest of the session's baked configuration for `target` in `layout`."""
    lookup = find_manifest(
        Request(BAKED_MODEL, BAKED_SERVING, select(BAKED_MODEL, environ={})), target, layout, remember=False
    )
    assert lookup.manifest is not None, f"no baked manifest for {target.name} in {layout.root}"
    return lookup


def run_cli(capsys, *argv):
    """`kprecompile ARGV` in this process: (exit status, stdout, stderr)."""
    from kprecompile.cli import main

    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def run_cli_json(capsys, *argv):
    """`kprecompile ARGV --json`, which must succeed: its document."""
    status, out, err = run_cli(capsys, *argv, "--json")
    assert status == 0, err
    return json.loads(out)


@dataclass(frozen=True)
class CliResult:
    """What `python -m kprecompile ARGV` leaves: its exit status and its output (as
    subprocess.CompletedProcess names them)."""

    returncode: int
    stdout: str
    stderr: str


def kprecompile_cli(*argv, env: dict[str, str] | None = None) -> CliResult:
    """`python -m kprecompile ARGV` without starting a process: the CLI's entry point in this
    interpreter with `env` set in the environment, its stdout and stderr captured, and its logging
    on that stderr as a fresh process configures it (`-v`, `-vv`). `env` and the root logger are put
    back afterwards; what the command itself sets in the environment stays, as it would for the rest
    of its process (vLLM's logging defaults, set before it imports vLLM, hold for that vLLM)."""
    from kprecompile.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    saved_environment = {name: os.environ.get(name) for name in env or {}}
    saved_handlers, saved_level = root.handlers[:], root.level
    os.environ.update(env or {})
    # No handler on the root logger, as in a fresh process: the CLI's basicConfig installs its own.
    root.handlers = []
    try:
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
            pytest.raises(SystemExit) as exited,
        ):
            main([str(part) for part in argv])
    finally:
        root.handlers = saved_handlers
        root.setLevel(saved_level)
        for name, value in saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return CliResult(exited.value.code, stdout.getvalue(), stderr.getvalue())


def launch_path_keys(cache_dir, target, launch, fresh_modules):
    """The cache keys Triton's own launch path computes: compile for real, stop at launch."""
    keys = []

    def listen(*, src, metadata, metadata_group, times, cache_hit):
        keys.append(metadata["hash"])

    with (
        active_target(target),
        device_model(target),
        isolated_modules(fresh_modules),
        knobs.cache.scope(),
        knobs.compilation.scope(),
    ):
        knobs.cache.dir = str(cache_dir)
        knobs.compilation.listener = listen
        with pytest.raises(LaunchRefusedError):
            launch()
    return keys


def unpack(archive: Path) -> tuple[dict, dict[str, bytes]]:
    """bundle.json and every other file of a real archive (its signature left out)."""
    with tarfile.open(archive) as tar:
        files = {member.name: tar.extractfile(member).read() for member in tar.getmembers() if member.isfile()}
    files.pop(SIGNATURE_FILE, None)
    return json.loads(files.pop(BUNDLE_FILE)), files


def signature(index: bytes, key_path: str | os.PathLike[str] | None = None) -> bytes:
    """`bundle.sig` for these index bytes, by the key at `key_path` (default: the session's key,
    which the tests' imports trust)."""
    key = load_signing_key(key_path or os.environ["KPRECOMPILE_SIGNING_KEY"], "test key")
    return sign(key, index)


def record(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def pack(
    path: Path,
    index,
    files: dict[str, bytes],
    extra=(),
    *,
    reindex=True,
    index_bytes=None,
    mode="w:gz",
    key_path: str | os.PathLike[str] | None = None,
    signed: bool = True,
):
    """An archive of `index` and `files` (bundle.json first, its file records recomputed unless
    `reindex` is false, then its signature by the key at `key_path`, by default the session's,
    unless not `signed`), then `extra` raw members: (TarInfo, bytes or None for a header only)."""
    if reindex:
        index = {**index, "files": {name: record(data) for name, data in files.items()}}
    if signed and index_bytes is None:
        fingerprint = load_signing_key(key_path or os.environ["KPRECOMPILE_SIGNING_KEY"], "test key").fingerprint
        index = {**index, "signing_key": fingerprint}
    elif not signed and index_bytes is None:
        index = {**index, "signing_key": None}
    data = index_bytes if index_bytes is not None else json.dumps(index).encode()
    signatures = [(SIGNATURE_FILE, signature(data, key_path))] if signed else []
    with tarfile.open(path, mode, format=tarfile.GNU_FORMAT) as tar:
        for name, payload in [(BUNDLE_FILE, data), *signatures, *sorted(files.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        for info, payload in extra:
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def run_test_script(script: str, *arguments, environment=None, timeout: int = 300) -> tuple[dict, str]:
    """Run one of the tests' scripts (tests/<script>) in a fresh interpreter: the JSON of its last
    line of output, and its stderr."""
    here = Path(__file__).parent
    result = subprocess.run(
        [sys.executable, str(here / script), *map(str, arguments)],
        capture_output=True,
        text=True,
        # The tests' directory on the path after what the run has there (tests/test_tritons.py's Triton).
        env={
            **os.environ,
            **(environment or {}),
            "PYTHONPATH": os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"), str(here)))),
        },
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def serving_process(cache_dir, *arguments, strict: str = "warn") -> tuple[dict, str]:
    """Run tests/serving_process.py (a fresh serving process over `cache_dir`): its report and stderr."""
    return run_test_script("serving_process.py", cache_dir, *arguments, environment={"KPRECOMPILE_STRICT": strict})


def parse_command_line(command, name: str, words: list[str]):
    """A command's arguments parsed as the CLI parses them, without running it: its own options
    (click), then, for the commands that take a `vllm serve` line, the rest of the line against
    the table of vLLM's flags. Raises on an option neither takes."""
    from kprecompile.inputs.serve_line import read_line
    from kprecompile.vllm.serve_parser import serve_flags

    context = command.make_context(name, list(words))
    rest = context.params.get("serve_line")
    if rest:
        read_line(rest, serve_flags())
    return context
