"""Recipe `tilelang-swizzle`: the program order of a TileLang dot kernel, `T.use_swizzle(panel_size)`.

Without it, programs run row after row of C tiles, and a row of programs reads all of B: on large
shapes B's tiles leave L2 before the next row reads them again. `T.use_swizzle(panel_size=P)` (TileLang's
threadblock rasterization) walks the grid in panels P tiles wide, so programs running together share
their A and B tiles in L2. A kernel without it gets `T.use_swizzle(panel_size=8)` as the first statement
of its `with T.Kernel(...)` block, swept over PANELS; one with it has its panel swept over the other
PANELS (a literal or a module constant), or is switched on where it says `enable=False`. Only dot
kernels (`T.gemm`) with a two-dimensional grid have an order worth changing.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.edits import replace
from playbook.cst.source import Skip, checked, walk
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register, with_sweep
from playbook.tilelang.budget import step
from playbook.tilelang.program import (LANGUAGE_MODULE, Kernel, Program, is_dot, keyword, launch_frame, read,
                                       tl_calls, used_knob)

PANELS = (8, 4, 16)  # the panel added first, then the others a sweep times
HYPOTHESIS = ("T.use_swizzle panel {old} -> {new}: programs that run together share A and B tiles in L2; expect "
              "2-10% on shapes whose B does not fit L2 (4096 and up), ~0 on small ones")


@register
class Swizzle(PatternRecipe):
    id = "tilelang-swizzle"
    title = "Rasterization: T.use_swizzle on, or its panel size swept (L2 reuse)"
    languages = ("tilelang",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language in self.languages and analysis.kernel_class == "dot"

    def inapplicable(self, analysis: Analysis) -> str:
        return (f"does not apply to a {analysis.language} {analysis.kernel_class} kernel: program order for L2 "
                f"reuse pays where programs share operand tiles, in a matrix product (T.gemm)")

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        program = read(source, analysis)
        out, reasons = per_kernel(program.kernels, lambda name, k: self._kernel(program, k), analysis)
        return proposed(out, reasons)

    def _kernel(self, program: Program, kernel: Kernel) -> Candidate:
        if not is_dot(kernel, program):
            raise Skip(f"{kernel.name}: no T.gemm, no operand tiles for programs to share")
        frame = launch_frame(kernel, program)
        if frame is None or sum(1 for a in frame.args if a.keyword is None) < 2:
            raise Skip(f"{kernel.name}: its T.Kernel grid is not two-dimensional, there is no order to change")
        existing = tl_calls(kernel.fn, program.imports, "use_swizzle")
        if existing:
            return self._existing(program, kernel, existing[0])
        return self._added(program, kernel, frame)

    def _existing(self, program: Program, kernel: Kernel, call: cst.Call) -> Candidate:
        enable = keyword(call, "enable", 2)
        if isinstance(enable, cst.Name) and enable.value == "False":
            code = checked(replace(program.module, {enable: cst.Name("True")}).code)
            return Candidate(self.id, "grouped-ordering", f"{self.id}:{kernel.name}:enable=True",
                             f"{kernel.name} T.use_swizzle enable False -> True",
                             HYPOTHESIS.format(old="off", new="on"), code)
        knob = used_knob(kernel, keyword(call, "panel_size", 0), "panel_size", program)
        if knob is None:
            raise Skip(f"{kernel.name}: T.use_swizzle's panel_size is not stated as an integer")
        values = [v for v in PANELS if v != knob.value]
        return step(self.id, "grouped-ordering", program, knob, values,
                    HYPOTHESIS.format(old=knob.value, new=values[0]),
                    HYPOTHESIS.format(old=knob.value, new="{" + ",".join(map(str, values)) + "}"))

    def _added(self, program: Program, kernel: Kernel, frame: cst.Call) -> Candidate:
        alias = next((name for name, full in program.imports.items() if full == LANGUAGE_MODULE), None)
        if alias is None:
            raise Skip(f"{kernel.name}: tilelang.language is not imported as a module (import tilelang.language as T)")
        block = _frame_block(kernel.fn, frame)
        if block is None:
            raise Skip(f"{kernel.name}: T.Kernel is not used as `with T.Kernel(...) as ...:`")

        def code(panel: int) -> str:
            stmt = cst.parse_statement(f"{alias}.use_swizzle(panel_size={panel})\n")
            body = block.body
            return checked(replace(program.module, {body: body.with_changes(body=[stmt, *body.body])}).code)

        label = f"{kernel.name} T.use_swizzle panel"
        first = PANELS[0]
        cand = Candidate(self.id, "grouped-ordering", f"{self.id}:{kernel.name}:panel_size={first}",
                         f"{label} off -> {first}", HYPOTHESIS.format(old="off", new=first), code(first))
        return with_sweep(cand, label, "off", f"{self.id}:{kernel.name}:panel_size",
                          [(v, f"{self.id}:{kernel.name}:panel_size={v}", code(v)) for v in PANELS],
                          HYPOTHESIS.format(old="off", new="{" + ",".join(map(str, PANELS)) + "}"))


def _frame_block(fn: cst.FunctionDef, frame: cst.Call) -> cst.With | None:
    """The `with` statement whose item is `frame`."""
    return next((n for n in walk(fn) if isinstance(n, cst.With) and any(i.item is frame for i in n.items)), None)

