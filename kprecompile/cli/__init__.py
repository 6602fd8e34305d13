"""The `kprecompile` command: one module per subcommand, each calling one library function and
rendering the report it returns through `output.Output`.

Exit statuses: 0 success, 1 the command ran and something failed (a kernel did not compile,
the cache is not warm), 2 a usage or input error, reported on one line.
"""

from __future__ import annotations

import atexit
import errno
import importlib
import logging
import os
import re
import sys
import threading

import click

from .._version import __version__
from ..errors import InputError, KprecompileError, LibraryUnavailableError
from ..inputs import settings
from ..inputs.toolchain import INSTALL_ADVICE
from ..wording import printable
from .output import ExitStatus

# Each command's module, imported only when that command runs: `verify` and a warm that finds
# everything cached stay fast because they import only what they use.
COMMANDS = {
    "plan": "plan",
    "warm": "warm",
    "verify": "verify",
    "env": "env",
    "bake": "bake",
    "export": "export",
    "import": "import_archive",
    "key": "key",
    "cache": "cache",
    "misses": "misses",
    "doctor": "doctor",
    "engine": "engine",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = COMMANDS.get(name)
        return importlib.import_module(f"{__name__}.{module}").command if module else None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kprecompile")
@click.option("-v", "--verbose", count=True, help="-v for progress details, -vv for debugging.")
def cli(verbose: int) -> None:
    """Precompile the Triton and AITER kernels an LLM serving engine will JIT-compile."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    # Every KPRECOMPILE_* variable is checked before any work: a bad one is one line, not one
    # failure per kernel after the cache was written.
    for setting in settings.SETTINGS:
        setting.read()


# The arguments of the running command, as parsed (what `verify` turns into the warm to run).
_INVOCATION: list[str] = []


def invocation() -> list[str]:
    return list(_INVOCATION)


def _use_named_engine(arguments: list[str]) -> None:
    """With `--vllm-version X` naming a release `kprecompile engine install` put here and not the
    installed vLLM, that release is put on the path before anything imports vLLM or Triton."""
    version = ""
    for index, argument in enumerate(arguments):
        if argument == "--":
            break
        name, equals, value = argument.partition("=")
        if name == "--vllm-version":  # the last one wins, as click takes it
            version = value if equals else (arguments[index + 1] if index + 1 < len(arguments) else "")
    if not version:
        return
    from ..vllm.install import use_engine
    from ..vllm.releases import installed_release

    if installed_release() != version and use_engine(version) is not None:
        logging.getLogger(__name__).info("vLLM %s from `kprecompile engine install`", version)


class _OneLineFormatter(logging.Formatter):
    """Warnings name models, paths and kernels a user or an archive chose: each message is
    escaped to one line (a traceback, with -vv, follows as Python prints it)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return printable(super().formatMessage(record))


def vllm_spelling(argument: str) -> str:
    """`--max_num_seqs=8` -> `--max-num-seqs=8`: option names as `vllm serve` takes them, with
    underscores or dashes (values, and a JSON flag's keys after a dot, are left alone)."""
    if not argument.startswith("--"):
        return argument
    name, equals, value = argument.partition("=")
    flag, dot, key = name.partition(".")  # `--compilation-config.cudagraph_capture_sizes`: a JSON key stays
    return flag.replace("_", "-") + dot + key + equals + value


_VERBOSE = re.compile(r"-v+|--verbose")


def verbosity_first(arguments: list[str]) -> list[str]:
    """`kprecompile warm -v ...` as `kprecompile -v warm ...`: pip, uv and vllm take `-v` after the
    subcommand too (up to a `--`)."""
    end = arguments.index("--") if "--" in arguments else len(arguments)
    verbose = [argument for argument in arguments[:end] if _VERBOSE.fullmatch(argument)]
    others = [argument for argument in arguments[:end] if not _VERBOSE.fullmatch(argument)]
    return [*verbose, *others, *arguments[end:]]


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, no traceback for a user mistake."""
    arguments = verbosity_first([vllm_spelling(argument) for argument in (sys.argv[1:] if argv is None else argv)])
    _INVOCATION[:] = arguments
    try:
        _use_named_engine(arguments)
        status = cli.main(args=arguments, prog_name="kprecompile", standalone_mode=False)
    except click.exceptions.Exit as exit_:
        status = exit_.exit_code
    except click.exceptions.Abort as abort:
        if isinstance(abort.__context__, KeyboardInterrupt) or isinstance(abort.__cause__, KeyboardInterrupt):
            # Ctrl-C: the shell's convention, 128 + SIGINT.
            click.echo("kprecompile: interrupted", err=True)
            status = ExitStatus.INTERRUPTED
        else:
            click.echo("kprecompile: aborted", err=True)
            status = ExitStatus.FAILURE
    except KeyboardInterrupt:
        click.echo("kprecompile: interrupted", err=True)
        status = ExitStatus.INTERRUPTED
    except click.ClickException as error:
        click.echo(printable(f"kprecompile: {error.format_message()}"), err=True)
        status = ExitStatus.USAGE
    except InputError as error:
        click.echo(printable(f"kprecompile: {error}"), err=True)
        status = ExitStatus.USAGE
    except KprecompileError as error:
        click.echo(printable(f"kprecompile: {error}"), err=True)
        status = ExitStatus.FAILURE
    except ModuleNotFoundError as error:
        if error.name not in ("triton", "torch"):
            raise
        click.echo(f"kprecompile: {LibraryUnavailableError(error.name, INSTALL_ADVICE[error.name])}", err=True)
        status = ExitStatus.FAILURE
    except OSError as error:
        # The machine said no (a full disk, a read-only file system, a directory where a file
        # belongs): one line naming the path and what to do, never a traceback.
        click.echo(printable(f"kprecompile: {describe_os_error(error)}"), err=True)
        status = ExitStatus.FAILURE
    sys.exit(status if isinstance(status, int) else ExitStatus.SUCCESS)


def run() -> None:
    """The process's entry point (`kprecompile`, `python -m kprecompile`): `main`, then the
    process ends as soon as the command has, as Python ends it (other threads joined, exit
    handlers run, streams flushed) but without tearing down the modules it imported, which takes
    a second or more once torch and Triton are imported. kprecompile closes every file it writes
    before its command returns. `main` itself stays a function that returns, for callers that go
    on."""
    try:
        main()
        status: object = ExitStatus.SUCCESS
    except SystemExit as exit_:
        status = exit_.code
    if status is None:
        status = ExitStatus.SUCCESS
    elif not isinstance(status, int):  # what `sys.exit("message")` would do
        print(status, file=sys.stderr)
        status = ExitStatus.FAILURE
    try:
        # What the interpreter's own end does first: threading's exit hooks (executors' workers
        # stop), then every non-daemon thread joined.
        threading._shutdown()
        atexit._run_exitfuncs()
    except KeyboardInterrupt:
        status = ExitStatus.INTERRUPTED
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): what was not read is lost either way
            pass
    os._exit(int(status))


_FIXES = {
    errno.ENOSPC: "free space on that file system, or choose another --cache-dir",
    errno.EDQUOT: "free space within your quota, or choose another --cache-dir",
    errno.EROFS: "that file system is read-only: choose another --cache-dir",
    errno.EACCES: "check its permissions, or choose another --cache-dir",
    errno.EPERM: "check its permissions, or choose another --cache-dir",
    errno.EISDIR: "a directory is where a file belongs: remove it",
    errno.ENOTDIR: "a file is where a directory belongs: remove it",
    errno.ENAMETOOLONG: "choose a shorter path",
}


def describe_os_error(error: OSError) -> str:
    """`<what failed>: <path>: <fix>` for an OS error."""
    paths = [str(path) for path in (error.filename2, error.filename) if path is not None]
    reason = error.strerror or type(error).__name__
    fix = _FIXES.get(error.errno or -1)
    return "; ".join(part for part in (f"{reason}: {paths[0] if paths else 'a cache file'}", fix) if part)


__all__ = ["ExitStatus", "cli", "main", "run"]
