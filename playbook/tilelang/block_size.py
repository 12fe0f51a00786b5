"""Recipe `tilelang-block-size`: one block size of a TileLang kernel, swept over powers of two.

For a dot kernel (`T.gemm`), each of its tile parameters `block_M`, `block_N`, `block_K` is one
variable: the step up doubles it and sweeps the doublings that stay within BLOCK_LIMITS and the
tile's budget (playbook/tilelang/budget.py: shared memory for the pipelined operand tiles, accumulator
registers per thread); one step down (a second thought, tier 1) sweeps the halvings down to the floor.
For an element-wise kernel, the block is the extent of its `T.Parallel` loop: doublings up to 16x,
while each thread holds at most ELEMENTS_PER_THREAD[1] elements, and halvings while every thread has
one. The value is changed where the source states it (the module constant the compile call passes,
or the literal), so the grid (`T.ceildiv(n, block)`) and the loop move together.
"""

from __future__ import annotations

from playbook.analysis import Analysis
from playbook.cst.source import Skip
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register
from playbook.tilelang.budget import ELEMENTS_PER_THREAD, FIELDS, Tile, step, tile_of
from playbook.tilelang.program import Kernel, Knob, Program, block_knobs, element_block, is_dot, read, threads_knob

BLOCK_LIMITS = {"M": (16, 256), "N": (16, 256), "K": (16, 128)}  # WGMMA: n <= 256; k-tiles past 128 only cost smem
SWEEP_DOUBLINGS, SWEEP_HALVINGS = 4, 2  # how many values a sweep times up and (a second thought) down
ELEMENT_LIMIT = 16384

HYPOTHESES = {
    "M": ("block_M {old} -> {new}: each program computes more rows of C, so every B tile it loads serves more "
          "of them (arithmetic intensity up); expect 10-60% on large compute-bound shapes, a loss where fewer "
          "programs leave SMs idle or the accumulator spills"),
    "N": ("block_N {old} -> {new}: each program computes more columns of C, so every A tile it loads serves "
          "more of them; expect 10-60% on large shapes (bigger MMA tiles), a loss where too few programs fill "
          "the GPU"),
    "K": ("block_K {old} -> {new}: longer steps of the K loop, fewer iterations and barriers, more shared memory "
          "per stage; expect 0-15%, a loss where shared memory then limits the stages or the programs per SM"),
    "block": ("block {old} -> {new} elements per program: more bytes in flight per program and fewer programs; "
              "expect 5-40% while the kernel is latency- or launch-bound, a loss once registers spill"),
}
DOWN = ("{name} {old} -> {new}: a smaller tile, so more programs, each with fewer registers and less shared memory; "
        "expect a gain where the larger tile spilled or left SMs idle (small or ragged shapes), a loss on large shapes")


def hypothesis(name: str, letter: str, old: int, new: object, up: bool) -> str:
    """The hypothesis of a step of one block size, in its direction."""
    return (HYPOTHESES[letter] if up else DOWN).format(name=name, old=old, new=new)


def _dot_values(tile: Tile, letter: str, knob: Knob, up: bool) -> list[int]:
    low, high = BLOCK_LIMITS[letter]
    out = []
    for i in range(1, (SWEEP_DOUBLINGS if up else SWEEP_HALVINGS) + 1):
        v = knob.value * 2 ** i if up else knob.value // 2 ** i
        if not low <= v <= high or (v & (v - 1)):
            break
        if tile.with_value(FIELDS[letter], v).fits():
            out.append(v)
    return out


def _element_values(knob: Knob, threads: int, up: bool) -> list[int]:
    low, high = ELEMENTS_PER_THREAD[0] * threads, min(ELEMENTS_PER_THREAD[1] * threads, ELEMENT_LIMIT)
    values = [knob.value * 2 ** i if up else knob.value // 2 ** i
              for i in range(1, (SWEEP_DOUBLINGS if up else SWEEP_HALVINGS) + 1)]
    return [v for v in values if low <= v <= high]


@register
class BlockSize(PatternRecipe):
    id = "tilelang-block-size"
    title = "One block size (block_M, block_N, block_K, or an element-wise block), swept over powers of two"
    languages = ("tilelang",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        program = read(source, analysis)
        out, reasons = per_kernel(program.kernels, lambda name, k: self._kernel(program, k), analysis)
        return proposed([c for cands in out for c in cands], reasons)

    def _kernel(self, program: Program, kernel: Kernel) -> list[Candidate]:
        if is_dot(kernel, program):
            return self._dot(program, kernel)
        knob = element_block(kernel, program)
        if knob is None:
            raise Skip(f"{kernel.name}: no T.Parallel loop whose extent the source states as an integer")
        threads = threads_knob(kernel, program)
        count = threads.value if threads is not None else tile_of(kernel, program).threads
        out = []
        for up, tier in ((True, 0), (False, 1)):
            values = _element_values(knob, count, up)
            if values:
                swept = "{" + ",".join(map(str, values)) + "}"
                out.append(step(self.id, "block", program, knob, values,
                                hypothesis("block", "block", knob.value, values[0], up),
                                hypothesis("block", "block", knob.value, swept, up), tier))
        if not out:
            raise Skip(f"{kernel.name}: block {knob.value} with {count} threads has no power-of-two neighbour with "
                       f"{ELEMENTS_PER_THREAD[0]}-{ELEMENTS_PER_THREAD[1]} elements per thread")
        return out

    def _dot(self, program: Program, kernel: Kernel) -> list[Candidate]:
        knobs = block_knobs(kernel, program)
        if not knobs:
            raise Skip(f"{kernel.name}: a T.gemm kernel without block_M / block_N / block_K parameters")
        tile = tile_of(kernel, program)
        out = []
        for letter, knob in knobs.items():
            if knob is None:
                continue
            for up, tier in ((True, 0), (False, 1)):
                values = _dot_values(tile, letter, knob, up)
                if values:
                    bound = tile.with_value(FIELDS[letter], values[0]).describe()
                    swept = "{" + ",".join(map(str, values)) + "}"
                    out.append(step(self.id, "block", program, knob, values,
                                    hypothesis(knob.name, letter, knob.value, values[0], up) + f" ({bound})",
                                    hypothesis(knob.name, letter, knob.value, swept, up), tier))
        if not out:
            raise Skip(f"{kernel.name}: every block size is at its bound (shared memory, accumulator registers "
                       f"per thread, or {BLOCK_LIMITS}), or none is stated as an integer")
        return out

    def current_keys(self, source: str) -> list[str]:
        """The keys of the block sizes the source has, so a kept value is never proposed again."""
        program = read(source)
        keys = []
        for kernel in program.kernels.values():
            knobs = list(block_knobs(kernel, program).values()) if is_dot(kernel, program) \
                else [element_block(kernel, program)]
            keys += [f"{self.id}:{k.label}={k.value}" for k in knobs if k is not None]
        return keys
