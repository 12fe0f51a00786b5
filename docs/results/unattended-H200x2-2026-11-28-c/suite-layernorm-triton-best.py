"""layernorm, first version: one row per program, three passes over the row in small chunks
(mean, variance, normalize), statistics in fp32, one warp, no autotune."""

import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 1
MAX_ROW_BLOCK = 16384  # widest row the whole-row kernel holds in one block
EPS = 1e-5  # part of the op (spec.EPS), not a tuning knob


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, stride_x, stride_out, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    partial = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        partial += x
    mean = tl.sum(partial, axis=0) / n_cols
    partial = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        d = tl.where(cols < n_cols, x - mean, 0.0)
        partial += d * d
    var = tl.sum(partial, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


# layernorm_kernel with the whole row in one block (BLOCK >= the row width): no chunk loop; x_ptr is still loaded at 2 sites
@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (4, 8, 16, 32)], key=["n_cols"])
@triton.jit
def layernorm_kernel_row(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, stride_x, stride_out, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    partial = tl.zeros([BLOCK], tl.float32)
    # BLOCK covers the whole row: each chunk loop of the kernel runs once, at column 0
    start = 0
    cols = start + tl.arange(0, BLOCK)
    x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    partial += x
    mean = tl.sum(partial, axis=0) / n_cols
    partial = tl.zeros([BLOCK], tl.float32)
    d = tl.where(cols < n_cols, x - mean, 0.0)
    partial += d * d
    var = tl.sum(partial, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    mask = cols < n_cols
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x - mean) * rstd * w + b
    tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def run(x, weight, bias, out):
    rows, cols = x.shape
    row_block = triton.next_power_of_2(cols)
    if row_block <= MAX_ROW_BLOCK:  # the whole row in one block
        layernorm_kernel_row[(rows,)](x, weight, bias, out, cols, x.stride(0), out.stride(0), EPS, BLOCK=row_block)
    else:  # wider rows: the chunked kernel
        layernorm_kernel[(rows,)](x, weight, bias, out, cols, x.stride(0), out.stride(0), EPS,
                                  BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
