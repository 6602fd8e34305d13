"""Every error kprecompile raises on purpose.

Each class also inherits the nearest builtin, carries its subject as attributes and survives
pickling, because errors cross worker processes. A message says what failed, where, and how
to fix it, on one line.
"""

from __future__ import annotations


class KprecompileError(Exception):
    """Base of every error raised by kprecompile."""


class InputError(KprecompileError, ValueError):
    """A user-supplied value is wrong: a CLI option, a model config field, a serving parameter.

    The CLI maps it to exit status 2 and prints only the message.
    """

    def __init__(self, field: str, value: object, expected: str, source: str | None = None):
        self.field = field
        self.value = value
        self.expected = expected
        self.source = source
        where = f" in {source}" if source else ""
        super().__init__(f"{field}{where}: got {value!r}, expected {expected}")

    def __reduce__(self):
        return (type(self), (self.field, self.value, self.expected, self.source))


class ModelConfigError(InputError):
    """A field of a model's config.json is missing or malformed."""


class LockTimeoutError(KprecompileError, TimeoutError):
    """Another process held a cache lock for longer than the configured timeout."""

    def __init__(self, path: str, timeout_seconds: float, variable: str):
        self.path = path
        self.timeout_seconds = timeout_seconds
        self.variable = variable
        super().__init__(
            f"timed out after {timeout_seconds:g} s waiting for the lock at {path}; another "
            f"process is compiling this kernel. Raise {variable} to wait longer, or remove the "
            "lock file if no kprecompile process is running."
        )

    def __reduce__(self):
        return (type(self), (self.path, self.timeout_seconds, self.variable))


class TracingError(KprecompileError, RuntimeError):
    """A provider's library call failed while its kernels were being traced."""

    def __init__(self, family: str, call: str, reason: str):
        self.family = family
        self.call = call
        self.reason = reason
        super().__init__(f"tracing {family} failed at {call}: {reason}")

    def __reduce__(self):
        return (type(self), (self.family, self.call, self.reason))
