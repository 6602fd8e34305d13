"""`kprecompile env`: the environment fingerprint that enters every cache key, and its hash."""

from __future__ import annotations

import click

from ..inputs.environment import DEFAULT_ENGINE, ENGINES, VARIABLES, fingerprint
from ..inputs.flag_defaults import release_defaults
from ..vllm.releases import DEFAULT_RELEASE, resolve_release
from . import options
from .examples import epilog
from .output import Output


def _shown(value: str | None) -> str:
    return "(unset)" if value is None else value


@click.command(name="env", epilog=epilog("env"))
@click.option(
    "--engine",
    default=DEFAULT_ENGINE,
    show_default=True,
    help=f"Engine profile whose defaults apply to unset variables ({', '.join(ENGINES)}).",
)
@click.option(
    "--vllm-version",
    default=None,
    metavar="VERSION",
    help="The vLLM release whose defaults unset flags take "
    f"[default: the installed vLLM's, else {DEFAULT_RELEASE}; none with --engine aiter].",
)
@options.json_option
def command(engine, vllm_version, json_output) -> None:
    """Print the environment fingerprint that enters every cache key, and its hash."""
    output = Output(json_output)
    release = None if engine == "aiter" else resolve_release(vllm_version)
    current = fingerprint(engine=engine, release=release)
    output.document({**current.as_dict(), "vllm_release": release, "hash": current.hash})
    defaults = release_defaults(release) if release else {}
    rows = [("variable", "value", "default", "why")]
    for variable in VARIABLES:
        default = defaults.get(variable.name, variable.default)
        rows.append((variable.name, _shown(current.variables[variable.name]), _shown(default), variable.why))
    for name, value in current.triton.items():
        rows.append((name, value, "-", "Triton reports it as invalidating its cache"))
    output.table(rows)
    output.data(f"hash: {current.hash}")
