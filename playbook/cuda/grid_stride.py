"""Recipe `cuda-grid-stride`: a one-element-per-thread kernel (`if (i < n) { ... }`) turned into a
grid-stride loop (`for (; i < n; i += blockDim.x * gridDim.x) { ... }`) launched with a quarter of
the blocks, so each thread handles up to 4 elements, a grid's width apart (loads stay coalesced).

The one variable is the elements per thread, 1 -> up to 4: the kernel's guard becomes the loop and
every launch's grid `G` becomes `(G + 3) / 4`. Any grid at least a quarter of the old one covers the
elements, since the loop strides by the grid. A body with a barrier or a return, an index read after
the guard, or a `dim3` grid is left alone.
"""

from __future__ import annotations

from loop.common import cuda_tree as ct
from playbook.analysis import Analysis
from playbook.cst.source import Skip
from playbook.cuda.element_loop import dim3_grid, element_loop, forbidden, grid_edit, used_after
from playbook.cuda.sites import read
from playbook.recipe import Candidate, PatternRecipe, proposed, register

ELEMENTS_PER_THREAD = 4


@register
class GridStride(PatternRecipe):
    id = "cuda-grid-stride"
    title = "A one-element-per-thread kernel as a grid-stride loop over a quarter of the blocks"
    languages = ("cuda",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        t = read(source, analysis)
        out, reasons = [], []
        for name, fn in t.kernels.items():
            try:
                loop = element_loop(t.cs, fn)
            except Skip as exc:
                reasons.append(str(exc))
                continue
            launches = t.launches_of(name)
            why = ("already a grid-stride loop" if loop.form == "stride" else forbidden(t.cs, loop.body)
                   or (f"its index {loop.var} is read after the guard" if used_after(t.cs, fn, loop.node, loop.var)
                       else None)
                   or ("its index is declared const" if "const" in t.cs.text(loop.decl).split("=")[0].split()
                       else None)
                   or next(("a launch's grid is a dim3" for launch in launches if dim3_grid(t.cs, launch)), None))
            if why:
                reasons.append(f"{name}: {why}")
                continue
            cond = loop.node.child_by_field_name("condition")
            head = f"for (; {t.cs.text(loop.condition)}; {loop.var} += blockDim.x * gridDim.x)"
            edits = [ct.Edit(loop.node.start_byte, cond.end_byte, head)]
            edits += [grid_edit(t.cs, launch, ELEMENTS_PER_THREAD) for launch in launches]
            k = ELEMENTS_PER_THREAD
            out.append(Candidate(
                self.id, "grid-stride", f"{self.id}:{name}={k}",
                f"{name}: elements per thread 1 -> up to {k} (grid-stride loop, grid / {k})",
                f"{name}: a quarter of the blocks, each thread looping over up to {k} elements a grid apart: less "
                "block scheduling and index arithmetic per element, and the loop's loads can be issued together; "
                "expect 0-10% on a large memory-bound vector, a loss where the grid no longer fills the GPU "
                "(small n)", ct.apply(t.cs, edits)))
        return proposed(out, reasons, "no kernel on solve's path")
