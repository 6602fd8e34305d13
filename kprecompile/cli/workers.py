"""The compile-worker options of the commands that compile (warm, bake)."""

from __future__ import annotations

import click

from ..errors import InputError
from ..warmup.pool import DEFAULT_JOB_TIMEOUT_SECONDS
from .options import combined

worker_options = combined(
    [
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
            default=DEFAULT_JOB_TIMEOUT_SECONDS,
            show_default=True,
            help="Seconds one kernel may take to compile before it counts as failed.",
        ),
    ]
)


def check_worker_options(max_workers: int | None, job_timeout_seconds: float) -> None:
    if max_workers is not None and max_workers <= 0:
        raise InputError("--jobs", max_workers, "a positive integer")
    if job_timeout_seconds <= 0:
        raise InputError("--job-timeout", job_timeout_seconds, "a positive number of seconds")
