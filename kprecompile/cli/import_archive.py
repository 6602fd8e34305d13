"""`kprecompile import`: add a bundle archive to the cache after validating all of it."""

from __future__ import annotations

from dataclasses import asdict

import click

from ..inputs import settings
from ..warmup.bundling import import_archive
from . import options
from .examples import epilog
from .output import Output, plural


@click.command(name="import", epilog=epilog("import"))
@click.argument("archive", type=click.Path(dir_okay=False))
@options.cache_dir_option
@click.option(
    "--trusted-key",
    "trusted_keys",
    multiple=True,
    help="A public key (ssh-ed25519 AAAA...) or a file of them whose signed archives are accepted, "
    "besides $KPRECOMPILE_TRUSTED_KEYS; repeatable.",
)
@click.option(
    "--allow-unsigned",
    is_flag=True,
    help="Accept an archive no trusted key signed (its kernels are code servers will run).",
)
@options.json_option
def command(archive, cache_dir, trusted_keys, allow_unsigned, json_output) -> None:
    """Add a bundle archive signed by a trusted key to the cache after validating all of it; all or nothing."""
    output = Output(json_output)
    # Not made writable up front: a refused archive leaves no trace, not even the root.
    report = import_archive(
        archive,
        settings.cache_layout(cache_dir, layers=()),
        trusted_keys=trusted_keys,
        allow_unsigned=allow_unsigned,
    )
    output.document(asdict(report))
    output.data(
        f"{archive}: {plural(report.configurations, 'configuration')}; {plural(report.entries_added, 'kernel')} "
        f"added, {report.entries_present} already present, {report.entries_replaced} damaged replaced; "
        f"{plural(report.manifests_added, 'manifest')} added, {report.manifests_present} already present, "
        f"{report.manifests_replaced} damaged replaced; "
        + (
            f"{plural(report.jit_files_added, 'AITER JIT file')} added, {report.jit_files_present} already present; "
            if report.jit_files_added or report.jit_files_present
            else ""
        )
        + f"into {report.cache_dir}; "
        + (f"signed by {report.signing_key}" if report.signing_key else "unsigned (--allow-unsigned)")
    )
