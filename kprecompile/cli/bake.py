"""`kprecompile bake`: a self-describing cache bundle for several models and targets."""

from __future__ import annotations

import click

from ..inputs import settings
from ..warmup.bundling import bake
from . import options
from .examples import epilog
from .output import ExitStatus, Output, human_size, plural
from .warm import show_driver_modules, show_failures, show_family_failures
from .workers import check_worker_options, worker_options


@click.command(name="bake", cls=options.ServeLineCommand, epilog=epilog("bake"))
@options.selection_options(multiple_models=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Bundle directory (a cache root).")
@click.option("--archive", type=click.Path(dir_okay=False), default=None, help="Also write it as one .tar.gz.")
@worker_options
@click.option(
    "--no-recorded",
    is_flag=True,
    help="Leave out the kernels serving processes recorded in the cache's journals; by default the "
    "bundle carries the journals of its configurations from --cache-dir and compiles their kernels.",
)
@options.signing_key_option
@options.cache_dir_option
def command(
    json_output, out, archive, max_workers, job_timeout_seconds, no_recorded, signing_key_path, cache_dir, **chosen
) -> None:
    """Build a self-describing cache bundle for several models and targets (a CPU builder will do)."""
    output = Output(json_output)
    check_worker_options(max_workers, job_timeout_seconds)
    requests = options.requests(chosen)
    recorded_from = None if no_recorded else settings.cache_layout(cache_dir)
    report = bake(
        requests,
        out,
        archive,
        max_workers=max_workers,
        job_timeout_seconds=job_timeout_seconds,
        progress=output.progress(),
        recorded_from=recorded_from,
        signing_key_path=signing_key_path,
    )
    output.document(report.as_dict())
    show_failures(output, report.failures)
    show_family_failures(report.family_failures)
    if report.failed or report.family_failures:
        failed = [plural(report.failed, "kernel")] if report.failed else []
        failed += [plural(len(report.family_failures), "family", "families")] if report.family_failures else []
        output.data(f"bundle {report.out} not written: {' and '.join(failed)} failed")
        raise SystemExit(ExitStatus.FAILURE)
    show_driver_modules(output, report.driver_modules, report.driver_modules_not_built)
    for configuration in report.configurations:
        kernels = plural(configuration["kernels"], "kernel")
        output.data(
            f"{configuration['model']['name']} on {configuration['target']}: {kernels} "
            f"(manifest {configuration['manifest']})"
        )
    size = f"{human_size(report.bytes)} in {plural(report.files, 'file')}"
    if report.archive_bytes is not None:
        size += f"; {report.archive} {human_size(report.archive_bytes)}"
    if report.signing_key is not None:
        size += f", signed by {report.signing_key}"
    output.data(f"bundle {report.out}: {size}, in {report.seconds:.1f} s")
