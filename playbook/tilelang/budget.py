"""What a TileLang program's tiles may cost, and the step that moves one knob: the bounds the block-size,
num_stages and threads recipes hold their values to (shared memory per block, accumulator registers
per thread, elements per thread), and one candidate built from a knob's new value with its sweep.

The bounds are read from the source alone. A dot kernel's shared memory is its pipelined operand tiles,
`num_stages * (block_M * block_K + block_K * block_N)` elements of ELEMENT_BYTES (2: fp16 and bf16, the
dtypes a tensor-core product takes; an fp32 operand doubles it), within SMEM_LIMIT, the most one
block may hold on sm_90 and sm_100 (227 KiB). Its fp32 accumulator, `block_M * block_N / threads`
values per thread, stays within ACC_RANGE: below it a warp has too little of the tile to keep its
MMA units busy, above it the accumulator and the operands no longer fit the 255 registers a thread
may have, and it spills.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from playbook.recipe import Candidate, with_sweep
from playbook.tilelang.program import Kernel, Knob, Program, block_knobs, set_knob, stages_knob, threads_knob

SMEM_LIMIT = 227 * 1024  # bytes of shared memory one block may use on sm_90 and sm_100
ELEMENT_BYTES = 2  # fp16 / bf16 operands
ACC_RANGE = (16, 128)  # fp32 accumulator values per thread of a dot kernel's tile
DEFAULT_THREADS = 128  # T.Kernel's threads when none is given
ELEMENTS_PER_THREAD = (1, 64)  # an element-wise block per thread: at least one, at most what registers hold


@dataclass(frozen=True)
class Tile:
    """A dot kernel's tile and pipeline, as the source states them (None: not stated as an integer)."""

    block_m: int | None
    block_n: int | None
    block_k: int | None
    stages: int  # buffers of each operand tile: num_stages, at least 1
    threads: int

    def with_value(self, name: str, value: int) -> "Tile":
        return replace(self, **{name: value})

    def smem(self) -> int | None:
        """Bytes of shared memory the operand tiles take, None when a block size is not known."""
        if None in (self.block_m, self.block_n, self.block_k):
            return None
        return self.stages * (self.block_m * self.block_k + self.block_k * self.block_n) * ELEMENT_BYTES

    def accumulator(self) -> float | None:
        """fp32 accumulator values per thread, None when block_M or block_N is not known."""
        if self.block_m is None or self.block_n is None:
            return None
        return self.block_m * self.block_n / self.threads

    def fits_smem(self) -> bool:
        """The operand tiles fit shared memory (a bound that cannot be computed holds)."""
        smem = self.smem()
        return smem is None or smem <= SMEM_LIMIT

    def fits(self) -> bool:
        """Within shared memory and the accumulator's range (a bound that cannot be computed holds)."""
        acc = self.accumulator()
        return self.fits_smem() and (acc is None or ACC_RANGE[0] <= acc <= ACC_RANGE[1])

    def describe(self) -> str:
        smem, acc = self.smem(), self.accumulator()
        parts = [f"{smem // 1024} KiB of shared memory" if smem is not None else "",
                 f"{acc:g} accumulator values per thread" if acc is not None else ""]
        return ", ".join(p for p in parts if p)


def tile_of(kernel: Kernel, program: Program) -> Tile:
    """The kernel's tile as the source states it: a pipeline without num_stages has one buffer, a
    T.Kernel without threads the default."""
    blocks = block_knobs(kernel, program)
    stages, threads = stages_knob(kernel, program), threads_knob(kernel, program)

    def value(letter: str) -> int | None:
        knob = blocks.get(letter)
        return knob.value if knob is not None else None

    return Tile(value("M"), value("N"), value("K"), max(stages.value if stages else 1, 1),
                threads.value if threads else DEFAULT_THREADS)


FIELDS = {"M": "block_m", "N": "block_n", "K": "block_k"}  # a block knob's letter -> its Tile field


def step(recipe: str, kind: str, program: Program, knob: Knob, values: list[int], hypothesis: str,
         sweep_hypothesis: str, tier: int = 0) -> Candidate:
    """The candidate that sets `knob` to `values[0]`, carrying a sweep over `values` when there are several."""
    new = values[0]
    cand = Candidate(recipe, kind, f"{recipe}:{knob.label}={new}", f"{knob.label} {knob.value} -> {new}", hypothesis,
                     set_knob(program, knob, new), tier)
    return with_sweep(cand, knob.label, knob.value, f"{recipe}:{knob.label}",
                      [(v, f"{recipe}:{knob.label}={v}", set_knob(program, knob, v)) for v in values], sweep_hypothesis)
