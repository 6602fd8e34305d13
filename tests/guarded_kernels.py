"""A Triton launch inside a wrapper that AITER's `torch_compile_guard` makes a torch operator, as
AITER's source does for its FP4 BMM and several GEMMs: its meta kernel is the fake given, which
only allocates, so on meta tensors the operator launches nothing."""

import torch
import triton
from aiter.jit.utils.torch_guard import torch_compile_guard
from sample_kernels import add_kernel

BLOCK = 64


def _fake(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out


@torch_compile_guard(mutates_args=["out"], gen_fake=_fake)
def kprecompile_test_guarded_add(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    add_kernel[(triton.cdiv(n, BLOCK),)](x, x, out, n, BLOCK=BLOCK)
    return out


def launch(n: int) -> None:
    x = torch.empty(n, dtype=torch.float32, device="meta")
    kprecompile_test_guarded_add(x, torch.empty_like(x))
