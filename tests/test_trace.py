import importlib
import json
import sys

import pytest
import torch
from helpers import (
    FP8_BMM,
    SAMPLE_MODULE,
    fp8_bmm_calls,
    fp8_bmm_shapes,
    launch_path_keys,
    run_test_script,
    sample_call,
)

from kprecompile.errors import TracingError
from kprecompile.tracing.trace import trace_calls

FAMILY = FP8_BMM.name
FP8_BMM_MODULES = FP8_BMM.traced_modules


@pytest.mark.compiles
@pytest.mark.parametrize("m", [1, 17, 64])
def test_traced_fp8_bmm_key_equals_the_launch_paths_key(tmp_path, gfx942, m):
    [(label, call)] = fp8_bmm_calls(fp8_bmm_shapes([m])[:1], gfx942)

    traced = trace_calls([(label, call)], gfx942, FAMILY, FP8_BMM_MODULES)
    launched = launch_path_keys(tmp_path, gfx942, call, FP8_BMM_MODULES)

    assert [job.key for job in traced.jobs] == launched


@pytest.mark.compiles
def test_traced_key_of_own_kernel_equals_the_launch_paths_key_on_sm90(tmp_path, sm90):
    label, call = sample_call("launch_add", 1000, 64)

    traced = trace_calls([(label, call)], sm90, "sample", (SAMPLE_MODULE,))
    launched = launch_path_keys(tmp_path, sm90, call, (SAMPLE_MODULE,))

    assert [job.key for job in traced.jobs] == launched


def test_specialization_classes_of_integers_are_distinct_kernels(sm90):
    # n == 1, n divisible by 16, and any other n fall into three classes; two values of the
    # same class share a kernel.
    calls = [sample_call("launch_add", n, 64) for n in (1, 4096, 8192, 1000, 1001)]
    result = trace_calls(calls, sm90, "sample", (SAMPLE_MODULE,))
    assert result.calls == 5
    assert len(result.jobs) == 3


def test_every_autotune_config_becomes_a_job(sm90):
    configs = importlib.import_module(SAMPLE_MODULE).SCALE_CONFIGS
    for _ in range(2):  # a second trace re-imports the module: no autotuner result leaks in
        result = trace_calls([sample_call("launch_scale", 1000)], sm90, "sample", (SAMPLE_MODULE,))
        blocks = sorted(json.loads(job.specialization)["constant_vals"][-1] for job in result.jobs)
        assert blocks == sorted(config.kwargs["BLOCK"] for config in configs)


def test_heuristics_values_enter_the_specialization(sm90):
    even = trace_calls([sample_call("launch_add", 4096, 64)], sm90, "sample", (SAMPLE_MODULE,))
    odd = trace_calls([sample_call("launch_add", 4097, 64)], sm90, "sample", (SAMPLE_MODULE,))
    assert "EVEN=True" in even.jobs[0].describe_specialization()
    assert "EVEN=False" in odd.jobs[0].describe_specialization()


def test_fp8_bmm_uses_each_targets_own_configs_in_one_process(gfx942, gfx950):
    shapes = fp8_bmm_shapes([1, 200])
    alone_950 = trace_calls(fp8_bmm_calls(shapes, gfx950), gfx950, FAMILY, FP8_BMM_MODULES)
    after_942 = [
        trace_calls(fp8_bmm_calls(shapes, gfx942), gfx942, FAMILY, FP8_BMM_MODULES),
        trace_calls(fp8_bmm_calls(shapes, gfx950), gfx950, FAMILY, FP8_BMM_MODULES),
    ][1]

    assert [job.key for job in after_942.jobs] == [job.key for job in alone_950.jobs]
    options = {json.loads(job.specialization)["options"]["arch"] for job in alone_950.jobs}
    assert options == {"gfx950"}


def test_fp8_dtype_follows_the_target(gfx942, gfx950):
    shapes = fp8_bmm_shapes([1])[:1]
    for target, fp8 in ((gfx942, "fp8e4b8"), (gfx950, "fp8e4nv")):
        [job] = trace_calls(fp8_bmm_calls(shapes, target), target, FAMILY, FP8_BMM_MODULES).jobs
        assert json.loads(job.specialization)["signature"]["b_ptr"] == f"*{fp8}"


def test_aiters_dtypes_on_a_builder_follow_the_target(gfx942, gfx950):
    """AITER reads its FP8 type from the GPU at import; on a builder its `dtypes` answer for the
    target being traced, alone and in the `d_dtypes` table vLLM 0.2x's AITER builders read."""
    import sys

    from kprecompile.platforms.triton_driver import active_target
    from kprecompile.tracing.libraries import import_library_module

    import_library_module("aiter")
    dtypes = sys.modules["aiter.dtypes"]
    for target, fp8, other in (
        (gfx942, torch.float8_e4m3fnuz, torch.float8_e4m3fn),
        (gfx950, torch.float8_e4m3fn, torch.float8_e4m3fnuz),
    ):
        with active_target(target):
            assert dtypes.fp8 is fp8 and dtypes.d_dtypes["fp8"] is fp8 and dtypes.fp8 is not other
            assert dtypes.d_dtypes["bf16"] is dtypes.bf16 is torch.bfloat16
            assert (dtypes.i8, dtypes.u32) == (torch.int8, torch.uint32)


