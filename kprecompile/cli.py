"""The `kprecompile` command: each subcommand calls one library function and renders its result.

Exit statuses: 0 success, 1 the command ran and something failed (a kernel did not compile),
2 a usage or input error. Data goes to stdout; progress, status and warnings to stderr.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from . import __version__
from .errors import InputError, KprecompileError


class ExitStatus(enum.IntEnum):
    SUCCESS = 0
    FAILURE = 1
    USAGE = 2


def _make_selection_options(multiple_models: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Options shared by every command that selects a configuration (bake takes several models)."""
    return lambda command: _add_selection_options(command, multiple_models)


def _add_selection_options(command: Callable[..., Any], multiple_models: bool) -> Callable[..., Any]:
    options = [
        click.option(
            "--model",
            "model_spec",
            required=True,
            multiple=multiple_models,
            metavar="MODEL",
            help="Preset name, path to a config.json, or a directory holding one"
            + ("; repeatable." if multiple_models else "."),
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
            "--max-num-seqs",
            type=int,
            default=1024,
            show_default=True,
            help="Most sequences in one step (vLLM --max-num-seqs): the largest decode batch.",
        ),
        click.option(
            "--max-num-batched-tokens",
            type=int,
            default=8192,
            show_default=True,
            help="Most tokens in one step (vLLM --max-num-batched-tokens): the largest prefill chunk.",
        ),
        click.option(
            "--max-model-len",
            type=int,
            default=None,
            help="Longest sequence [default: the config's max_position_embeddings].",
        ),
        click.option("--block-size", type=int, default=16, show_default=True, help="KV-cache tokens per block."),
        click.option(
            "--kv-cache-dtype",
            default="auto",
            show_default=True,
            help="auto (the model dtype), fp8 or fp8_e4m3 (the target's FP8).",
        ),
        click.option("--dtype", default="auto", show_default=True, help="auto, bfloat16 or float16."),
        click.option(
            "--cudagraph-capture-sizes",
            default=None,
            metavar="N,N,...",
            help="Token counts graphs are captured for [default: vLLM's rule from --max-num-seqs].",
        ),
        click.option("--enforce-eager", is_flag=True, help="The engine runs without CUDA/HIP graphs."),
        click.option(
            "--num-speculative-tokens",
            type=int,
            default=0,
            show_default=True,
            help="Draft tokens per step (MTP / speculative decoding).",
        ),
        click.option(
            "--engine",
            default="vllm-aiter",
            show_default=True,
            help="vllm-aiter (vLLM with VLLM_ROCM_USE_AITER=1 unless set) or vllm (vLLM's own defaults).",
        ),
        click.option(
            "--family",
            "families",
            multiple=True,
            metavar="FAMILY",
            help="Plan only this kernel family (fp8_bmm, mla_decode, ...); repeatable [default: all the engine runs].",
        ),
        click.option(
            "--attention-backend",
            default=None,
            help="The engine's attention backend [default: VLLM_ATTENTION_BACKEND, else chosen from the flags].",
        ),
        click.option("--json", "json_output", is_flag=True, help="Print one JSON document."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


_SERVING_OPTIONS = (
    "tensor_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "block_size",
    "kv_cache_dtype",
    "dtype",
    "enforce_eager",
    "num_speculative_tokens",
)


def _parse_sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InputError("--cudagraph-capture-sizes", text, "a comma-separated list of positive integers") from None


_cache_dir_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Cache root [default: $KPRECOMPILE_CACHE_DIR or the user cache directory].",
)


_selection_options = _make_selection_options(multiple_models=False)


def _select(options: dict[str, Any]):
    """Model, serving parameters, engine selection and targets from the shared options."""
    [(model, selection)], serving, targets = _select_models(options, (options["model_spec"],))
    return model, serving, selection, targets


def _select_models(options: dict[str, Any], model_specs: tuple[str, ...]):
    """[(model, selection)], serving parameters and targets; every input checked before any work."""
    from .engines import select
    from .models import load_model
    from .serving import ServingParams
    from .targets import resolve_target

    serving = ServingParams(
        **{name: options[name] for name in _SERVING_OPTIONS},
        cudagraph_capture_sizes=_parse_sizes(options["cudagraph_capture_sizes"]),
    )
    targets = []
    for name in options["target_names"]:
        target = resolve_target(name)
        if target not in targets:
            targets.append(target)
    selected = []
    for spec in dict.fromkeys(model_specs):
        model = load_model(spec)
        selection = select(model, options["engine"], options["attention_backend"], families=options["families"])
        # A combination the engine would refuse fails here, before any work.
        serving.check(model)
        selected.append((model, selection))
    return selected, serving, targets


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
@_cache_dir_option
def plan(json_output, cache_dir, **options) -> None:
    """Show each kernel family, the calls enumerated and the unique kernels, without compiling."""
    from .cache.layout import CacheLayout
    from .planning import plan as make_plan

    model, serving, selection, targets = _select(options)
    result = make_plan(model, serving, targets, selection, layout=CacheLayout.at(cache_dir))
    if json_output:
        _emit_json(result.summary())
        return
    click.echo(
        f"model {result.model}: tp {serving.tensor_parallel_size}, max-num-seqs {serving.max_num_seqs}, "
        f"max-num-batched-tokens {serving.max_num_batched_tokens}, max-model-len {serving.model_len(model)}; "
        f"engine {selection.engine}, attention backend {selection.attention_backend}"
    )
    _echo_families(result.families)
    click.echo(
        f"total: {result.kernels} unique kernels, traced in {result.trace_seconds:.2f} s "
        f"(after {result.import_seconds:.2f} s importing torch and Triton)"
    )


def _echo_families(families) -> None:
    if not families:
        click.echo("no kernel family applies to this model")
        return
    rows = [("family", "target", "calls", "kernels", "shape parameters")]
    for family in families:
        parameters = ", ".join(f"{name} {value}" for name, value in family.parameters.items())
        if family.skipped is None:
            rows.append((family.name, family.target, str(family.calls), str(family.kernels), parameters))
        else:
            rows.append((family.name, family.target, str(family.calls), "-", f"not compiled: {family.skipped}"))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4])


