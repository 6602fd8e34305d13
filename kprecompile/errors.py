"""Every error kprecompile raises on purpose.

Each class also inherits the nearest builtin, carries its subject as attributes and survives
pickling, because errors cross worker processes. A message says what failed, where, and how
to fix it, on one line. The CLI maps `InputError` to exit status 2 and every other
`KprecompileError` to 1.
"""

from __future__ import annotations


class KprecompileError(Exception):
    """Base of every error raised by kprecompile."""


class InputError(KprecompileError, ValueError):
    """A user-supplied value is wrong: a CLI option, a model config field, a serving parameter,
    an environment variable, an archive member.

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


class BundleError(InputError):
    """A bundle or archive that cannot be used here: names the member and what it should be."""

    def __init__(self, member: str, expected: str):
        self.member = member
        super().__init__("archive member", member, expected)

    def __reduce__(self):
        return (type(self), (self.member, self.expected))


class LockTimeoutError(KprecompileError, TimeoutError):
    """Another process held a cache lock for longer than the configured timeout."""

    def __init__(self, path: str, timeout_seconds: float, variable: str):
        self.path = path
        self.timeout_seconds = timeout_seconds
        self.variable = variable
        super().__init__(
            f"timed out after {timeout_seconds:g} s waiting for the lock at {path}: a running process is "
            f"compiling this kernel (the lock is released when its holder exits, even by a crash). Raise "
            f"{variable} to wait longer, or stop that process."
        )

    def __reduce__(self):
        return (type(self), (self.path, self.timeout_seconds, self.variable))


class TracingError(KprecompileError, RuntimeError):
    """A family's library call failed while its kernels were being traced."""

    def __init__(self, family: str, call: str, reason: str):
        self.family = family
        self.call = call
        self.reason = reason
        super().__init__(f"tracing {family} failed at {call}: {reason}")

    def __reduce__(self):
        return (type(self), (self.family, self.call, self.reason))


class LibraryUnavailableError(KprecompileError, ImportError):
    """The library that holds a kernel family is not installed here."""

    def __init__(self, library: str, install: str):
        self.library = library
        self.install = install
        super().__init__(f"{library} is not installed here ({install})")

    def __reduce__(self):
        return (type(self), (self.library, self.install))


class LaunchRefusedError(KprecompileError, RuntimeError):
    """Something tried to launch a kernel through the cross-compile driver (there is no GPU)."""

    def __init__(self, target: str, what: str):
        self.target = target
        self.what = what
        super().__init__(f"{what} under the cross-compile driver for {target}")

    def __reduce__(self):
        return (type(self), (self.target, self.what))


class DamagedCacheError(KprecompileError, RuntimeError):
    """Kernels of a configuration do not match what its manifest recorded (truncated, altered,
    replaced by a link): they must not travel, or be served, until `warm` compiles them again."""

    def __init__(self, configuration: str, damaged: int, first: str):
        self.configuration = configuration
        self.damaged = damaged
        self.first = first
        super().__init__(
            f"{damaged} kernel(s) of {configuration} do not match their manifest (first: {first}): run "
            "`kprecompile warm` with the same options to compile them again"
        )

    def __reduce__(self):
        return (type(self), (self.configuration, self.damaged, self.first))


class NotWarmError(KprecompileError, LookupError):
    """No manifest for this configuration: it was never warmed (or baked) here."""

    def __init__(self, model: str, target: str, cache_dir: str):
        self.model = model
        self.target = target
        self.cache_dir = cache_dir
        super().__init__(
            f"no manifest for {model} on {target} in {cache_dir}: run `kprecompile warm` for this "
            "configuration, or `kprecompile verify` to see what differs"
        )

    def __reduce__(self):
        return (type(self), (self.model, self.target, self.cache_dir))


class UnplannedCompileError(KprecompileError, RuntimeError):
    """A kernel compiled while serving under KPRECOMPILE_STRICT=error."""

    def __init__(self, kernel: str, specialization: str, variable: str):
        self.kernel = kernel
        self.specialization = specialization
        self.variable = variable
        super().__init__(f"{kernel} [{specialization}] compiled while serving ({variable}=error)")

    def __reduce__(self):
        return (type(self), (self.kernel, self.specialization, self.variable))
