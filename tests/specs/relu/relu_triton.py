"""ReLU, an activation whose outputs are half exact zeros: a spec for it must pass `tileloop check`
(zeros fail on the positive half), and a kernel that writes zeros must not."""

import torch
import triton
import triton.language as tl

BLOCK = 256


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


def run(x):
    y = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK)
    return y
