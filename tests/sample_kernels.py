"""Small Triton kernels of the tests' own, with launchers that run them on meta tensors.

Workers import this module by name in fresh processes (spawn passes sys.path along); only the
launchers need torch, so a compile worker that merely resolves a kernel here never imports it
(about 1.7 s saved per worker). The fault kernel misbehaves inside the compiler on purpose, at
compile time only, through a `triton.constexpr_function`: code 13 segfaults, code 14 hangs,
code 15 fails a static assertion (a real compile error).
"""

import ctypes
import time

import triton
import triton.language as tl

# Reached through a dict: Triton refuses kernels that reference plain callables.
_FAULTS = {"segfault": lambda: ctypes.string_at(0), "hang": lambda: time.sleep(3600)}
SEGFAULT, HANG, STATIC_ASSERT = 13, 14, 15


@triton.constexpr_function
def _misbehave(code):
    if code == SEGFAULT:
        _FAULTS["segfault"]()
    if code == HANG:
        _FAULTS["hang"]()
    return code


@triton.jit
def fault_kernel(out_ptr, CODE: tl.constexpr):
    tl.static_assert(CODE != 15, "code 15 never compiles")
    tl.store(out_ptr, _misbehave(CODE))


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))
    else:
        mask = offsets < n
        total = tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, total, mask=mask)


SCALE_CONFIGS = [
    triton.Config({"BLOCK": 32}, num_warps=1),
    triton.Config({"BLOCK": 64}, num_warps=2),
    triton.Config({"BLOCK": 128}, num_warps=4),
]


@triton.autotune(configs=SCALE_CONFIGS, key=["n"])
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)


def launch_fault(code: int, device: str = "meta") -> None:
    import torch

    out = torch.empty(4, dtype=torch.int32, device=device)
    fault_kernel[(1,)](out, code)


def launch_add(n: int, block: int = 64, device: str = "meta"):
    import torch

    x = torch.empty(n, dtype=torch.float32, device=device)
    y = torch.empty(n, dtype=torch.float32, device=device)
    out = torch.empty(n, dtype=torch.float32, device=device)
    add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
    return out


def launch_scale(n: int, device: str = "meta") -> None:
    import torch

    x = torch.empty(n, dtype=torch.float32, device=device)
    out = torch.empty(n, dtype=torch.float32, device=device)
    scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
