import pickle

import pytest

import kprecompile.errors
from kprecompile.errors import (
    BundleError,
    DamagedCacheError,
    InputError,
    KprecompileError,
    LaunchRefusedError,
    LibraryUnavailableError,
    LockTimeoutError,
    ModelConfigError,
    NotWarmError,
    TracingError,
    UnplannedCompileError,
)

EXAMPLES = [
    (InputError("--tp", 3, "a divisor of 128"), ValueError),
    (ModelConfigError("kv_lora_rank", -1, "a positive integer", "preset x"), ValueError),
    (BundleError("triton-v1/link", "a regular file, not a link to '/etc/passwd'"), ValueError),
    (LockTimeoutError("/c/locks-v1/k.lock", 2.0, "KPRECOMPILE_LOCK_TIMEOUT"), TimeoutError),
    (TracingError("fp8_bmm", "bmm(m=3)", "boom"), RuntimeError),
    (LibraryUnavailableError("amd-aiter", "pip install amd-aiter"), ImportError),
    (LaunchRefusedError("gfx942", "a kernel reached launch"), RuntimeError),
    (NotWarmError("deepseek-r1", "gfx942", "/c"), LookupError),
    (DamagedCacheError("deepseek-r1 on gfx942", 2, "kernel [abc]: x.hsaco is missing"), RuntimeError),
    (UnplannedCompileError("m:k", "BLOCK=16", "KPRECOMPILE_STRICT"), RuntimeError),
]


@pytest.mark.parametrize("error, builtin", EXAMPLES)
def test_errors_pickle_with_their_subject_and_inherit_a_builtin(error, builtin):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and vars(copy) == vars(error)
    assert isinstance(error, builtin) and isinstance(error, KprecompileError)


def test_every_error_class_has_an_example():
    classes = {value for value in vars(kprecompile.errors).values() if isinstance(value, type)}
    raised = {cls for cls in classes if issubclass(cls, KprecompileError) and cls is not KprecompileError}
    assert raised == {type(error) for error, _ in EXAMPLES}


def test_a_bundle_error_names_the_member_and_what_it_should_be():
    error = BundleError("triton-v1/link", "a regular file, not a link to '/etc/passwd'")
    assert str(error) == "archive member: got 'triton-v1/link', expected a regular file, not a link to '/etc/passwd'"
    assert (error.field, error.member) == ("archive member", "triton-v1/link")


def test_input_error_message_names_field_value_and_expectation():
    error = ModelConfigError("kv_lora_rank", -1, "a positive integer", "preset x")
    assert str(error) == "kv_lora_rank in preset x: got -1, expected a positive integer"
    assert (error.field, error.value, error.source) == ("kv_lora_rank", -1, "preset x")
