"""`kprecompile verify`: is this configuration fully warm here (exit 0), and if not, why (exit 1)."""

from __future__ import annotations

import shlex

import click

from ..inputs import settings
from ..warmup.verification import DRIVER_MODULE, verify
from . import options
from .examples import epilog
from .output import ExitStatus, Output, plural


@click.command(name="verify", cls=options.ServeLineCommand, epilog=epilog("verify"))
@options.selection_options()
@options.cache_dir_option
@click.option("--deep", is_flag=True, help="Also compare every kernel file's sha256 with the manifest.")
def command(json_output, cache_dir, deep, **chosen) -> None:
    """Say whether this configuration is fully warm here (exit 0) or not, and why (exit 1).

    In-process, without compiling or starting workers: the manifest key is recomputed from
    this process's environment and toolchain.
    """
    output = Output(json_output)
    layout = settings.cache_layout(cache_dir)
    request = options.request(chosen, layout)
    report = verify(request, layout, deep=deep)
    output.document(report.as_dict())
    for verdict in report.targets:
        if verdict.status == "warm":
            output.data(
                f"{report.model} on {verdict.target}: warm ({plural(verdict.kernels, 'kernel')}, {verdict.manifest})"
            )
        elif verdict.status == "incomplete":
            modules = sum(problem.kernel == DRIVER_MODULE for problem in verdict.problems)
            kernels = len(verdict.problems) - modules
            counts = [f"{kernels} of {plural(verdict.kernels, 'kernel')}"] if kernels else []
            counts += [f"{modules} of Triton's driver modules"] if modules else []
            output.data(f"{report.model} on {verdict.target}: not warm: {' and '.join(counts)} missing or damaged")
            for problem in verdict.problems:
                output.data(f"  {problem.kernel} [{problem.specialization}] {problem.key}: {problem.problem}")
        elif verdict.status == "recorded":
            output.data(
                f"{report.model} on {verdict.target}: not warm: {plural(len(verdict.problems), 'kernel')} "
                f"compiled while serving, not by a warm yet (kprecompile misses lists them)"
            )
        else:
            output.data(f"{report.model} on {verdict.target}: not warm")
            for reason in verdict.reasons:
                output.data(f"  {reason}")
    if not report.warm:
        output.data(f"to make it warm: {warm_command()}")
        raise SystemExit(ExitStatus.FAILURE)


def warm_command() -> str:
    """This command line as the `kprecompile warm` that makes the configuration warm."""
    from . import invocation

    words = invocation()
    if "verify" in words:
        words = words[words.index("verify") + 1 :]
    return shlex.join(["kprecompile", "warm", *(word for word in words if word not in ("--deep", "--json"))])
