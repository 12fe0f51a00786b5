"""attention forward in cuTile, first version: flash-style, one block per (query tile,
batch * head), a loop over key/value tiles with the online softmax in fp32 (exp2, scale folded
in), masks on every key tile (ragged seq and causal) rather than only where needed, small fixed
tiles, default occupancy, no autotune."""

import os

import math

import cuda.tile as ct
import torch


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
                 padding_mode=ct.PaddingMode.ZERO, latency=2).reshape((TILE_M, HEAD_DIM))
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
                     padding_mode=ct.PaddingMode.ZERO, latency=2).reshape((HEAD_DIM, TILE_N))
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
                     padding_mode=ct.PaddingMode.ZERO, latency=2).reshape((TILE_N, HEAD_DIM))
        acc = ct.mma(ct.astype(p, q.dtype), vt, acc * alpha)
        m_i = m_new

    o = ct.astype(acc / l_i, out.dtype).reshape((1, 1, TILE_M, HEAD_DIM))
    ct.store(out, index=(b, h, bid_m, 0), tile=o)  # rows past seq are dropped


# cutile-autotune: run() launches attention_kernel with the best config of _TUNE_SPACES for its input
# key, found on the first call for the key by ct.tune.exhaustive_search and cached in _TUNED. The
# first config of each space is the kernel as it was. "sm_100": sm_100/sm_103; "sm_90": other GPUs.
_TUNE_SPACES = {
    "sm_90": [{"TILE_M": tile_m, "TILE_N": tile_n, "occupancy": occupancy}
              for tile_m, tile_n in ((32, 32), (64, 32), (32, 64), (64, 64))
              for occupancy in (None, 1, 2)],
    "sm_100": [{"TILE_M": tile_m, "TILE_N": tile_n, "occupancy": occupancy, "num_ctas": num_ctas}
               for tile_m, tile_n in ((32, 32), (64, 32), (32, 64), (64, 64))
               for occupancy in (None, 1)
               for num_ctas in (None, 2, 4)],
}
_TUNE_WRITES = (4,)  # run() arguments the kernel writes (out): tuned on scratch copies
_TUNED = {}  # input key -> (config, kernel with the config's hints)


def _tune_space():
    major, _ = torch.cuda.get_device_capability()
    return _TUNE_SPACES["sm_100" if major == 10 else "sm_90"]


def _scratch(value):
    """A copy of a tensor in new memory with the same layout (anything else as it is)."""
    if not isinstance(value, torch.Tensor):
        return value
    copy = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
    return copy.copy_(value)


def _tuned(*args):
    """(config, kernel with its hints) for run(*args): tuned on the first call with a new input key
    (shapes, dtypes, strides and devices of the tensors, values of the scalars), cached after."""
    key = tuple((tuple(a.shape), a.dtype, a.stride(), a.device) if isinstance(a, torch.Tensor)
                else a if isinstance(a, (bool, int, float, str, type(None))) else type(a).__name__ for a in args)
    if key not in _TUNED:
        _TUNED[key] = _autotune(args)
    return _TUNED[key]


def _autotune(args):
    space = _tune_space()
    if os.environ.get("DISABLE_CUTILE_TUNE") == "1":  # TileGym convention: the first config, no tuning trials
        cfg = space[0]
    else:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("run() met a new input key during CUDA-graph capture, where it cannot tune: "
                               "call it once with inputs of these shapes before capturing")
        tune_args = tuple(_scratch(a) if i in _TUNE_WRITES else a for i, a in enumerate(args))

        def part(i):
            return lambda cfg: _launch_plan(cfg, *tune_args)[i]

        result = ct.tune.exhaustive_search(space, torch.cuda.current_stream(), part(0), part(1), part(2),
                                           hints_fn=part(3), quiet=True)
        best = result.best
        # within the timing noise (the two 95% margins, or 2%) a config ties with the best; the
        # earliest tie wins (the kernel as it was first), so the pick does not flip between runs
        ties = [m for m in result.successes
                if m.mean_us - best.mean_us <= max(m.error_margin_us + best.error_margin_us, 0.02 * best.mean_us)]
        cfg = min(ties, key=lambda m: space.index(m.config)).config
    _, kernel, _, hints = _launch_plan(cfg, *args)
    return cfg, kernel.replace_hints(**hints)


def _launch_plan(cfg, q, k, v, causal, out):
    """grid, kernel, kernel arguments and compiler hints of the launch under config `cfg`."""
    TILE_M, TILE_N = cfg["TILE_M"], cfg["TILE_N"]
    batch, heads, seq, head_dim = q.shape
    qk_scale = 1.0 / math.sqrt(head_dim) * 1.4426950408889634  # sm_scale * log2(e), for exp2
    grid = (ct.cdiv(seq, TILE_M), batch * heads, 1)
    return (grid, attention_kernel, (q, k, v, out, heads, qk_scale, head_dim, int(causal), TILE_M, TILE_N),
            {hint: cfg[hint] for hint in ("occupancy", "num_ctas") if hint in cfg})


def run(q, k, v, causal, out):
    cfg, kernel = _tuned(q, k, v, causal, out)
    grid, _, args, _ = _launch_plan(cfg, q, k, v, causal, out)
    ct.launch(torch.cuda.current_stream(), grid, kernel, args)
    return out
