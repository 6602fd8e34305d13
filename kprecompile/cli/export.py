"""`kprecompile export`: one configuration's manifests and kernels as an archive."""

from __future__ import annotations

import click

from .. import settings
from ..bundling import export
from . import options
from .output import Output, plural


@click.command(name="export")
@options.selection_options()
@options.cache_dir_option
@click.option("--archive", required=True, type=click.Path(dir_okay=False), help="The .tar.gz to write.")
def command(json_output, cache_dir, archive, **chosen) -> None:
    """Write this configuration's manifests and kernels as one archive, for `kprecompile import`."""
    output = Output(json_output)
    request = options.request(chosen, settings.cache_layout(cache_dir))
    report = export(request, settings.cache_layout(cache_dir), archive)
    output.document(report.as_dict())
    output.data(
        f"{report.archive}: {plural(len(report.configurations), 'configuration')}, {plural(report.files, 'file')}"
    )
