"""vector_add in cuTile, first version: a small tile per block, default occupancy, no autotune."""

import cuda.tile as ct
import torch

TILE = 1024


@ct.kernel
def add_kernel(x, y, out, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    a = ct.load(x, index=(bid,), shape=(TILE,))
    b = ct.load(y, index=(bid,), shape=(TILE,))
    ct.store(out, index=(bid,), tile=a + b)


def run(x, y, out):
    n = out.numel()
    ct.launch(torch.cuda.current_stream(), (ct.cdiv(n, TILE), 1, 1), add_kernel, (x, y, out, TILE))
    return out
