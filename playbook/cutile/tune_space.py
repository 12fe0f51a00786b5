"""The search space of cutile-autotune: per architecture family, tile constants x occupancy (x
num_ctas for MMA kernels on Blackwell), at most MAX_CONFIGS configs with the current config
first; its code in the tuned module (`_TUNE_SPACES`), and the knobs a tuned module's space owns."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from playbook.cst.source import walk
from playbook.tiles import gemm_tiles

MAX_CONFIGS = 30  # TileGym: more than 30 configs pushes compile times past 5 minutes
SPACE_NAME = "_TUNE_SPACES"
HINTS = ("occupancy", "num_ctas")  # the compiler hints a config may carry


@dataclass(frozen=True)
class Arch:
    """The search space of one architecture family (field survey, TileGym playbook C)."""
    tiles: tuple[int, int]  # smallest and largest tile per dimension
    occupancy: tuple[int, ...]  # with tile knobs
    occupancy_only: tuple[int, ...]  # without tile knobs: every step the budget allows
    num_ctas: tuple[int, ...]  # for MMA kernels; () = not tuned


# MMA kernels: occupancy 1 and 2 only. Their accumulator tiles fill the register file: compiled
# for sm_90, the reference matmul at occupancy 4 and 8 is capped at 128 and 64 registers and
# spills, so those configs would only cost compile and tuning time.
MMA_OCCUPANCY = (1, 2)
ARCHS = {
    "sm_90": Arch((64, 512), (1, 2, 4, 8), (1, 2, 3, 4, 5, 6, 7, 8), ()),
    "sm_100": Arch((128, 1024), (1, 2, 4, 8, 16), (1, 2, 3, 4, 6, 8, 12, 16), (2, 4)),
}
BLACKWELL_MAJOR = 10  # sm_100 / sm_103 use the "sm_100" space; sm_120 (no 2-CTA clusters) and older the "sm_90" one
# One tile constant that a loop inside the kernel walks (a row in chunks: row_sum, the chunked
# norms): the tile sets the bytes each block has in flight per trip, and the first versions' 128
# is far below what a memory-bound row loop needs, so the space reaches up to this many elements.
ROW_LOOP_TILE_MAX = 4096


def arch_for(arch: Arch, row_loop: bool) -> Arch:
    """The architecture's space, with the tile range widened for a row loop (ROW_LOOP_TILE_MAX)."""
    if not row_loop:
        return arch
    return Arch((arch.tiles[0], max(arch.tiles[1], ROW_LOOP_TILE_MAX)), arch.occupancy, arch.occupancy_only,
                arch.num_ctas)


def _dedupe(values) -> list:
    return list(dict.fromkeys(values))


@dataclass(frozen=True)
class Space:
    knobs: tuple[str, ...]
    tiles: tuple[tuple[int, ...], ...]  # current first
    occupancy: tuple[int | None, ...]  # current first (None: the compiler's choice)
    num_ctas: tuple[int | None, ...]  # () = not tuned

    def __len__(self) -> int:
        return len(self.tiles) * len(self.occupancy) * max(len(self.num_ctas), 1)


def tile_options(current: tuple[int, ...], lo: int, hi: int) -> list[tuple[int, ...]]:
    """One tile constant: the current value, then every power of two in [lo, hi]. Several: the
    current tile, each dimension doubled alone, all doubled (a dimension at `hi` is not doubled)."""
    if not current:
        return [()]
    if len(current) == 1:
        return _dedupe([current] + [(v,) for v in (1 << k for k in range(4, 16)) if lo <= v <= hi])
    out = [current]
    for dims in [(d,) for d in range(len(current))] + [tuple(range(len(current)))]:
        new = tuple(v * 2 if d in dims and v * 2 <= hi else v for d, v in enumerate(current))
        out.append(new)
    return _dedupe(out)


def space(arch: Arch, knobs: dict[str, int], occupancy: int | None, num_ctas: int | None, mma: bool) -> Space:
    """The configs of one architecture, at most MAX_CONFIGS. Over budget, occupancy steps go first
    (from the top, down to two values), then num_ctas steps, then tiles from the end; the current
    value of each axis always stays, first. The M, N, K tiles of an MMA kernel also get the large
    GEMM tiles (playbook.tiles.GEMM_TILES) up to the architecture's largest tile, ahead of the
    doubled ones, so a trimmed space keeps them."""
    tiles = tile_options(tuple(knobs.values()), *arch.tiles)
    large = [t for t in gemm_tiles(list(knobs)) if max(t) <= arch.tiles[1]] if mma else []
    tiles = _dedupe([tiles[0], *large, *tiles[1:]])
    occ = _dedupe([occupancy, *(MMA_OCCUPANCY if mma else arch.occupancy if knobs else arch.occupancy_only)])
    ctas = _dedupe([num_ctas, *arch.num_ctas]) if mma and arch.num_ctas else []
    while len(tiles) * len(occ) * max(len(ctas), 1) > MAX_CONFIGS:
        if len(occ) > 2:
            occ.pop()
        elif len(ctas) > 2:
            ctas.pop()
        elif len(tiles) > 1:
            tiles.pop()
        else:  # unreachable: one tile x two occupancies x two cluster sizes fits
            break
    return Space(tuple(knobs), tuple(tiles), tuple(occ), tuple(ctas))


def _literal(v) -> str:
    return "None" if v is None else str(v)


def tuple_code(items) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def space_code(s: Space, indent: str) -> str:
    """`[{...} for ... in ...]`: a list comprehension (a Sequence, never a generator)."""
    names = [k.lower() for k in s.knobs]
    entries = [f'"{k}": {n}' for k, n in zip(s.knobs, names)] + ['"occupancy": occupancy']
    loops = []
    if len(names) == 1:
        loops.append(f"for {names[0]} in {tuple_code([str(t[0]) for t in s.tiles])}")
    elif names:
        loops.append(f"for {', '.join(names)} in {tuple_code([tuple_code([str(v) for v in t]) for t in s.tiles])}")
    loops.append(f"for occupancy in {tuple_code([_literal(v) for v in s.occupancy])}")
    if s.num_ctas:
        entries.append('"num_ctas": num_ctas')
        loops.append(f"for num_ctas in {tuple_code([_literal(v) for v in s.num_ctas])}")
    pad = indent + " "
    return "[{" + ", ".join(entries) + "}\n" + "\n".join(f"{pad}{loop}" for loop in loops) + "]"


def owned_knobs(module: cst.Module) -> frozenset[str]:
    """The knobs (config keys) of the module's tune space, empty when it has none: recipes that
    step one of these by hand (cutile-hint) leave them to the tuner."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if (isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == SPACE_NAME
                                                      for t in small.targets)):
                outer = small.value
                inner = [e.value for e in outer.elements] if isinstance(outer, cst.Dict) else [outer]
                keys = {el.key.evaluated_value for v in inner for d in walk(v) if isinstance(d, cst.Dict)
                        for el in d.elements
                        if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString)}
                return frozenset(keys)
    return frozenset()
