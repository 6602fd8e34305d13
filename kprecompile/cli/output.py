"""Where the CLI's words go: data on stdout, one JSON document with `--json`; status and warnings
go to stderr through logging and the progress bar.

Every command renders through one `Output`, so that all of them behave alike: `--json` prints
exactly one document (also when the command then exits 1), tables line up, counts are
spelled with the right plural, and progress appears only on a terminal and never with
`--json`.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from ..progress import Progress, ProgressBar, ProgressLines
from ..wording import human_size, plural, printable

__all__ = ["ExitStatus", "Output", "human_size", "plural"]


# The version of every --json document's schema: bumped when a field changes meaning or goes.
SCHEMA_VERSION = 1


class Output:
    def __init__(self, json_output: bool = False):
        self.json_output = json_output

    def data(self, line: str = "") -> None:
        """A line of the command's result (stdout); nothing with --json, which prints a document.
        Names in it (a journal's model, a model path) are escaped: one line stays one line."""
        if not self.json_output:
            click.echo(printable(line))

    def document(self, document: Any) -> None:
        """The --json document, with the version of its schema first."""
        if self.json_output:
            if isinstance(document, dict):
                document = {"schema_version": SCHEMA_VERSION, **document}
            click.echo(json.dumps(document, indent=2))

    def table(self, rows: Sequence[Sequence[str]]) -> None:
        """Rows with every column but the last padded to its width (the last one runs free)."""
        if not rows:
            return
        columns = len(rows[0]) - 1
        widths = [max(len(row[column]) for row in rows) for column in range(columns)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row[:columns], widths, strict=True)]
            self.data("  ".join([*cells, row[columns]]).rstrip())

    def progress(self) -> Progress | None:
        """A progress bar on a terminal, plain progress lines elsewhere, nothing with --json."""
        if self.json_output:
            return None
        return ProgressBar() if sys.stderr.isatty() else ProgressLines()


class ExitStatus(enum.IntEnum):
    SUCCESS = 0
    # The command ran and something failed: a kernel did not compile, the cache is not warm.
    FAILURE = 1
    # A usage or input error.
    USAGE = 2
    # Ctrl-C (128 + SIGINT).
    INTERRUPTED = 130
