"""matmul in cuTile, first version: one block per TILE_M x TILE_N tile of C on a 2-D grid
(row-major order, no swizzle), a loop over K in TILE_K steps with ct.mma into an fp32
accumulator, zero padding on ragged edges, modest fixed tiles, default occupancy, no autotune."""

import cuda.tile as ct
import torch

TILE_M = 256
TILE_N = 64
TILE_K = 32


@ct.kernel
def matmul_kernel(a, b, c, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int], TILE_K: ct.Constant[int]):
    bid_m = ct.bid(0)
    bid_n = ct.bid(1)
    num_k = ct.num_tiles(a, axis=1, shape=(TILE_M, TILE_K))
    acc = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    for kt in range(num_k):
        # Partial tiles (past M, N or K) read zeros: they add nothing to the dot products.
        at = ct.load(a, index=(bid_m, kt), shape=(TILE_M, TILE_K), padding_mode=ct.PaddingMode.ZERO)
        bt = ct.load(b, index=(kt, bid_n), shape=(TILE_K, TILE_N), padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(at, bt, acc)
    # The store drops the part of a partial tile that lies outside C.
    ct.store(c, index=(bid_m, bid_n), tile=ct.astype(acc, c.dtype))


def run(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    grid = (ct.cdiv(M, TILE_M), ct.cdiv(N, TILE_N), 1)
    ct.launch(torch.cuda.current_stream(), grid, matmul_kernel, (a, b, out, TILE_M, TILE_N, TILE_K))
    return out
