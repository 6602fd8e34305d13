"""The `kprecompile` command: each subcommand calls one library function and renders its result.

Exit statuses: 0 success, 1 the command ran and something failed (a kernel did not compile),
2 a usage or input error. Data goes to stdout; progress, status and warnings to stderr.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import click

from . import __version__
from .errors import InputError, KprecompileError


class ExitStatus(enum.IntEnum):
    SUCCESS = 0
    FAILURE = 1
    USAGE = 2


def _selection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every command that selects a configuration."""
    options = [
        click.option(
            "--model",
            "model_spec",
            required=True,
            metavar="MODEL",
            help="Preset name, path to a config.json, or a directory holding one.",
        ),
        click.option(
            "--tp",
            "tensor_parallel_size",
            type=int,
            default=1,
            show_default=True,
            help="Tensor-parallel size: attention heads are split across this many ranks.",
        ),
        click.option(
            "--target",
            "target_names",
            multiple=True,
            default=("auto",),
            show_default=True,
            metavar="TARGET",
            help="GPU to compile for (gfx942, gfx950, sm90, ...) or auto; repeatable.",
        ),
        click.option(
            "--max-batch",
            "max_batch_size",
            type=int,
            default=1024,
            show_default=True,
            help="Largest decode batch the FP8 BMM is planned for.",
        ),
        click.option("--json", "json_output", is_flag=True, help="Print one JSON document."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _select(model_spec: str, tensor_parallel_size: int, target_names: tuple[str, ...], max_batch_size: int):
    from .models import load_model
    from .serving import ServingParams
    from .targets import resolve_target

    serving = ServingParams(tensor_parallel_size=tensor_parallel_size, max_batch_size=max_batch_size)
    targets = []
    for name in target_names:
        target = resolve_target(name)
        if target not in targets:
            targets.append(target)
    return load_model(model_spec), serving, targets


def _emit_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=2, sort_keys=False))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kprecompile")
@click.option("-v", "--verbose", count=True, help="-v for progress details, -vv for debugging.")
def cli(verbose: int) -> None:
    """Precompile the Triton and AITER kernels an LLM serving engine will JIT-compile."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


@cli.command()
@_selection_options
def plan(model_spec, tensor_parallel_size, target_names, max_batch_size, json_output) -> None:
    """Show each kernel family, the calls enumerated and the unique kernels, without compiling."""
    from .planning import plan as make_plan

    model, serving, targets = _select(model_spec, tensor_parallel_size, target_names, max_batch_size)
    result = make_plan(model, serving, targets)
    if json_output:
        _emit_json(result.summary())
        return
    click.echo(f"model {result.model}: tp {serving.tensor_parallel_size}, max batch {serving.max_batch_size}")
    _echo_families(result.families)
    click.echo(f"total: {result.kernels} unique kernels, traced in {result.trace_seconds:.2f} s")


def _echo_families(families) -> None:
    if not families:
        click.echo("no kernel family applies to this model")
        return
    rows = [("family", "target", "calls", "kernels", "shape parameters")]
    for family in families:
        parameters = ", ".join(f"{name} {value}" for name, value in family.parameters.items())
        kernels = str(family.kernels) if family.skipped is None else f"skipped: {family.skipped}"
        rows.append((family.name, family.target, str(family.calls), kernels, parameters))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4])


@cli.command()
@_selection_options
@click.option(
    "--jobs",
    "max_workers",
    type=int,
    default=None,
    help="Compile worker processes [default: the CPUs this process may use].",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Cache root [default: $KPRECOMPILE_CACHE_DIR or the user cache directory].",
)
@click.option(
    "--job-timeout",
    "job_timeout_seconds",
    type=float,
    default=900.0,
    show_default=True,
    help="Seconds one kernel may take to compile before it counts as failed.",
)
def warm(
    model_spec,
    tensor_parallel_size,
    target_names,
    max_batch_size,
    json_output,
    max_workers,
    cache_dir,
    job_timeout_seconds,
) -> None:
    """Compile every planned kernel that is not cached yet, in parallel, and record the result."""
    from .cache.layout import CacheLayout
    from .warming import warm as run_warm

    if max_workers is not None and max_workers <= 0:
        raise InputError("--jobs", max_workers, "a positive integer")
    if job_timeout_seconds <= 0:
        raise InputError("--job-timeout", job_timeout_seconds, "a positive number of seconds")
    model, serving, targets = _select(model_spec, tensor_parallel_size, target_names, max_batch_size)
    report = run_warm(
        model,
        serving,
        targets,
        CacheLayout.at(cache_dir),
        max_workers=max_workers,
        job_timeout_seconds=job_timeout_seconds,
        progress=sys.stderr.isatty() and not json_output,
    )
    if json_output:
        _emit_json(report.as_dict())
    else:
        _echo_families(report.families)
        for failure in report.failures:
            click.echo(f"failed: {failure.kernel} [{failure.specialization}] on {failure.target}: {failure.error}")
        click.echo(
            f"{report.kernels} kernels: {report.compiled} compiled, {report.cached} already cached, "
            f"{report.failed} failed in {report.seconds:.1f} s"
        )
        click.echo(f"cache: {report.cache_dir}")
    if report.failed:
        raise SystemExit(ExitStatus.FAILURE)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, no traceback for a user mistake."""
    try:
        status = cli.main(args=argv, prog_name="kprecompile", standalone_mode=False)
    except click.exceptions.Exit as exit_:
        status = exit_.exit_code
    except click.exceptions.Abort:
        click.echo("kprecompile: aborted", err=True)
        status = ExitStatus.FAILURE
    except click.ClickException as error:
        click.echo(f"kprecompile: {error.format_message()}", err=True)
        status = ExitStatus.USAGE
    except InputError as error:
        click.echo(f"kprecompile: {error}", err=True)
        status = ExitStatus.USAGE
    except KprecompileError as error:
        click.echo(f"kprecompile: {error}", err=True)
        status = ExitStatus.FAILURE
    sys.exit(status if isinstance(status, int) else ExitStatus.SUCCESS)
