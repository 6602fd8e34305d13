"""`kprecompile doctor`: the toolchain, GPU, vLLM and cache, and what is usable here."""

from __future__ import annotations

import click

from ..inputs import settings
from ..warmup.doctor import run_checks
from . import options
from .examples import epilog
from .output import ExitStatus, Output


@click.command(name="doctor", epilog=epilog("doctor"))
@options.cache_dir_option
@options.json_option
def command(cache_dir, json_output) -> None:
    """Report the toolchain, GPU, vLLM release and cache, and what works here (exit 1 on an error)."""
    output = Output(json_output)
    checks = run_checks(settings.cache_layout(cache_dir))
    output.document(
        {"checks": [check.as_dict() for check in checks], "ok": all(check.verdict != "error" for check in checks)}
    )
    output.table([[check.verdict, check.name, check.value, check.detail] for check in checks])
    if any(check.verdict == "error" for check in checks):
        raise SystemExit(ExitStatus.FAILURE)
