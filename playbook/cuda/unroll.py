"""Recipe `cuda-unroll`: `#pragma unroll` before a loop whose trip count is fixed at compile time.

A loop counts as fixed-trip where its variable starts at a number (or a file constant), is compared
with a number (or a file constant), and moves by a constant step (`++i`, `i += 4`, `s /= 2`,
`s >>= 1`), and the body does not assign it. A loop whose bound is a kernel argument or `blockDim.x`
is not fixed-trip and is left alone (unrolling it would need a bound the compiler cannot know). A
loop that already has a pragma is left alone.
"""

from __future__ import annotations

import re

from loop.common import cuda_tree as ct
from playbook.analysis import Analysis
from playbook.cuda.sites import Target, read
from playbook.recipe import Candidate, PatternRecipe, proposed, register

_STEP = re.compile(r"^(?:\+\+|--)?(?P<v>\w+)(?:\+\+|--)?$|^(?P<w>\w+)\s*(?:[-+*/]|<<|>>)=\s*(?P<k>\w+)$")


def _fixed(t: Target, loop) -> str | None:
    """The loop's variable where its trip count is fixed at compile time, else None."""
    cs = t.cs
    init, cond, update = (loop.child_by_field_name(f) for f in ("initializer", "condition", "update"))
    if init is None or cond is None or update is None:
        return None
    decls = [n for n in ct.walk(init) if n.type == "init_declarator"]
    assigns = [n for n in ct.walk(init) if n.type == "assignment_expression"]
    first = decls[0] if decls else assigns[0] if assigns else None
    if first is None:
        return None
    var = first.child_by_field_name("declarator") or first.child_by_field_name("left")
    start = first.child_by_field_name("value") or first.child_by_field_name("right")
    name = cs.text(var)
    if ct.int_value(cs, start, t.constants) is None:
        return None
    if cond.type != "binary_expression" or cs.text(cond.child_by_field_name("left")) != name \
            or ct.int_value(cs, cond.child_by_field_name("right"), t.constants) is None:
        return None
    m = _STEP.match(" ".join(cs.text(update).split()))
    if m is None or (m.group("v") or m.group("w")) != name or \
            (m.group("k") and not (m.group("k").isdigit() or m.group("k") in t.constants)):
        return None
    body = loop.child_by_field_name("body")
    for n in ct.walk(body):
        target = n.child_by_field_name("left") if n.type == "assignment_expression" else \
            n.child_by_field_name("argument") if n.type == "update_expression" else None
        if target is not None and cs.text(target) == name:
            return None
    return name


def _pragma_before(t: Target, loop) -> bool:
    prev = loop.prev_sibling
    return prev is not None and prev.type == "preproc_call" and "pragma" in t.cs.text(prev)


@register
class Unroll(PatternRecipe):
    id = "cuda-unroll"
    title = "#pragma unroll on a loop whose trip count is fixed at compile time"
    languages = ("cuda",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        t = read(source, analysis)
        out, reasons = [], []
        for fn in ct.device_reach(t.cs, set(t.kernels)):
            loops = [n for n in ct.walk(fn.body) if n.type == "for_statement"]
            fixed = [(n, v) for n in loops if (v := _fixed(t, n)) is not None and not _pragma_before(t, n)
                     and not t.cs.data[ct.line_start(t.cs, n):n.start_byte].strip()]
            if not fixed:
                reasons.append(f"{fn.name} has no loop without a pragma whose trip count is fixed at compile time "
                               "(its loops run to a kernel argument or blockDim.x)" if loops else
                               f"{fn.name} has no loop")
                continue
            edits = [ct.Edit(ct.line_start(t.cs, n), ct.line_start(t.cs, n),
                             f"{ct.indent(t.cs, n)}#pragma unroll\n") for n, _ in fixed]
            lines = ", ".join(str(t.cs.line(n)) for n, _ in fixed)
            out.append(Candidate(
                self.id, "unroll", f"{self.id}:{fn.name}", f"{fn.name}: #pragma unroll on the loop(s) at line {lines}",
                f"{fn.name}: the fixed-trip loop(s) over {', '.join(v for _, v in fixed)} fully unrolled: no loop "
                "counter or branch, loads of several trips issued together; expect 0-5% (nvcc unrolls short "
                "constant loops at -O3 already: nothing where it had), a loss if code size or registers grow",
                ct.apply(t.cs, edits)))
        return proposed(out, reasons, "no kernel on solve's path")
