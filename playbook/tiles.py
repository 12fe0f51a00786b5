"""Tile shapes that the autotune spaces of both languages lead with for dot kernels: the large
tiles that doubling a first version's small tiles one dimension at a time never reaches."""

from __future__ import annotations

# The large tiles of a GEMM on Hopper-class GPUs (M x N x K): the Triton tutorial's matmul
# configs and the NVIDIA skill's DOT template both lead with 128x256x64 and 256x128x64, which
# doubling a first version's 64x64x32 once per dimension never reaches.
GEMM_TILES = ((128, 256, 64), (256, 128, 64))
# Dot kernels with M and N blocks only (the reduction dimension fixed, as flash attention's head
# dimension): the Triton fused-attention tutorial's Hopper configs lead with 128x64 and 128x128
# query x key tiles. On an H200 the reference attention, tuned over 32-64 tiles only, ended at
# 0.69x (Triton) and 0.66x (cuTile) of torch.compile (suite of 2026-11-22).
DOT2_TILES = ((128, 64), (128, 128))


def gemm_tiles(names: list[str]) -> list[tuple[int, ...]]:
    """The large tiles in the order of `names`: GEMM_TILES when those are exactly the M, N and K
    block constexprs (BLOCK_M / BLOCK_SIZE_N / ..._K, in any order), DOT2_TILES when they are
    exactly M and N; no tiles otherwise."""
    pos = {n.rsplit("_", 1)[-1]: i for i, n in enumerate(names) if "_" in n}
    if len(names) == 3 and set(pos) == {"M", "N", "K"}:
        tiles, axes = GEMM_TILES, "MNK"
    elif len(names) == 2 and set(pos) == {"M", "N"}:
        tiles, axes = DOT2_TILES, "MN"
    else:
        return []
    out = []
    for tile in tiles:
        placed = [0] * len(names)
        for axis, v in zip(axes, tile):
            placed[pos[axis]] = v
        out.append(tuple(placed))
    return out