_worker_options = [
    click.option(
        "--jobs",
        "max_workers",
        type=int,
        default=None,
        help="Compile worker processes [default: the CPUs this process may use].",
    ),
    click.option(
        "--job-timeout",
        "job_timeout_seconds",
        type=float,
        default=900.0,
        show_default=True,
        help="Seconds one kernel may take to compile before it counts as failed.",
    ),
]


def _check_worker_options(max_workers: int | None, job_timeout_seconds: float) -> None:
    if max_workers is not None and max_workers <= 0:
        raise InputError("--jobs", max_workers, "a positive integer")
    if job_timeout_seconds <= 0:
        raise InputError("--job-timeout", job_timeout_seconds, "a positive number of seconds")


@cli.command()
@_selection_options
@_worker_options[0]
@_cache_dir_option
@_worker_options[1]
def warm(json_output, max_workers, cache_dir, job_timeout_seconds, **options) -> None:
    """Compile every planned kernel that is not cached yet, in parallel, and record the result."""
    from .cache.layout import CacheLayout
    from .warming import warm as run_warm

    _check_worker_options(max_workers, job_timeout_seconds)
    model, serving, selection, targets = _select(options)
    report = run_warm(
        model,
        serving,
        targets,
        CacheLayout.at(cache_dir),
        selection=selection,
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


@cli.command()
@_selection_options
@_cache_dir_option
@click.option("--deep", is_flag=True, help="Also compare every kernel file's sha256 with the manifest.")
def verify(json_output, cache_dir, deep, **options) -> None:
    """Say whether this configuration is fully warm here (exit 0) or not, and why (exit 1).

    In-process, without compiling or starting workers: the manifest key is recomputed from
    this process's environment and toolchain.
    """
    from .cache.layout import CacheLayout
    from .verification import verify as run_verify

    model, serving, selection, targets = _select(options)
    report = run_verify(model, serving, targets, CacheLayout.at(cache_dir), selection=selection, deep=deep)
    if json_output:
        _emit_json(report.as_dict())
    else:
        for verdict in report.targets:
            if verdict.status == "warm":
                click.echo(f"{report.model} on {verdict.target}: warm ({verdict.kernels} kernels, {verdict.manifest})")
            elif verdict.status == "incomplete":
                click.echo(
                    f"{report.model} on {verdict.target}: not warm: {len(verdict.problems)} of {verdict.kernels} "
                    "kernels missing or damaged"
                )
                for problem in verdict.problems:
                    click.echo(f"  {problem.kernel} [{problem.specialization}] {problem.key}: {problem.problem}")
            else:
                click.echo(f"{report.model} on {verdict.target}: not warm")
                for reason in verdict.reasons:
                    click.echo(f"  {reason}")
    if not report.warm:
        raise SystemExit(ExitStatus.FAILURE)


@cli.command()
@click.option(
    "--engine",
    default="vllm-aiter",
    show_default=True,
    help="Engine profile whose defaults apply to unset variables (vllm-aiter or vllm).",
)
@click.option("--json", "json_output", is_flag=True, help="Print one JSON document.")
def env(engine, json_output) -> None:
    """Print the environment fingerprint that enters every cache key, and its hash."""
    from .environment import VARIABLES, fingerprint

    current = fingerprint(engine=engine)
    if json_output:
        _emit_json({**current.as_dict(), "hash": current.hash})
        return
    rows = [("variable", "value", "default", "why")]
    for variable in VARIABLES:
        value = current.variables[variable.name]
        rows.append((variable.name, _shown(value), _shown(variable.default), variable.why))
    for name, value in current.triton.items():
        rows.append((name, value, "-", "Triton reports it as invalidating its cache"))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3])
    click.echo(f"hash: {current.hash}")


