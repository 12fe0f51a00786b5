"""matmul in cuTile, first version: one block per TILE_M x TILE_N tile of C on a 2-D grid
(row-major order, no swizzle), a loop over K in TILE_K steps with ct.mma into an fp32
accumulator, zero padding on ragged edges, modest fixed tiles, default occupancy, no autotune."""

import os

import cuda.tile as ct
import torch

GROUP_SIZE_M = 8


@ct.kernel
def matmul_kernel(a, b, c, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int], TILE_K: ct.Constant[int], GROUP_SIZE_M: ct.Constant[int]):
    # grouped ordering: GROUP_SIZE_M tile rows at a time share their A and B panels in L2
    num_bid_m = ct.num_blocks(0)
    num_bid_n = ct.num_blocks(1)
    bid = ct.bid(1) * num_bid_m + ct.bid(0)  # launch order: axis 0 fastest
    num_bid_in_group = GROUP_SIZE_M * num_bid_n
    group_id = bid // num_bid_in_group
    first_bid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_bid_m - first_bid_m, GROUP_SIZE_M)
    bid_m = first_bid_m + (bid % num_bid_in_group) % group_size_m
    bid_n = (bid % num_bid_in_group) // group_size_m
    num_k = ct.num_tiles(a, axis=1, shape=(TILE_M, TILE_K))
    acc = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    for kt in range(num_k):
        # Partial tiles (past M, N or K) read zeros: they add nothing to the dot products.
        at = ct.load(a, index=(bid_m, kt), shape=(TILE_M, TILE_K), padding_mode=ct.PaddingMode.ZERO)
        bt = ct.load(b, index=(kt, bid_n), shape=(TILE_K, TILE_N), padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(at, bt, acc)
    # The store drops the part of a partial tile that lies outside C.
    ct.store(c, index=(bid_m, bid_n), tile=ct.astype(acc, c.dtype))


# cutile-autotune: run() launches matmul_kernel with the best config of _TUNE_SPACES for its input
# key, found on the first call for the key by ct.tune.exhaustive_search and cached in _TUNED. The
# first config of each space is the kernel as it was. "sm_100": sm_100/sm_103; "sm_90": other GPUs.
_TUNE_SPACES = {
    "sm_90": [{"TILE_M": tile_m, "TILE_N": tile_n, "TILE_K": tile_k, "occupancy": occupancy}
              for tile_m, tile_n, tile_k in ((64, 64, 32), (128, 256, 64), (256, 128, 64), (128, 64, 32), (64, 128, 32), (64, 64, 64), (128, 128, 64))
              for occupancy in (None, 1, 2)],
    "sm_100": [{"TILE_M": tile_m, "TILE_N": tile_n, "TILE_K": tile_k, "occupancy": occupancy, "num_ctas": num_ctas}
               for tile_m, tile_n, tile_k in ((64, 64, 32), (128, 256, 64), (256, 128, 64), (128, 64, 32), (64, 128, 32), (64, 64, 64), (128, 128, 64))
               for occupancy in (None, 1)
               for num_ctas in (None, 2)],
}
_TUNE_WRITES = (2,)  # run() arguments the kernel writes (out): tuned on scratch copies
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


def _launch_plan(cfg, a, b, out):
    """grid, kernel, kernel arguments and compiler hints of the launch under config `cfg`."""
    TILE_M, TILE_N, TILE_K = cfg["TILE_M"], cfg["TILE_N"], cfg["TILE_K"]
    M, K = a.shape
    N = b.shape[1]
    grid = (ct.cdiv(M, TILE_M), ct.cdiv(N, TILE_N), 1)
    return (grid, matmul_kernel, (a, b, out, TILE_M, TILE_N, TILE_K, GROUP_SIZE_M),
            {hint: cfg[hint] for hint in ("occupancy", "num_ctas") if hint in cfg})


def run(a, b, out):
    cfg, kernel = _tuned(a, b, out)
    grid, _, args, _ = _launch_plan(cfg, a, b, out)
    ct.launch(torch.cuda.current_stream(), grid, kernel, args)
    return out
