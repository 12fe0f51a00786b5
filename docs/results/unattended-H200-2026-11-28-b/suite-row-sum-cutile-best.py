"""row_sum in cuTile, first version: one row per block, a loop over the row in small tiles into
an fp32 accumulator tile, default occupancy, no autotune."""

import cuda.tile as ct
import torch

TILE = 128


@ct.kernel
def row_sum_kernel(x, out, TILE: ct.Constant[int]):
    row = ct.bid(0)
    acc = ct.zeros((1, TILE), dtype=ct.float32)
    for j in range(ct.num_tiles(x, axis=1, shape=(1, TILE))):
        tile = ct.load(x, index=(row, j), shape=(1, TILE), padding_mode=ct.PaddingMode.ZERO)
        acc = acc + ct.astype(tile, ct.float32)
    total = ct.sum(acc, axis=1)  # shape (1,): out[row]
    ct.store(out, index=(row,), tile=ct.astype(total, out.dtype))


def run(x, out):
    rows, cols = x.shape
    ct.launch(torch.cuda.current_stream(), (rows, 1, 1), row_sum_kernel, (x, out, TILE))
    return out
