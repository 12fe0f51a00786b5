"""Recipe `tilelang-num-stages`: the pipelining depth of a TileLang kernel's `T.Pipelined` loop, swept over 1..4.

It reads the loop's `num_stages` (the keyword or the third positional argument, a literal or the
kernel parameter the compile call passes as a module constant) and proposes the step up (+1), carrying a
sweep of every other value in STAGES that keeps a dot kernel's pipelined operand tiles within shared
memory (playbook/tilelang/budget.py), up first; at the top of the range, the step down. A loop without
`num_stages` (TileLang's default 0: no software pipelining) gets one added, swept over 2..4. A kernel
without a `T.Pipelined` loop has nothing to pipeline and is left alone.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.edits import add_kwarg, replace
from playbook.cst.source import Skip, checked
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register, with_sweep
from playbook.tilelang.budget import step, tile_of
from playbook.tilelang.program import Kernel, Program, is_dot, keyword, pipelined, read, stages_knob

STAGES = range(1, 5)
ADDED = (2, 3, 4)  # values a loop without num_stages is given: 1 buffer is what it has
UP = ("num_stages {old} -> {new}: one more tile of A and B in flight while the MMA works on the current one; "
      "expect 2-15% where the K loop waits on global memory (latency-bound), a loss where the extra shared memory "
      "costs programs per SM")
DOWN = ("num_stages {old} -> {new}: one buffer less, so less shared memory per program and more programs per SM; "
        "expect a gain where shared memory limited residency, a small loss where loads were exposed")


def hypothesis(old: object, new: object, up: bool) -> str:
    return (UP if up else DOWN).format(old=old, new=new)


@register
class NumStages(PatternRecipe):
    id = "tilelang-num-stages"
    title = "The num_stages of a T.Pipelined loop, swept over 1..4"
    languages = ("tilelang",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        program = read(source, analysis)
        out, reasons = per_kernel(program.kernels, lambda name, k: self._kernel(program, k), analysis)
        return proposed(out, reasons)

    def _fits(self, program: Program, kernel: Kernel, stages: int) -> bool:
        return not is_dot(kernel, program) or tile_of(kernel, program).with_value("stages", stages).fits_smem()

    def _kernel(self, program: Program, kernel: Kernel) -> Candidate:
        loop = pipelined(kernel, program)
        if loop is None:
            raise Skip(f"{kernel.name}: no T.Pipelined loop, nothing to pipeline")
        if keyword(loop, "num_stages", 2) is None:
            return self._added(program, kernel, loop)
        knob = stages_knob(kernel, program)
        if knob is None:
            raise Skip(f"{kernel.name}: the T.Pipelined loop's num_stages is not stated as an integer")
        allowed = [v for v in STAGES if v != knob.value and self._fits(program, kernel, v)]
        up = [v for v in allowed if v > knob.value]
        down = [v for v in reversed(allowed) if v < knob.value]
        values = up + down
        if not values:
            raise Skip(f"{kernel.name}: no other num_stages in {STAGES.start}..{STAGES.stop - 1} fits shared memory")
        rising = values[0] > knob.value
        swept = "{" + ",".join(map(str, values)) + "}"
        return step(self.id, "num_stages", program, knob, values, hypothesis(knob.value, values[0], rising),
                    hypothesis(knob.value, swept, rising))

    def _added(self, program: Program, kernel: Kernel, loop: cst.Call) -> Candidate:
        values = [v for v in ADDED if self._fits(program, kernel, v)]
        if not values:
            raise Skip(f"{kernel.name}: no num_stages in {ADDED} fits shared memory")

        def code(v: int) -> str:
            added = {loop: lambda upd: add_kwarg(upd, "num_stages", cst.Integer(str(v)))}
            return checked(replace(program.module, added).code)

        label = f"{kernel.name} num_stages"
        cand = Candidate(self.id, "num_stages", f"{self.id}:{kernel.name}:num_stages={values[0]}",
                         f"{label} (none: 0) -> {values[0]}", hypothesis("0 (none)", values[0], True), code(values[0]))
        return with_sweep(cand, label, "0", f"{self.id}:{kernel.name}:num_stages",
                          [(v, f"{self.id}:{kernel.name}:num_stages={v}", code(v)) for v in values],
                          hypothesis("0 (none)", "{" + ",".join(map(str, values)) + "}", True))

    def current_keys(self, source: str) -> list[str]:
        program = read(source)
        knobs = [stages_knob(k, program) for k in program.kernels.values()]
        return [f"{self.id}:{k.label}={k.value}" for k in knobs if k is not None]
