"""attention forward in cuTile, first version: flash-style, one block per (query tile,
batch * head), a loop over key/value tiles with the online softmax in fp32 (exp2, scale folded
in), masks on every key tile (ragged seq and causal) rather than only where needed, small fixed
tiles, default occupancy, no autotune."""

import math

import cuda.tile as ct
import torch

TILE_M = 32
TILE_N = 32


@ct.kernel
def attention_kernel(q, k, v, out, heads, qk_scale: float,
                     HEAD_DIM: ct.Constant[int], CAUSAL: ct.Constant[int],
                     TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]):
    bid_m = ct.bid(0)
    bid_bh = ct.bid(1)
    b = bid_bh // heads
    h = bid_bh % heads
    seq = q.shape[2]

    # Query rows past seq read zeros (finite scores; their output rows are dropped by the store).
    qt = ct.load(q, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                 padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))
    offs_m = (bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32))[:, None]  # (TILE_M, 1)
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]  # (1, TILE_N)

    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32)

    if CAUSAL:
        # keys past the last query row of this tile are all masked; never past seq, so no key
        # tile lies wholly outside the array
        num_n = ct.cdiv(min((bid_m + 1) * TILE_M, seq), TILE_N)
    else:
        num_n = ct.cdiv(seq, TILE_N)

    # Tile 0 holds key 0, which every query row sees, so m_i is finite after it and masked
    # (-inf) scores give exp2(-inf - m_i) = 0, never -inf - -inf = NaN.
    for j in range(num_n):
        # k tile loaded transposed: kt[d, n] = k[b, h, j * TILE_N + n, d]; keys past seq read zeros
        kt = ct.load(k, index=(b, h, 0, j), shape=(1, 1, HEAD_DIM, TILE_N), order=(0, 1, 3, 2),
                     padding_mode=ct.PaddingMode.ZERO).reshape((HEAD_DIM, TILE_N))
        s = ct.mma(qt, kt, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        offs_n = j * TILE_N + offs_n_tile
        valid = ct.full((TILE_M, TILE_N), True, dtype=ct.bool_) & (offs_n < seq)
        if CAUSAL:
            valid = valid & (offs_m >= offs_n)
        s = ct.where(valid, s * qk_scale, -math.inf)  # keys past seq (zero-padded) get -inf too

        m_new = ct.maximum(m_i, ct.max(s, axis=1, keepdims=True))
        p = ct.exp2(s - m_new)
        alpha = ct.exp2(m_i - m_new)
        l_i = l_i * alpha + ct.sum(p, axis=1, keepdims=True)
        # v rows past seq must be zeros, not garbage: p is 0 there, but 0 * NaN would be NaN
        vt = ct.load(v, index=(b, h, j, 0), shape=(1, 1, TILE_N, HEAD_DIM),
                     padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, HEAD_DIM))
        acc = ct.mma(ct.astype(p, q.dtype), vt, acc * alpha)
        m_i = m_new

    o = ct.astype(acc / l_i, out.dtype).reshape((1, 1, TILE_M, HEAD_DIM))
    ct.store(out, index=(b, h, bid_m, 0), tile=o)  # rows past seq are dropped


def run(q, k, v, causal, out):
    batch, heads, seq, head_dim = q.shape
    qk_scale = 1.0 / math.sqrt(head_dim) * 1.4426950408889634  # sm_scale * log2(e), for exp2
    grid = (ct.cdiv(seq, TILE_M), batch * heads, 1)
    ct.launch(torch.cuda.current_stream(), grid, attention_kernel,
              (q, k, v, out, heads, qk_scale, head_dim, int(causal), TILE_M, TILE_N))
    return out