def _shown(value: str | None) -> str:
    return "(unset)" if value is None else value


def _check_archive_path(archive: str) -> None:
    from pathlib import Path

    path = Path(archive)
    if path.is_dir():
        raise InputError("--archive", archive, "a file path, not a directory")
    if not path.absolute().parent.is_dir():
        raise InputError("--archive", archive, "a file in an existing directory")


@cli.command()
@_make_selection_options(multiple_models=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Bundle directory (a cache root).")
@click.option("--archive", type=click.Path(dir_okay=False), default=None, help="Also write it as one .tar.gz.")
@_worker_options[0]
@_worker_options[1]
def bake(json_output, out, archive, max_workers, job_timeout_seconds, **options) -> None:
    """Build a self-describing cache bundle for several models and targets (a CPU builder will do)."""
    from pathlib import Path

    from .cache.bundle import write_archive, write_index
    from .cache.layout import CacheLayout
    from .warming import warm as run_warm

    _check_worker_options(max_workers, job_timeout_seconds)
    selected, serving, targets = _select_models(options, options["model_spec"])
    if archive is not None:
        _check_archive_path(archive)
    layout = CacheLayout(Path(out).expanduser().absolute())
    started = time.perf_counter()
    keys, failures = [], []
    for model, selection in selected:
        report = run_warm(
            model,
            serving,
            targets,
            layout,
            selection=selection,
            max_workers=max_workers,
            job_timeout_seconds=job_timeout_seconds,
            progress=sys.stderr.isatty() and not json_output,
        )
        keys += [Path(path).stem for path in report.manifests]
        failures += [f"{model.name}: {f.kernel} [{f.specialization}] on {f.target}: {f.error}" for f in report.failures]
    if failures:
        for failure in failures:
            click.echo(f"failed: {failure}", err=True)
        raise SystemExit(ExitStatus.FAILURE)
    index = write_index(layout.root, keys)
    archive_bytes = None
    if archive is not None:
        write_archive(layout.root, Path(archive))
        archive_bytes = Path(archive).stat().st_size
    document = {
        "out": str(layout.root),
        "archive": archive,
        "configurations": list(index.configurations),
        "files": index.files,
        "bytes": index.bytes,
        "archive_bytes": archive_bytes,
        "seconds": time.perf_counter() - started,
    }
    if json_output:
        _emit_json(document)
        return
    for configuration in index.configurations:
        click.echo(
            f"{configuration['target']}: {configuration['kernels']} kernels (manifest {configuration['manifest']})"
        )
    size = f"{index.bytes / 1e6:.0f} MB in {index.files} files"
    if archive_bytes is not None:
        size += f"; {archive} {archive_bytes / 1e6:.0f} MB"
    click.echo(f"bundle {layout.root}: {size}, in {document['seconds']:.1f} s")


@cli.command()
@_selection_options
@_cache_dir_option
@click.option("--archive", required=True, type=click.Path(dir_okay=False), help="The .tar.gz to write.")
def export(json_output, cache_dir, archive, **options) -> None:
    """Write this configuration's manifests and kernels as one archive, for `kprecompile import`."""
    import tempfile
    from pathlib import Path

    from .cache.bundle import export_bundle, write_archive
    from .cache.layout import CacheLayout
    from .cache.manifest import configuration_parts, manifest_key

    model, serving, selection, targets = _select(options)
    _check_archive_path(archive)
    layout = CacheLayout.at(cache_dir)
    keys = [
        manifest_key(configuration_parts(model, serving, selection, target, layout, remember=False))
        for target in targets
    ]
    with tempfile.TemporaryDirectory(prefix="kprecompile-export-") as scratch:
        index = export_bundle(layout, keys, Path(scratch))
        write_archive(Path(scratch), Path(archive))
    document = {"archive": archive, "configurations": list(index.configurations), "files": index.files,
                "bytes": index.bytes, "archive_bytes": Path(archive).stat().st_size}  # fmt: skip
    if json_output:
        _emit_json(document)
    else:
        click.echo(f"{archive}: {len(index.configurations)} configurations, {index.files} files")


@cli.command(name="import")
@click.argument("archive", type=click.Path(dir_okay=False))
@_cache_dir_option
@click.option("--json", "json_output", is_flag=True, help="Print one JSON document.")
def import_command(archive, cache_dir, json_output) -> None:
    """Add a bundle archive to the cache after validating all of it; all or nothing."""
    from dataclasses import asdict
    from pathlib import Path

    from .cache.bundle import import_archive
    from .cache.layout import CacheLayout

    report = import_archive(Path(archive), CacheLayout.at(cache_dir, layers=()))
    if json_output:
        _emit_json(asdict(report))
    else:
        click.echo(
            f"{archive}: {report.configurations} configurations; {report.entries_added} kernels added, "
            f"{report.entries_present} already present, {report.manifests} manifests, into {report.cache_dir}"
        )


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
