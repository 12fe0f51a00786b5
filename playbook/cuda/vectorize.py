"""Recipe `cuda-vectorize`: an element-wise kernel's loads and stores made 128-bit (`float4`, `double2`)
or 32-bit pairs (`__half2`, `__nv_bfloat162`): each thread (or loop trip) handles one vector of
elements instead of one element.

The loop's bound `n` becomes `(n + W - 1) / W` vectors. Each vector is loaded with
`reinterpret_cast<const float4*>(x)[i]`, the body runs once per lane on registers, and the result is
stored as one vector. Alignment is established at run time, in the kernel: the vector path is taken
where every pointer the body touches is aligned to the vector's size (a freshly allocated tensor is;
a view at an odd offset is not) and the vector lies wholly below `n`; otherwise the thread runs the
original body over its W elements one at a time (the tail of n, or unaligned pointers). The body
must index every pointer it touches with the loop's index alone (`out[i] = x[i] + y[i]`), all of one
element type, and read the index nowhere else. The grid of a one-element-per-thread kernel is
divided by W (a grid-stride kernel keeps its grid).
"""

from __future__ import annotations

from loop.common import cuda_tree as ct
from playbook.analysis import Analysis
from playbook.cst.source import Skip
from playbook.cuda.element_loop import ElementLoop, dim3_grid, element_loop, forbidden, grid_edit
from playbook.cuda.sites import Target, pointers, read
from playbook.recipe import Candidate, PatternRecipe, proposed, register

VECTORS = {  # element type -> (vector type, lanes, its fields)
    "float": ("float4", 4, ("x", "y", "z", "w")),
    "double": ("double2", 2, ("x", "y")),
    "__half": ("__half2", 2, ("x", "y")),
    "__nv_bfloat16": ("__nv_bfloat162", 2, ("x", "y")),
}
BYTES = {"float4": 16, "double2": 16, "__half2": 4, "__nv_bfloat162": 4}


def _accesses(t: Target, fn: ct.Function, loop: ElementLoop) -> tuple[dict[str, str], list, set[str]]:
    """The pointers the body touches (name -> element type), their `p[i]` nodes, and those it stores to;
    Skip where the body indexes otherwise or reads the index itself."""
    cs = t.cs
    params = {p.name: p for p in pointers(cs, fn)}
    used, nodes, stored = {}, [], set()
    for n in ct.walk(loop.body):
        if n.type == "comment":
            raise Skip(f"{fn.name}: a comment in the loop body (the per-lane copies would lose it)")
        if n.type == "subscript_expression" and cs.text(n.child_by_field_name("argument")) in params:
            name = cs.text(n.child_by_field_name("argument"))
            if cs.text(n.child_by_field_name("indices"))[1:-1].strip() != loop.var:
                raise Skip(f"{fn.name}: {cs.text(n)} is not indexed by the loop's index alone")
            used[name] = params[name].element
            nodes.append(n)
            parent = n.parent
            if parent.type in ("assignment_expression", "update_expression") and \
                    (parent.child_by_field_name("left") or parent.child_by_field_name("argument")) == n:
                stored.add(name)
        elif n.type == "subscript_expression" and loop.var in {cs.text(i) for i in ct.walk(n)
                                                               if i.type == "identifier"}:
            raise Skip(f"{fn.name}: {cs.text(n)} indexes {cs.text(n.child_by_field_name('argument'))}, no pointer "
                       "parameter, with the loop's index")
        elif n.type == "identifier" and cs.text(n) in params and n.parent.type != "subscript_expression":
            raise Skip(f"{fn.name}: the loop body uses the pointer {cs.text(n)} other than as {cs.text(n)}[{loop.var}]")
        elif n.type == "identifier" and cs.text(n) == loop.var and n.parent.type != "subscript_argument_list":
            raise Skip(f"{fn.name}: the loop body reads its index {loop.var} other than to index a pointer")
    if not used:
        raise Skip(f"{fn.name}: the loop body touches no pointer parameter")
    if len(set(used.values())) > 1:
        raise Skip(f"{fn.name}: the loop body mixes element types ({', '.join(sorted(set(used.values())))})")
    return used, nodes, stored


def _render(cs: ct.CSource, node, subs: dict[tuple[int, int], str]) -> str:
    """`node`'s text with the sub-ranges in `subs` replaced, on one line."""
    out, at = [], node.start_byte
    for (start, end), text in sorted(subs.items()):
        if start >= node.start_byte and end <= node.end_byte:
            out += [cs.data[at:start].decode(), text]
            at = end
    out.append(cs.data[at:node.end_byte].decode())
    return " ".join("".join(out).split())


def _statements(cs: ct.CSource, body, subs) -> str:
    stmts = body.named_children if body.type == "compound_statement" else [body]
    return " ".join(_render(cs, s, subs) for s in stmts)


