"""vector_add, first version: one small block per program, one warp, no autotune."""

import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": block}, num_warps=warps)
        for block in (128, 256, 512, 1024)
        for warps in (1, 4, 8)
    ],
    key=["n"],
)
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def run(x, y, out):
    n = out.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out
