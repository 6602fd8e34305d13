"""`kprecompile warm`: compile every planned kernel not cached yet, in parallel, and record it."""

from __future__ import annotations

from collections.abc import Sequence

import click

from ..cache.trust import check_writable
from ..inputs import settings
from ..warmup.warming import FamilyFailure, KernelFailure, warm
from ..wording import printable
from . import options
from .examples import epilog
from .output import ExitStatus, Output, plural
from .plan import show_families
from .workers import check_worker_options, worker_options


def show_failures(output: Output, failures: Sequence[KernelFailure]) -> None:
    for failure in failures:
        output.data(
            f"failed: {failure.model}: {failure.kernel} [{failure.specialization}] on {failure.target}: {failure.error}"
        )


def show_family_failures(failures: Sequence[FamilyFailure]) -> None:
    """One line on stderr per family whose planning failed: its target is not warm."""
    for failure in failures:
        click.echo(
            printable(
                f"kprecompile: {failure.model}: {failure.family} on {failure.target} failed, "
                f"{failure.target} is not warm: {failure.error}"
            ),
            err=True,
        )


@click.command(name="warm", cls=options.ServeLineCommand, epilog=epilog("warm"))
@options.selection_options()
@worker_options
@click.option(
    "--no-recorded",
    is_flag=True,
    help="Leave out the kernels serving processes recorded in this configuration's journal "
    "(see kprecompile misses); by default they are compiled too.",
)
@options.cache_dir_option
def command(json_output, max_workers, cache_dir, job_timeout_seconds, no_recorded, **chosen) -> None:
    """Compile every planned kernel that is not cached yet, and every kernel serving processes
    recorded for this configuration, in parallel, and record the result."""
    output = Output(json_output)
    check_worker_options(max_workers, job_timeout_seconds)
    layout = settings.cache_layout(cache_dir)
    request = options.request(chosen, layout)
    check_writable(layout)
    report = warm(
        request,
        layout,
        max_workers=max_workers,
        job_timeout_seconds=job_timeout_seconds,
        progress=output.progress(),
        recorded=not no_recorded,
    )
    output.document(report.as_dict())
    show_families(output, report.families)
    show_failures(output, report.failures)
    output.data(
        f"{plural(report.kernels, 'kernel')}: {report.compiled} compiled, {report.cached} already cached, "
        f"{report.failed} failed in {report.seconds:.1f} s"
    )
    show_driver_modules(output, report.driver_modules, report.driver_modules_not_built)
    output.data(f"cache: {report.cache_dir}")
    show_family_failures(report.family_failures)
    if not report.ok:
        raise SystemExit(ExitStatus.FAILURE)


def show_driver_modules(output: Output, built: int, not_built: tuple[str, ...]) -> None:
    """Triton's driver modules a server will not build (or why it will)."""
    if built:
        output.data(f"Triton's driver modules: {built} built for the server (it runs no C compiler for them)")
    for line in not_built:
        output.data(f"Triton's driver modules not built for {line}; a server builds them on its first start")