def _block(t: Target, loop: ElementLoop, used: dict[str, str], nodes: list, stored: set[str],
           pad: str, unit: str) -> str:
    """The new loop body: the vector path and, for a tail or unaligned pointers, the scalar one."""
    cs, i = t.cs, loop.var
    vec, lanes, fields = VECTORS[next(iter(used.values()))]
    bound = cs.text(loop.bound)
    names = sorted(used)
    aligned = " | ".join(f"reinterpret_cast<size_t>({p})" for p in names)
    k = f"{i}_e"
    lines = ["{", f"{unit}if ({lanes} * {i} + {lanes - 1} < {bound} && ({aligned}) % {BYTES[vec]} == 0) {{"]
    for p in names:
        if p in stored and not _store_only(cs, loop, p):
            lines.append(f"{unit * 2}{vec} {p}_v = reinterpret_cast<{vec}*>({p})[{i}];")
        elif p in stored:
            lines.append(f"{unit * 2}{vec} {p}_v;")
        else:
            lines.append(f"{unit * 2}const {vec} {p}_v = reinterpret_cast<const {vec}*>({p})[{i}];")
    for f in fields:
        subs = {(n.start_byte, n.end_byte): f"{cs.text(n.child_by_field_name('argument'))}_v.{f}" for n in nodes}
        lines.append(f"{unit * 2}{{ {_statements(cs, loop.body, subs)} }}")
    lines += [f"{unit * 2}reinterpret_cast<{vec}*>({p})[{i}] = {p}_v;" for p in names if p in stored]
    subs = {(n.start_byte, n.end_byte): f"{cs.text(n.child_by_field_name('argument'))}[{k}]" for n in nodes}
    lines += [f"{unit}}} else {{",
              f"{unit * 2}for (int {k} = {lanes} * {i}; {k} < {bound} && {k} < {lanes} * {i} + {lanes}; ++{k}) {{",
              f"{unit * 3}{_statements(cs, loop.body, subs)}",
              f"{unit * 2}}}", f"{unit}}}", "}"]
    return ("\n" + pad).join(lines)


def _store_only(cs: ct.CSource, loop: ElementLoop, p: str) -> bool:
    """Whether every access of `p` in the body is the left side of a plain `=` at the body's top level
    (then its vector needs no load first)."""
    stmts = loop.body.named_children if loop.body.type == "compound_statement" else [loop.body]
    top = set()
    for s in stmts:
        e = s.named_children[0] if s.type == "expression_statement" and s.named_children else None
        if e is not None and e.type == "assignment_expression" and cs.text(e.child_by_field_name("operator")) == "=":
            top.add(e.child_by_field_name("left").id)
    return all(n.id in top for n in ct.walk(loop.body) if n.type == "subscript_expression"
               and cs.text(n.child_by_field_name("argument")) == p)


@register
class Vectorize(PatternRecipe):
    id = "cuda-vectorize"
    title = "Vector loads and stores (float4, __half2, __nv_bfloat162) in an element-wise kernel"
    languages = ("cuda",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        t = read(source, analysis)
        out, reasons = [], []
        for name, fn in t.kernels.items():
            try:
                out.append(self._one(t, name, fn))
            except Skip as exc:
                reasons.append(str(exc))
        return proposed(out, reasons, "no kernel on solve's path")

    def _one(self, t: Target, name: str, fn: ct.Function) -> Candidate:
        cs = t.cs
        loop = element_loop(cs, fn)
        why = forbidden(cs, loop.body)
        if why:
            raise Skip(f"{name}: {why} in the loop body")
        if loop.body.type != "compound_statement":
            raise Skip(f"{name}: the loop body is not a block")
        used, nodes, stored = _accesses(t, fn, loop)
        element = next(iter(used.values()))
        if element not in VECTORS:
            raise Skip(f"{name}: its elements are {element}, which has no vector type here "
                       f"({', '.join(VECTORS)} do)")
        vec, lanes, _ = VECTORS[element]
        launches = t.launches_of(name)
        if loop.form == "guard" and any(dim3_grid(cs, launch) for launch in launches):
            raise Skip(f"{name}: a launch's grid is a dim3")
        pad = ct.indent(cs, loop.node)
        unit = "\t" if pad.startswith("\t") else "    "
        bound = cs.text(loop.bound)
        inner = bound if loop.bound.type in ("identifier", "number_literal") else f"({bound})"
        edits = [ct.Edit(loop.bound.start_byte, loop.bound.end_byte, f"({inner} + {lanes - 1}) / {lanes}"),
                 ct.Edit(loop.body.start_byte, loop.body.end_byte, _block(t, loop, used, nodes, stored, pad, unit))]
        if loop.form == "guard":
            edits += [grid_edit(cs, launch, lanes) for launch in launches]
        return Candidate(
            self.id, "vector", f"{self.id}:{name}={vec}", f"{name}: {element} loads and stores -> {vec}",
            f"{name}: one {BYTES[vec] * 8}-bit access per {lanes} elements instead of {lanes} narrow ones: fewer "
            "memory instructions and fuller transactions; expect 5-30% on a memory-bound element-wise kernel "
            "whose loads were instruction-bound, nothing where bandwidth was already saturated",
            ct.apply(cs, edits))
