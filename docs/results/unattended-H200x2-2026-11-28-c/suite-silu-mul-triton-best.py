"""silu_mul, first version: one row per program, a loop over the row in small chunks, fp32 math,
one warp, no autotune. x is (rows, 2 * d): gate = x[:, :d], up = x[:, d:]; out is (rows, d)."""

import triton
import triton.language as tl

BLOCK = 256
NUM_WARPS = 1


@triton.jit
def silu_mul_kernel(x_ptr, out_ptr, d, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    for start in range(0, d, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < d
        gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_row + d + cols, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def run(x, out):
    rows, d = out.shape
    silu_mul_kernel[(rows,)](x, out, d, x.stride(0), out.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