def test_tracing_leaves_the_library_modules_as_it_found_them(gfx942):
    import sys

    before = {name: module for name, module in sys.modules.items() if name.startswith(FP8_BMM_MODULES)}
    trace_calls(fp8_bmm_calls(fp8_bmm_shapes([1]), gfx942), gfx942, FAMILY, FP8_BMM_MODULES)
    after = {name: module for name, module in sys.modules.items() if name.startswith(FP8_BMM_MODULES)}
    assert after == before


def test_a_failing_library_call_names_the_call(sm90):
    def broken():
        torch.empty(3, device="meta").view(2, 2)

    with pytest.raises(TracingError, match=r"tracing sample failed at broken call: RuntimeError: shape"):
        trace_calls([("broken call", broken)], sm90, "sample")


def test_a_trace_split_over_forked_processes_finds_what_one_process_finds():
    """192 FP8 BMM steps in 3 processes (forked after the first step): the same jobs in the same
    order as in one. Control: the split really happened. A step that breaks in a forked process
    is run again here and fails the trace with its own cause, naming the step; one that breaks
    here fails it after the forked process is waited for; a fork the system refuses leaves its
    share to this process."""
    document, _ = run_test_script("forked_trace.py", timeout=600)
    one, three = document["one"], document["three"]
    assert (one["processes"], three["processes"]) == (1, 3)
    assert one["calls"] == three["calls"] == 192 and len(one["jobs"]) > 1
    assert three["jobs"] == one["jobs"]
    for failure in document["failures"]:  # in the forked share, then in this process's own
        assert failure["error"].startswith("tracing sample failed at broken call:")
        assert failure["cause"] == "RuntimeError" and not failure["children_left"]
    refused = document["fork_refused"]  # the second fork refused: its share and the third run here
    assert refused["forks"] == 2 and refused["jobs"] == one["jobs"] and not refused["children_left"]


def test_the_modules_a_trace_swaps_are_read_while_another_thread_imports():
    """`warm` traces while its compile pool starts from a thread of its own, which imports: reading
    `sys.modules` must not fail because another thread changed it (it did, in vLLM 0.33.0's CLI
    warm: "dictionary changed size during iteration"). Another thread adds and removes modules
    throughout; the trace's reading of the matching ones never fails."""
    import threading
    import types

    from kprecompile.tracing.trace import _matching

    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for index in range(50):
                sys.modules[f"kprecompile_churn_{index}"] = types.ModuleType("churn")
            for index in range(50):
                sys.modules.pop(f"kprecompile_churn_{index}", None)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    other = threading.Thread(target=churn)
    other.start()
    try:
        for _ in range(300):
            assert "kprecompile.tracing.trace" in _matching(("kprecompile.",))
    finally:
        stop.set()
        other.join()
        sys.setswitchinterval(interval)


def test_a_wrapper_aiter_makes_a_torch_operator_is_traced_through_its_own_body():
    """AITER's source wraps its FP4 BMM in `torch_compile_guard`; on meta tensors the operator
    runs its fake and launches nothing. Traced, the wrapper is its own body: one kernel. The
    control: the module imported outside a trace is the operator, and nothing is traced."""
    document, _ = run_test_script("guarded_trace.py")
    assert document == {"through_the_body": ["add_kernel"], "as_the_operator": []}


def test_a_split_trace_keeps_each_group_of_steps_in_one_process():
    """A family's steps in storage-major order (a request mix's steps 20 apart, as
    ROCM_AITER_FA's KV-cache storage classes are): dealt over 2 and 3 processes by group, each
    mix's steps land in one share, every step once, in order, the shares within a group of each
    other. Control: dealt step by step, as without groups, some mix is split over two shares."""
    from kprecompile.tracing.forked import shares_of

    mixes = 20
    steps = list(range(1, 2 * mixes))  # the trace's first step ran before the split
    groups = [step % mixes for step in range(2 * mixes)]
    for processes in (2, 3):
        shares = shares_of(steps, processes, groups)
        assert sorted(step for share in shares for step in share) == steps
        assert all(share == sorted(share) for share in shares)
        for share in shares:
            others = {step for other in shares if other is not share for step in other}
            assert not {groups[step] for step in share} & {groups[step] for step in others}
        assert max(map(len, shares)) - min(map(len, shares)) <= 2
    dealt = shares_of(steps, 3)
    assert any(
        len({index for index, share in enumerate(dealt) if step in share or step + mixes in share}) > 1
        for step in range(1, mixes)
    )
