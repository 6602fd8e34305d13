"""`kprecompile misses`: the kernels serving processes compiled beyond the plan, per configuration."""

from __future__ import annotations

import click

from ..errors import InputError
from ..inputs import settings
from ..inputs.targets import resolve_target
from ..warmup.recorded import find_recorded
from . import options
from .examples import epilog
from .output import Output, plural

# Specializations are long; the table shows their start (`--json` has all of it).
_SPECIALIZATION_WIDTH = 72


@click.command(name="misses", epilog=epilog("misses"))
@click.argument("manifests", nargs=-1, metavar="[MANIFEST]...")
@click.option("--model", "model_names", multiple=True, metavar="NAME", help="Records of this model.")
@click.option("--target", "target_names", multiple=True, metavar="TARGET", help="Records made on this target.")
@options.cache_dir_option
@options.json_option
def command(manifests, model_names, target_names, cache_dir, json_output) -> None:
    """List the kernels serving processes compiled that no plan had (the journal `warm` compiles),
    per configuration: kernel, specialization, first and last seen, count, family or library, and
    what became of each."""
    output = Output(json_output)
    for prefix in manifests:
        if not prefix or any(c not in "0123456789abcdef" for c in prefix):
            raise InputError("MANIFEST", prefix, "a manifest key or its prefix (hex digits, see kprecompile cache ls)")
    layout = settings.cache_layout(cache_dir)
    models = {name.lower() for name in model_names}
    targets = {resolve_target(name).name for name in target_names}

    def chosen(record) -> bool:
        return (
            (not manifests or any((record.manifest or "").startswith(prefix) for prefix in manifests))
            and (not models or record.model.lower() in models)
            and (not targets or record.target in targets)
        )

    reports = find_recorded(layout, chosen)
    output.document(
        {
            "cache_dir": str(layout.root),
            "journals": [report.as_dict() for report in reports],
            "kernels": sum(len(report.misses) for report in reports),
        }
    )
    if not reports:
        output.data(f"no kernels recorded while serving in {layout.root}")
        return
    for report in reports:
        manifests_text = ", ".join(key[:12] for key in report.manifests) or "-"
        output.data(
            f"{report.model} on {', '.join(report.targets)}: {plural(len(report.misses), 'kernel')} "
            f"recorded while serving (journal {report.journal[:12]}; manifests {manifests_text})"
        )
        rows = [["KERNEL", "LIBRARY", "FAMILY", "SEEN", "LAST SEEN", "STATUS", "SPECIALIZATION"]]
        for miss in report.misses:
            specialization = miss.specialization
            if len(specialization) > _SPECIALIZATION_WIDTH:
                specialization = specialization[: _SPECIALIZATION_WIDTH - 3] + "..."
            rows.append(
                [
                    miss.kernel.rpartition(":")[2],
                    miss.library,
                    miss.family or "-",
                    f"{miss.count:,}",
                    miss.last_seen,
                    miss.status,
                    specialization,
                ]
            )
        output.table(rows)
