"""row_sum, first version: one row per program, a loop over the row in small chunks into an
fp32 accumulator, one warp, no autotune."""

import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 1


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + row, total.to(out_ptr.dtype.element_ty))


def run(x, out):
    rows, cols = x.shape
    row_sum_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
