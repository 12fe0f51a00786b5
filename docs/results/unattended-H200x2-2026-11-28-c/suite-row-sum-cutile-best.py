"""row_sum in cuTile, first version: one row per block, a loop over the row in small tiles into
an fp32 accumulator tile, default occupancy, no autotune."""

import functools

import cuda.tile as ct
import torch

TILE = 2048
BLOCKS_PER_SM = 1  # persistent grid: blocks per SM (the occupancy hint)


@ct.kernel
def row_sum_kernel(x, out, TILE: ct.Constant[int], num_rows: int):
    # persistent: block b computes rows b, b + num_blocks, b + 2 * num_blocks, ...
    for row in range(ct.bid(0), num_rows, ct.num_blocks(0)):
        acc = ct.zeros((1, TILE), dtype=ct.float32)
        for j in range(ct.num_tiles(x, axis=1, shape=(1, TILE))):
            tile = ct.load(x, index=(row, j), shape=(1, TILE), padding_mode=ct.PaddingMode.ZERO)
            acc = acc + ct.astype(tile, ct.float32)
        total = ct.sum(acc, axis=1)  # shape (1,): out[row]
        ct.store(out, index=(row,), tile=ct.astype(total, out.dtype))


@functools.cache
def _sm_count(device: int) -> int:
    """Streaming multiprocessors of a device, asked once per device."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def run(x, out):
    rows, cols = x.shape
    blocks = min(rows, _sm_count(torch.cuda.current_device()) * BLOCKS_PER_SM)
    ct.launch(torch.cuda.current_stream(), (blocks, 1, 1), row_sum_kernel, (x, out, TILE, rows))
    return out
