"""layernorm in cuTile, first version: one row per block, the whole row as one tile of
next_power_of_2(cols) columns, statistics in fp32, default occupancy, no autotune."""

import os

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


# cutile-autotune: run() launches layernorm_kernel with the best config of _TUNE_SPACES for its input
# key, found on the first call for the key by ct.tune.exhaustive_search and cached in _TUNED. The
# first config of each space is the kernel as it was. "sm_100": sm_100/sm_103; "sm_90": other GPUs.
_TUNE_SPACES = {
    "sm_90": [{"occupancy": occupancy}
              for occupancy in (None, 1, 2, 3, 4, 5, 6, 7, 8)],
    "sm_100": [{"occupancy": occupancy}
               for occupancy in (None, 1, 2, 3, 4, 6, 8, 12, 16)],
}
_TUNE_WRITES = (3,)  # run() arguments the kernel writes (out): tuned on scratch copies
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


def _launch_plan(cfg, x, weight, bias, out):
    """grid, kernel, kernel arguments and compiler hints of the launch under config `cfg`."""
    rows, cols = x.shape
    return ((rows, 1, 1), layernorm_kernel, (x, weight.view(1, cols), bias.view(1, cols), out, cols, EPS, next_power_of_2(cols)),
            {hint: cfg[hint] for hint in ("occupancy", "num_ctas") if hint in cfg})


def run(x, weight, bias, out):
    cfg, kernel = _tuned(x, weight, bias, out)
    grid, _, args, _ = _launch_plan(cfg, x, weight, bias, out)
    ct.launch(torch.cuda.current_stream(), grid, kernel, args)
    return out
