"""Recipe `tilelang-threads`: the threads of a TileLang kernel's `T.Kernel`, 128 or 256.

Threads are warps of 32, and on sm_90 a tensor-core product is issued by warpgroups of four warps (128
threads), so the two values worth timing are one warpgroup and two. The warp-count rule: a dot kernel
splits its block_M x block_N accumulator over its threads, and the new count must leave each thread
ACC_RANGE fp32 values (playbook/tilelang/budget.py): fewer and each warp has too little of the tile to
keep its MMA busy, more and the accumulator spills. An element-wise kernel must leave each thread at
least one element of its block. The value is changed where the source states it (the module constant
the compile call passes, or the literal); a `T.Kernel` without `threads=` (128) gets `threads=256`.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.edits import add_kwarg, replace
from playbook.cst.source import Skip, checked
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register
from playbook.tilelang.budget import ACC_RANGE, DEFAULT_THREADS, ELEMENTS_PER_THREAD, step, tile_of
from playbook.tilelang.program import (Kernel, Program, element_block, is_dot, keyword, launch_frame, read,
                                       threads_knob)

THREADS = (128, 256)
HYPOTHESES = {
    True: ("threads {old} -> {new}: two warpgroups split the tile, half the accumulator registers per thread and "
           "twice the warps to hide latency; expect 5-25% on large tiles (128x128 and up), a loss on small ones "
           "where each warp's share of the MMA shrinks"),
    False: ("threads {old} -> {new}: one warpgroup holds the whole tile, more registers per thread and more "
            "programs per SM; expect a gain on small tiles or where registers limited residency, a loss where the "
            "accumulator then spills"),
}


def hypothesis(old: int, new: int) -> str:
    return HYPOTHESES[new > old].format(old=old, new=new)


@register
class Threads(PatternRecipe):
    id = "tilelang-threads"
    title = "The threads of T.Kernel, 128 <-> 256 (one or two warpgroups), under the warp-count rule"
    languages = ("tilelang",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        program = read(source, analysis)
        out, reasons = per_kernel(program.kernels, lambda name, k: self._kernel(program, k), analysis)
        return proposed(out, reasons)

    def _rule(self, program: Program, kernel: Kernel, threads: int) -> str | None:
        """Why `threads` breaks the warp-count rule for this kernel, None when it keeps it."""
        if is_dot(kernel, program):
            tile = tile_of(kernel, program).with_value("threads", threads)
            acc = tile.accumulator()
            if acc is None:
                return "block_M and block_N are not stated as integers, so the rule cannot be checked"
            if not ACC_RANGE[0] <= acc <= ACC_RANGE[1]:
                return (f"{tile.block_m}x{tile.block_n} over {threads} threads is {acc:g} accumulator values per "
                        f"thread, outside {ACC_RANGE[0]}-{ACC_RANGE[1]}")
            return None
        block = element_block(kernel, program)
        if block is None:
            return "no T.Parallel block stated as an integer, so the rule cannot be checked"
        if block.value < ELEMENTS_PER_THREAD[0] * threads:
            return f"a block of {block.value} elements leaves some of {threads} threads without an element"
        return None

    def _kernel(self, program: Program, kernel: Kernel) -> Candidate:
        frame = launch_frame(kernel, program)
        if frame is None:
            raise Skip(f"{kernel.name}: no T.Kernel")
        if keyword(frame, "threads") is None:
            return self._added(program, kernel, frame)
        knob = threads_knob(kernel, program)
        if knob is None:
            raise Skip(f"{kernel.name}: T.Kernel's threads is not stated as an integer")
        if knob.value not in THREADS:
            raise Skip(f"{kernel.name}: threads={knob.value}, not one of {THREADS}")
        new = next(v for v in THREADS if v != knob.value)
        why = self._rule(program, kernel, new)
        if why:
            raise Skip(f"{kernel.name}: threads {knob.value} -> {new} breaks the warp-count rule: {why}")
        return step(self.id, "num_warps", program, knob, [new], hypothesis(knob.value, new), "")

    def _added(self, program: Program, kernel: Kernel, frame: cst.Call) -> Candidate:
        new = THREADS[1]
        why = self._rule(program, kernel, new)
        if why:
            raise Skip(f"{kernel.name}: threads {DEFAULT_THREADS} (default) -> {new} breaks the warp-count rule: {why}")
        added = {frame: lambda upd: add_kwarg(upd, "threads", cst.Integer(str(new)))}
        code = checked(replace(program.module, added).code)
        return Candidate(self.id, "num_warps", f"{self.id}:{kernel.name}:threads={new}",
                         f"{kernel.name} threads {DEFAULT_THREADS} (default) -> {new}",
                         hypothesis(DEFAULT_THREADS, new), code)

    def current_keys(self, source: str) -> list[str]:
        program = read(source)
        knobs = [threads_knob(k, program) for k in program.kernels.values()]
        return [f"{self.id}:{k.label}={k.value}" for k in knobs if k is not None]
