"""layernorm in cuTile, first version: one row per block, the whole row as one tile of
next_power_of_2(cols) columns, statistics in fp32, default occupancy, no autotune."""

import cuda.tile as ct
import torch

EPS = 1e-5  # part of the op (spec.EPS), not a tuning knob


def next_power_of_2(n):
    return 1 << (n - 1).bit_length()


@ct.kernel
def layernorm_kernel(x, weight, bias, out, n_cols: int, eps: float, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    # columns past n_cols load as 0, so they add nothing to the sum
    tx = ct.astype(ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    mean = ct.sum(tx, axis=1, keepdims=True) / n_cols  # divide by the true width, not TILE_N
    # padded columns would contribute (0 - mean)^2 to the variance: mask them out
    in_row = ct.reshape(ct.arange(TILE_N, dtype=ct.int32) < n_cols, (1, TILE_N))
    centered = ct.where(in_row, tx - mean, ct.zeros((1, TILE_N), dtype=ct.float32))
    var = ct.sum(centered * centered, axis=1, keepdims=True) / n_cols
    rstd = ct.rsqrt(var + eps)
    tw = ct.astype(ct.load(weight, index=(0, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    tb = ct.astype(ct.load(bias, index=(0, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    y = centered * rstd * tw + tb
    ct.store(out, index=(row, 0), tile=ct.astype(y, out.dtype))  # columns past n_cols are not stored


def run(x, weight, bias, out):
    rows, cols = x.shape
    ct.launch(torch.cuda.current_stream(), (rows, 1, 1), layernorm_kernel,
              (x, weight.view(1, cols), bias.view(1, cols), out, cols, EPS, next_power_of_2(cols)))
    return out
