"""`kprecompile plan`: each family, the calls enumerated and the unique kernels, without compiling."""

from __future__ import annotations

from collections.abc import Sequence

import click

from ..inputs import settings
from ..inputs.layers import AttentionLayer
from ..warmup.family_plan import FamilyPlan
from ..wording import printable
from . import options
from .examples import epilog
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


def describe_layer(layer: AttentionLayer) -> str:
    """One kind of attention layer in a few words: `13 x window 4096, soft-cap 50.0 (ROCM_ATTN)`."""
    parts = [f"window {layer.sliding_window}" if layer.sliding_window else "full"]
    if layer.logits_soft_cap:
        parts.append(f"soft-cap {layer.logits_soft_cap:g}")
    if layer.sinks:
        parts.append(f"sinks {layer.sinks}")
    if layer.kv_b_proj_dtype:
        parts.append(f"kv_b_proj {layer.kv_b_proj_dtype}")
    backend = f" ({layer.backend})" if layer.backend else ""
    return f"{layer.count} x " + ", ".join(parts) + f", {layer.dtype}{backend}"


def show_families(output: Output, families: Sequence[FamilyPlan]) -> None:
    if families:
        output.table(family_rows(families))
    else:
        output.data("no kernel family applies to this model")


def report_failed_families(model: str, families: Sequence[FamilyPlan]) -> None:
    """One line on stderr per family whose planning failed (the command then exits 1)."""
    for family in families:
        if family.error is not None:
            line = f"kprecompile: {model}: {family.family} on {family.target} failed: {family.error}"
            click.echo(printable(line), err=True)


@click.command(name="plan", cls=options.ServeLineCommand, epilog=epilog("plan"))
@options.selection_options()
@options.cache_dir_option
def command(json_output, cache_dir, **chosen) -> None:
    """Show each kernel family, the calls enumerated and the unique kernels, without compiling."""
    from ..warmup.planning import plan  # tracing's imports, not paid by `warm` for `show_families`

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
    if result.layers and not model.mla:
        kinds = "; ".join(describe_layer(layer) for layer in result.layers)
        output.data(f"attention layers ({result.layers_source}): {kinds}")
    if result.aiter is not None:
        output.data(f"AITER: {result.aiter.describe(selection.vllm_release)}")
    show_families(output, result.families)
    output.data(
        f"total: {plural(result.kernels, 'unique kernel')}, traced in {result.trace_seconds:.2f} s "
        f"(after {result.import_seconds:.2f} s importing torch and Triton)"
    )
    report_failed_families(result.model, result.failed)
    if result.failed:
        raise SystemExit(ExitStatus.FAILURE)
