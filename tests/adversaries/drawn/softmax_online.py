"""The honest counterpart of softmax_without_max: two passes as well, the maximum kept on the way
(online softmax: each lane's running sum rescaled whenever its running maximum grows), so exp never
sees a positive argument."""

import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 1


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, x)
        base = tl.where(new_max == float("-inf"), 0.0, new_max)  # a lane that has seen nothing yet
        lane_sum = lane_sum * tl.exp(lane_max - base) + tl.exp(x - base)
        lane_max = new_max
    row_max = tl.max(lane_max, axis=0)
    denom = tl.sum(lane_sum * tl.exp(lane_max - row_max), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        tl.store(out_row + cols, (tl.exp(x - row_max) / denom).to(out_ptr.dtype.element_ty), mask=cols < n_cols)


def run(x, out):
    rows, cols = x.shape
    softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
