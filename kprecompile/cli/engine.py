"""`kprecompile engine install | ls`: a vLLM release's Python for a builder without vLLM, kept
apart from this environment (its torch stays; the release brings the Triton its torch pins)."""

from __future__ import annotations

import click

from ..errors import InputError
from ..vllm import install as engine_install
from ..vllm.releases import TESTED_RELEASES, release_line
from . import options
from .output import Output

_ENGINES = ("vllm",)


@click.group(name="engine")
def command() -> None:
    """Install the serving engine's Python beside kprecompile, for a builder without it (install, ls)."""


def _release(requirement: str) -> str:
    """`vllm==0.12.0` -> `0.12.0`; one line naming the field otherwise."""
    name, equals, version = requirement.partition("==")
    if name.strip().lower() not in _ENGINES or not equals or not version.strip():
        expected = f"{' or '.join(_ENGINES)}==VERSION, e.g. vllm=={TESTED_RELEASES[-1]}"
        raise InputError("REQUIREMENT", requirement, expected)
    version = version.strip()
    try:
        release_line(version, "REQUIREMENT")
    except InputError as error:
        raise InputError("REQUIREMENT", requirement, error.expected) from None
    return version


@command.command(name="install")
@click.argument("requirement", metavar="REQUIREMENT")
@options.json_option
def install(requirement: str, json_output: bool) -> None:
    """Install a vLLM release's Python (no torch, no GPU libraries) with the Triton its torch pins,
    one directory per release, all or nothing; `plan`, `warm` and `bake --vllm-version VERSION`
    then trace that release's own kernels.

    \b
    Example:
      kprecompile engine install vllm==0.12.0
      kprecompile warm --model llama-3.1-8b-instruct --target gfx942 --vllm-version 0.12.0
    """
    version = _release(requirement)
    root = engine_install.engines_root()
    output = Output(json_output)
    already = engine_install.installed(version, root)
    if not already and not json_output:
        click.echo(f"kprecompile: installing vLLM {version}'s Python and its Triton into {root} (about 3 GB)", err=True)
    directory = engine_install.install(version, root)
    triton = engine_install.triton_in(directory)
    output.document(
        {"engine": "vllm", "version": version, "triton": triton, "path": str(directory), "installed": not already}
    )
    state = "already installed" if already else "installed"
    output.data(f"vLLM {version} with Triton {triton} {state} in {directory}; plan with --vllm-version {version}")


@command.command(name="ls")
@options.json_option
def ls(json_output: bool) -> None:
    """The engine releases installed here, with their Triton and size."""
    output = Output(json_output)
    rows = [
        {"engine": "vllm", "version": path.name, "triton": engine_install.triton_in(path), "path": str(path)}
        for path in engine_install.installed_engines()
    ]
    output.document({"engines": rows})
    if not rows and not json_output:
        output.data(
            f"no engine installed in {engine_install.engines_root()} (kprecompile engine install vllm==VERSION)"
        )
    output.table([[row["engine"], row["version"], f"Triton {row['triton']}", row["path"]] for row in rows])
