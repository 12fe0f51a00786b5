"""softmax, first version: one row per program, three passes over the row in small chunks,
one warp, no autotune."""

import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 1
MAX_ROW_BLOCK = 16384  # widest row the whole-row kernel holds in one block


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    running_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        running_max = tl.maximum(running_max, x)
    row_max = tl.max(running_max, axis=0)
    partial = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        partial += tl.exp2((x - row_max) * 1.4426950408889634)
    denom = tl.sum(partial, axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        y = tl.exp2((x - row_max) * 1.4426950408889634) / denom
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


# softmax_kernel with the whole row in one block (BLOCK >= the row width): the row is read once
@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (4, 8, 16, 32)], key=["n_cols"])
@triton.jit
def softmax_kernel_row(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    running_max = tl.full([BLOCK], float("-inf"), tl.float32)
    # BLOCK covers the whole row: each chunk loop of the kernel runs once, at column 0
    start = 0
    cols = start + tl.arange(0, BLOCK)
    x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    running_max = tl.maximum(running_max, x)
    row_max = tl.max(running_max, axis=0)
    partial = tl.zeros([BLOCK], tl.float32)
    partial += tl.exp2((x - row_max) * 1.4426950408889634)
    denom = tl.sum(partial, axis=0)
    y = tl.exp2((x - row_max) * 1.4426950408889634) / denom
    tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


def run(x, out):
    rows, cols = x.shape
    row_block = triton.next_power_of_2(cols)
    if row_block <= MAX_ROW_BLOCK:  # the whole row in one block, read once
        softmax_kernel_row[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=row_block)
    else:  # wider rows: the chunked kernel
        softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
