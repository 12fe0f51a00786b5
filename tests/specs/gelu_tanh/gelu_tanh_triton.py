"""GELU with the tanh approximation: outputs near zero on the negative tail, where an all-zero
output is within bf16's tolerance on several percent of the elements; a spec for it must pass
`tileloop check`, and a kernel that writes zeros must not."""

import torch
import triton
import triton.language as tl

BLOCK = 256


@triton.jit
def gelu_tanh_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
    tl.store(y_ptr + offs, (0.5 * x * (1.0 + tanh)).to(y_ptr.dtype.element_ty), mask=mask)


def run(x):
    y = torch.empty_like(x)
    n = x.numel()
    gelu_tanh_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK)
    return y
