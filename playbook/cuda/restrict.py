"""Recipe `cuda-restrict`: a kernel's pointer parameters declared `__restrict__`, and those it only
reads `const` as well, so that nvcc may keep loaded values in registers across stores and load the
read-only ones through the non-coherent read-only path (LDG.NC, what `__ldg` asks for).

The one variable is the kernel's aliasing contract. A pointer the kernel stores through (itself or a
local derived from it), or hands to any call, is not made `const`. A kernel launched with the same
pointer in two arguments is left alone: `__restrict__` would be a false promise there.
"""

from __future__ import annotations

from loop.common import cuda_tree as ct
from playbook.analysis import Analysis
from playbook.cuda.sites import Target, pointers, read, written
from playbook.recipe import Candidate, PatternRecipe, proposed, register


def _aliased(t: Target, kernel: str) -> str | None:
    """A pointer passed twice to one launch of `kernel` (its text), or None."""
    for launch in t.launches_of(kernel):
        names = [t.cs.text(a) for a in launch.args if a.type == "identifier"]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            return twice[0]
    return None


@register
class Restrict(PatternRecipe):
    id = "cuda-restrict"
    title = "__restrict__ on a kernel's pointers, const on those it only reads (read-only loads)"
    languages = ("cuda",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        t = read(source, analysis)
        out, reasons = [], []
        for name, fn in t.kernels.items():
            ptrs = pointers(t.cs, fn)
            if not ptrs:
                reasons.append(f"{name} takes no pointer parameter")
                continue
            twice = _aliased(t, name)
            if twice:
                reasons.append(f"{name} is launched with {twice} in two arguments: __restrict__ would be false")
                continue
            stored = written(t.cs, fn, {p.name for p in ptrs})
            edits, restricted, consted = [], [], []
            for p in ptrs:
                if not p.const and p.name not in stored:
                    edits.append(ct.Edit(p.param.start_byte, p.param.start_byte, "const "))
                    consted.append(p.name)
                if not p.restrict:
                    spaced = t.cs.data[p.star.end_byte:p.star.end_byte + 1].isspace()
                    text = " __restrict__" if spaced else "__restrict__ "
                    edits.append(ct.Edit(p.star.end_byte, p.star.end_byte, text))
                    restricted.append(p.name)
            if not edits:
                reasons.append(f"{name}: every pointer is already __restrict__ and const where only read")
                continue
            code = ct.apply(t.cs, edits)
            what = (f"__restrict__ on {', '.join(restricted)}" if restricted else "") + \
                   ("; " if restricted and consted else "") + (f"const on {', '.join(consted)}" if consted else "")
            out.append(Candidate(
                self.id, "restrict", f"{self.id}:{name}", f"{name}: {what}",
                f"{name}: no aliasing between its pointers ({what}): nvcc may reorder loads across stores, keep "
                "values in registers and load read-only data through the read-only cache (LDG.NC); expect 0-10% on "
                "a memory-bound kernel, nothing where the loads were already scheduled freely", code))
        return proposed(out, reasons, "no kernel on solve's path")

