"""The configs of an @triton.autotune the playbook writes: block sizes x num_warps x num_stages
around the launch's current config (the current one always among them), and the decorator's
code; and the launch options a triton.Config cannot carry."""

from __future__ import annotations

from playbook.tiles import gemm_tiles

MAX_CONFIGS = 24
BLOCK_LIMIT_1D = 16384  # one block constexpr: elements per program
BLOCK_LIMIT_ND = 256  # several block constexprs (2-D tiles of a dot kernel): per dimension
CONFIG_OPTIONS = {"num_warps", "num_stages"}
UNSUPPORTED_LAUNCH_OPTIONS = {"num_ctas", "maxnreg", "occupancy"}  # a Config would silently override them


def block_space(values: list[int], wide: bool = False, names: list[str] | None = None) -> list[tuple[int, ...]]:
    """Block sizes to try, the current one first: one constexpr -> x1, x2, x4, x8 (halvings if the
    limit is near), or x1 ... x32 when `wide` (a chunk of a row that a loop walks: the chunk sets
    the bytes in flight per program, and a first version's small chunk is often 8-32x too small);
    several -> current, first x2, second x2, both x2 (per-dimension limit 256), and for the
    M, N, K blocks of a GEMM (`names`) the large tiles of GEMM_TILES too."""
    if len(values) == 1:
        v, n = values[0], (6 if wide else 4)
        up = [v << k for k in range(n) if v << k <= BLOCK_LIMIT_1D]
        down = [v >> k for k in range(1, n) if v >> k >= 16]
        return [(b,) for b in sorted((up + down)[:n])]
    out: list[tuple[int, ...]] = [tuple(values)]
    for dims in ((0,), (1,), (0, 1)):
        new = list(values)
        for d in dims:
            new[d] = values[d] * 2 if values[d] * 2 <= BLOCK_LIMIT_ND else values[d] // 2
        if min(new) >= 16 and tuple(new) not in out:
            out.append(tuple(new))
    out += [t for t in gemm_tiles(names or []) if t not in out]
    return out


def option_space(current_warps: int | None, current_stages: int | None, loop: bool, dot: bool,
                 n_blocks: int, wide: bool = False) -> tuple[list[int], list[int]]:
    if wide:
        # a row loop over large chunks wants 8-16 warps to keep a chunk's loads in flight; the
        # pipelining depth is left to the compiler (its default, 3, is the first version's)
        return sorted({current_warps or 4, 4, 8, 16}), ([current_stages] if current_stages else [])
    warps = sorted({current_warps or 4, 4, 8})
    if loop:
        stages = sorted({current_stages or 3} | ({3, 4} if dot else {2, 3}))
    else:
        stages = [current_stages] if current_stages else []  # no loop: nothing to pipeline
    if n_blocks * len(warps) * max(len(stages), 1) > MAX_CONFIGS and stages:
        stages = sorted({current_stages or 3, (current_stages or 3) + 1})
    if n_blocks * len(warps) * max(len(stages), 1) > MAX_CONFIGS:
        warps = sorted({current_warps or 4, 8 if (current_warps or 4) != 8 else 4})
    return warps, stages


# A launch whose block size the wrapper computes per width (one block per row, next_power_of_2 of
# the row) keeps that block; its warps are what the space tunes: the 4-32 a row of up to 64K
# elements wants (published row kernels pick them from the block size).
WIDE_WARPS = (4, 8, 16, 32)


def warps_space(current_warps: int | None, current_stages: int | None, loop: bool,
                dot: bool) -> tuple[list[int], list[int]]:
    """num_warps x num_stages for a launch whose block sizes stay as they are."""
    warps = sorted({*WIDE_WARPS, *([current_warps] if current_warps else [])})
    if loop:
        stages = sorted({current_stages or 3} | ({3, 4} if dot else {2, 3}))
    else:
        stages = [current_stages] if current_stages else []
    return warps, stages


def _tuple(items: list) -> str:
    return "(" + ", ".join(map(str, items)) + ("," if len(items) == 1 else "") + ")"


def decorator_code(tt: str, kws: list[str], combos: list[tuple[int, ...]], warps: list[int], stages: list[int],
                   key: list[str]) -> str:
    names = [k.lower() for k in kws]
    meta = ", ".join(f'"{k}": {n}' for k, n in zip(kws, names))
    opts = "num_warps=warps" + (", num_stages=stages" if stages else "")
    if not kws:  # no block size tuned: the configs are launch options alone
        loops = []
    elif len(kws) == 1:
        loops = [f"for {names[0]} in {_tuple([c[0] for c in combos])}"]
    else:
        loops = [f"for {', '.join(names)} in {_tuple([_tuple(list(c)) for c in combos])}"]
    loops.append(f"for warps in {_tuple(warps)}")
    if stages:
        loops.append(f"for stages in {_tuple(stages)}")
    body = "\n".join(f"        {line}" for line in loops)
    keys = ", ".join(f'"{k}"' for k in key)
    return (f"@{tt}.autotune(\n"
            f"    configs=[\n"
            f"        {tt}.Config({{{meta}}}, {opts})\n"
            f"{body}\n"
            f"    ],\n"
            f"    key=[{keys}],\n"
            f")\n")
