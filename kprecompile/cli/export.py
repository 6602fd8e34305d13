"""`kprecompile export`: one configuration's manifests and kernels as an archive."""

from __future__ import annotations

import click

from ..inputs import settings
from ..warmup.bundling import export
from . import options
from .examples import epilog
from .output import Output, plural


@click.command(name="export", cls=options.ServeLineCommand, epilog=epilog("export"))
@options.selection_options()
@options.cache_dir_option
@click.option("--archive", required=True, type=click.Path(dir_okay=False), help="The .tar.gz to write.")
@options.signing_key_option
def command(json_output, cache_dir, archive, signing_key_path, **chosen) -> None:
    """Write this configuration's manifests and kernels as one archive, for `kprecompile import`."""
    output = Output(json_output)
    layout = settings.cache_layout(cache_dir)
    request = options.request(chosen, layout)
    report = export(request, layout, archive, signing_key_path)
    output.document(report.as_dict())
    output.data(
        f"{report.archive}: {plural(len(report.configurations), 'configuration')}, {plural(report.files, 'file')}, "
        f"signed by {report.signing_key}"
    )
