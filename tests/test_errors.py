import pickle

import pytest

from kprecompile.errors import InputError, LockTimeoutError, ModelConfigError, TracingError


@pytest.mark.parametrize(
    "error, builtin",
    [
        (InputError("--tp", 3, "a divisor of 128"), ValueError),
        (ModelConfigError("kv_lora_rank", -1, "a positive integer", "preset x"), ValueError),
        (LockTimeoutError("/c/locks-v1/k.lock", 2.0, "KPRECOMPILE_LOCK_TIMEOUT"), TimeoutError),
        (TracingError("fp8_bmm", "bmm(m=3)", "boom"), RuntimeError),
    ],
)
def test_errors_pickle_with_their_subject_and_inherit_a_builtin(error, builtin):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and vars(copy) == vars(error)
    assert isinstance(error, builtin)


def test_input_error_message_names_field_value_and_expectation():
    error = ModelConfigError("kv_lora_rank", -1, "a positive integer", "preset x")
    assert str(error) == "kv_lora_rank in preset x: got -1, expected a positive integer"
    assert (error.field, error.value, error.source) == ("kv_lora_rank", -1, "preset x")
