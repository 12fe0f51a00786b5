"""row_sum in blocks of 4096: a row that fits one block is read with a mask; a wider row is walked in
whole blocks without one (every wider width the spec lists, 8192 and 16384, is a multiple of 4096),
so the rest of a row past its last whole block is never added. Right at every width the spec lists;
wrong on every row at widths such as 5000 or 6144."""

import triton
import triton.language as tl

BLOCK = 4096
NUM_WARPS = 4


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, n_whole, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    cols = tl.arange(0, BLOCK)
    if n_cols <= BLOCK:
        total = tl.sum(tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32), axis=0)
    else:
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_whole, BLOCK):
            acc += tl.load(x_row + start + cols).to(tl.float32)
        total = tl.sum(acc, axis=0)
    tl.store(out_ptr + row, total.to(out_ptr.dtype.element_ty))


def run(x, out):
    rows, cols = x.shape
    row_sum_kernel[(rows,)](x, out, cols, cols - cols % BLOCK, x.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
