"""silu_mul in cuTile, first version: one small tile of one row per block, fp32 math, default
occupancy, no autotune. x is (rows, 2 * d): gate = x[:, :d], up = x[:, d:]; out is (rows, d).

x is viewed as (rows, 2, d) (same memory, same base address), so that gate and up are the
tiles (row, 0, j) and (row, 1, j) of one array whatever d is; out is viewed as (rows, 1, d)."""

import cuda.tile as ct
import torch

TILE = 1024


@ct.kernel
def silu_mul_kernel(x, out, TILE: ct.Constant[int]):
    row = ct.bid(0)
    j = ct.bid(1)
    gate = ct.load(x, index=(row, 0, j), shape=(1, 1, TILE), padding_mode=ct.PaddingMode.ZERO)
    up = ct.load(x, index=(row, 1, j), shape=(1, 1, TILE), padding_mode=ct.PaddingMode.ZERO)
    gate = ct.astype(gate, ct.float32)
    up = ct.astype(up, ct.float32)
    y = ct.truediv(gate, 1.0 + ct.exp(-gate, rounding_mode=ct.RoundingMode.APPROX), rounding_mode=ct.RoundingMode.APPROX) * up
    ct.store(out, index=(row, 0, j), tile=ct.astype(y, out.dtype))


def run(x, out):
    rows, d = out.shape
    x3 = x.view(rows, 2, d)
    out3 = out.view(rows, 1, d)
    ct.launch(torch.cuda.current_stream(), (rows, ct.cdiv(d, TILE), 1), silu_mul_kernel, (x3, out3, TILE))
    return out
