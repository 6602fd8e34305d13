"""A Triton kernel no kprecompile family plans, for `gpu_record_replay.py`: a model's own operator
(RMS-normalize each row), importable by name so that a warm can compile what serving recorded."""

import triton
import triton.language as tl


@triton.jit
def rms_norm_rows_kernel(x_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n_cols
    x = tl.load(x_ptr + row * n_cols + offsets, mask=mask, other=0.0).to(tl.float32)
    rms = tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(out_ptr + row * n_cols + offsets, (x / rms).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_rows(x, eps: float = 1e-6):
    import torch

    out = torch.empty_like(x)
    rows, cols = x.shape
    rms_norm_rows_kernel[(rows,)](x, out, cols, eps, BLOCK=triton.next_power_of_2(cols))
    return out


def reference(x, eps: float = 1e-6):
    x = x.float()
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
