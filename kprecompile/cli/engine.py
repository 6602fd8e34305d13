"""`kprecompile engine install | ls`: a vLLM release's Python for a builder without vLLM, kept
apart from this environment (its torch stays; the release brings the Triton its torch pins)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import click

from ..errors import InputError
from ..vllm import aiter_source
from ..vllm import install as engine_install
from ..vllm.releases import TESTED_RELEASES, release_line
from . import options
from .examples import epilog
from .output import Output

_ENGINES = ("vllm",)


@click.group(name="engine")
def command() -> None:
    """Install the serving engine's Python beside kprecompile, for a builder without it (install, ls)."""


def _release(requirement: str) -> str:
    """`vllm==0.12.0` -> `0.12.0`; one line naming the field otherwise. The version is exact
    (X.Y.Z, as `--vllm-version` and the installed metadata spell it)."""
    name, equals, version = requirement.partition("==")
    version = version.strip()
    if name.strip().lower() not in _ENGINES or not equals or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        expected = f"{' or '.join(_ENGINES)}==X.Y.Z, e.g. vllm=={TESTED_RELEASES[-1]}"
        raise InputError("REQUIREMENT", requirement, expected)
    try:
        release_line(version, "REQUIREMENT")
    except InputError as error:
        raise InputError("REQUIREMENT", requirement, error.expected) from None
    return version


@command.command(name="install", epilog=epilog("engine install"))
@click.argument("requirement", metavar="REQUIREMENT")
@click.option(
    "--aiter-source",
    "aiter_source_dir",
    type=click.Path(path_type=Path),
    default=None,
    help=f"A git clone of {aiter_source.AITER_REPOSITORY}: install from it the AITER the release's ROCm image builds.",
)
@click.option(
    "--aiter-ref",
    default=None,
    help="The AITER tag or commit to install from --aiter-source [default: the release's pin].",
)
@options.json_option
def install(requirement: str, aiter_source_dir: Path | None, aiter_ref: str | None, json_output: bool) -> None:
    """Install a vLLM release's Python (no torch, no Triton, no GPU libraries), one directory per
    release, all or nothing; `plan`, `warm` and `bake --vllm-version VERSION` then trace that
    release's own kernels, under this environment's Triton (cache keys follow it: install the
    Triton your serving image runs). With --aiter-source, the AITER its ROCm image builds (the
    commit its docker/Dockerfile.rocm_base pins) goes beside it: its Python package only, for
    planning; without, AITER's kernels are planned with this environment's AITER.

    \b
    Example:
      kprecompile engine install vllm==0.12.0
      kprecompile warm --model llama-3.1-8b-instruct --target gfx942 --vllm-version 0.12.0
      git clone https://github.com/ROCm/aiter ~/src/aiter
      kprecompile engine install vllm==0.25.1 --aiter-source ~/src/aiter
    """
    version = _release(requirement)
    pin = aiter_source.aiter_pin(version)
    if aiter_ref is not None and aiter_source_dir is None:
        raise InputError("--aiter-ref", aiter_ref, "--aiter-source too (the clone to take that commit from)")
    ref = aiter_ref or pin
    if aiter_source_dir is not None:
        if ref is None:
            raise InputError("--aiter-ref", None, f"a tag or commit: vLLM {version}'s AITER pin is not known")
        # Checked before the long install: a wrong clone or ref fails at once.
        aiter_source.resolve_commit(aiter_source_dir, ref)
    root = engine_install.engines_root()
    output = Output(json_output)
    already = engine_install.installed(version, root)
    if not already and not json_output:
        click.echo(f"kprecompile: installing vLLM {version}'s Python into {root} (a few GB)", err=True)
    directory = engine_install.install(version, root)
    if aiter_source_dir is not None and ref is not None:
        aiter = aiter_source.install_aiter(aiter_source_dir, ref, directory)
        aiter = aiter_source.AiterIdentity(aiter.version, aiter.commit, aiter.requested, pin)
    else:
        aiter = aiter_source.aiter_identity(version, directory)
    triton = _triton_under(directory)
    pinned = engine_install.pinned_triton(version)
    output.document(
        {
            "engine": "vllm",
            "version": version,
            "path": str(directory),
            "installed": not already,
            "triton": triton,
            "triton_pinned": pinned,
            "aiter": aiter.as_dict(),
        }
    )
    state = "already installed" if already else "installed"
    output.data(f"vLLM {version} {state} in {directory}; plan with --vllm-version {version}")
    if triton != pinned:
        output.data(
            f"note: vLLM {version}'s torch pins Triton {pinned}, this environment runs {triton}: "
            "keys follow this environment's Triton, so bake where the server's runs"
        )
    output.data(f"AITER: {aiter.describe(version)}")


def _triton_under(directory) -> str | None:
    """The Triton commands run under with this engine: its own where it holds one (the tests'),
    else this environment's."""
    try:
        return engine_install.triton_in(directory) or metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


@command.command(name="ls", epilog=epilog("engine ls"))
@options.json_option
def ls(json_output: bool) -> None:
    """The engine releases installed here, with their Triton and size."""
    output = Output(json_output)
    rows = [
        {"engine": "vllm", "version": path.name, "triton": _triton_under(path), "path": str(path)}
        for path in engine_install.installed_engines()
    ]
    output.document({"engines": rows})
    if not rows and not json_output:
        output.data(
            f"no engine installed in {engine_install.engines_root()} (kprecompile engine install vllm==VERSION)"
        )
    output.table([[row["engine"], row["version"], f"Triton {row['triton']}", row["path"]] for row in rows])
