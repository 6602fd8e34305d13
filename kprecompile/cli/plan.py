"""`kprecompile plan`: each family, the calls enumerated and the unique kernels, without compiling."""

from __future__ import annotations

from collections.abc import Sequence

import click

from ..inputs import settings
from ..warmup.planning import FamilyPlan, plan
from . import options
from .output import ExitStatus, Output, plural


def family_rows(families: Sequence[FamilyPlan]) -> list[tuple[str, ...]]:
    """The family table `plan` and `warm` print."""
    rows = [("family", "target", "calls", "kernels", "shape parameters")]
    for family in families:
        if family.error is not None:
            rows.append((family.family, family.target, str(family.calls), "-", f"failed: {family.error}"))
        elif family.skip_reason is None:
            parameters = ", ".join(f"{name} {value}" for name, value in family.parameters.items())
            rows.append((family.family, family.target, str(family.calls), str(family.kernels), parameters))
        else:
            rows.append((family.family, family.target, str(family.calls), "-", f"not compiled: {family.skip_reason}"))
    return rows


def show_families(output: Output, families: Sequence[FamilyPlan]) -> None:
    if families:
        output.table(family_rows(families))
    else:
        output.data("no kernel family applies to this model")


def report_failed_families(model: str, families: Sequence[FamilyPlan]) -> None:
    """One line on stderr per family whose planning failed (the command then exits 1)."""
    for family in families:
        if family.error is not None:
            click.echo(f"kprecompile: {model}: {family.family} on {family.target} failed: {family.error}", err=True)


@click.command(name="plan")
@options.selection_options()
@options.cache_dir_option
def command(json_output, cache_dir, **chosen) -> None:
    """Show each kernel family, the calls enumerated and the unique kernels, without compiling."""
    output = Output(json_output)
    layout = settings.cache_layout(cache_dir)
    request = options.request(chosen, layout)
    model, serving, selection = request.model, request.serving, request.selection
    result = plan(request, layout=layout)
    output.document(result.as_dict())
    output.data(
        f"model {result.model}: tp {serving.tensor_parallel_size}, max-num-seqs {serving.max_num_seqs}, "
        f"max-num-batched-tokens {serving.max_num_batched_tokens}, max-model-len {serving.model_len(model)}; "
        f"engine {selection.engine}, attention backend {selection.attention_backend} ({selection.selected_by})"
    )
    show_families(output, result.families)
    output.data(
        f"total: {plural(result.kernels, 'unique kernel')}, traced in {result.trace_seconds:.2f} s "
        f"(after {result.import_seconds:.2f} s importing torch and Triton)"
    )
    report_failed_families(result.model, result.failed)
    if result.failed:
        raise SystemExit(ExitStatus.FAILURE)
