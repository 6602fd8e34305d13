"""`kprecompile env`: the environment fingerprint that enters every cache key, and its hash."""

from __future__ import annotations

import click

from ..inputs.environment import DEFAULT_ENGINE, ENGINES, VARIABLES, fingerprint
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
@options.json_option
def command(engine, json_output) -> None:
    """Print the environment fingerprint that enters every cache key, and its hash."""
    output = Output(json_output)
    current = fingerprint(engine=engine)
    output.document({**current.as_dict(), "hash": current.hash})
    rows = [("variable", "value", "default", "why")]
    for variable in VARIABLES:
        rows.append((variable.name, _shown(current.variables[variable.name]), _shown(variable.default), variable.why))
    for name, value in current.triton.items():
        rows.append((name, value, "-", "Triton reports it as invalidating its cache"))
    output.table(rows)
    output.data(f"hash: {current.hash}")
