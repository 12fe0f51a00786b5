"""Recipe `cuda-warp-shuffle`: a block reduction through a shared-memory tree replaced by warp
shuffles: each warp reduces its 32 values with `__shfl_down_sync`, its first lane writes one value per
warp to the same `__shared__` array, and the first warp reduces those.

The tree it recognises is the textbook one, in three statements:

    partial[tid] = value;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {     // or >>= 1
        if (tid < s) { partial[tid] += partial[tid + s]; }   // or = fmaxf(partial[tid], partial[tid + s])
        __syncthreads();
    }

(`tid` is `threadIdx.x` or a local holding it). The result is where the tree left it, `partial[0]`,
after a barrier, so the code after it is unchanged; `value` is read into a fresh local. Sums, and
`fmaxf`/`fminf`/`max`/`min` of a floating array, are recognised. The block size must be a multiple of
32 (a known launch size that is not is left alone).
"""

from __future__ import annotations

from dataclasses import dataclass

from loop.common import cuda_tree as ct
from playbook.analysis import Analysis
from playbook.cuda.sites import block_site, read
from playbook.recipe import Candidate, PatternRecipe, proposed, register

COMBINE = {"fmaxf": "INFINITY", "fmax": "INFINITY", "max": "INFINITY", "fminf": "INFINITY", "fmin": "INFINITY",
           "min": "INFINITY"}
FLOATS = {"float": "0.0f", "double": "0.0"}


@dataclass(frozen=True)
class Tree:
    """One recognised shared-memory tree: its statements, the array, the value reduced and the combine."""

    first: object  # `partial[tid] = value;`
    last: object  # the halving loop
    array: str
    tid: str
    value: str
    combine: str  # "+" or a function name
    element: str  # the array's element type


def _stmt_call(cs: ct.CSource, node, name: str) -> bool:
    return node.type == "expression_statement" and " ".join(cs.text(node).split()) == f"{name}();"


def _halving(cs: ct.CSource, loop) -> str | None:
    """The loop variable of `for (int s = X / 2; s > 0; s /= 2)` (or `>> 1`, `>>= 1`), else None."""
    init, cond, update = (loop.child_by_field_name(f) for f in ("initializer", "condition", "update"))
    if init is None or cond is None or update is None:
        return None
    decl = next((n for n in ct.walk(init) if n.type == "init_declarator"), None)
    if decl is None:
        return None
    s = cs.text(decl.child_by_field_name("declarator"))
    value = " ".join(cs.text(decl.child_by_field_name("value")).split())
    ok = value.endswith(("/ 2", ">> 1")) and " ".join(cs.text(cond).split()) == f"{s} > 0" \
        and " ".join(cs.text(update).split()) in (f"{s} /= 2", f"{s} >>= 1", f"{s} = {s} / 2", f"{s} = {s} >> 1")
    return s if ok else None


def _combine(cs: ct.CSource, body, array: str, tid: str, s: str) -> str | None:
    """The tree step's combine ("+" or fmaxf, ...) where the loop body is `if (tid < s) { step }` and a barrier."""
    stmts = [c for c in body.named_children if c.type != "comment"]
    if len(stmts) != 2 or stmts[0].type != "if_statement" or not _stmt_call(cs, stmts[1], "__syncthreads"):
        return None
    cond = " ".join(cs.text(stmts[0].child_by_field_name("condition")).split())
    if cond != f"({tid} < {s})" or stmts[0].child_by_field_name("alternative") is not None:
        return None
    inner = stmts[0].child_by_field_name("consequence")
    steps = [c for c in inner.named_children if c.type != "comment"] if inner.type == "compound_statement" else [inner]
    if len(steps) != 1:
        return None
    text = " ".join(cs.text(steps[0]).split())
    me, other = f"{array}[{tid}]", f"{array}[{tid} + {s}]"
    if text in (f"{me} += {other};", f"{me} = {me} + {other};"):
        return "+"
    for fn in COMBINE:
        if text == f"{me} = {fn}({me}, {other});":
            return fn
    return None


def _tid_names(cs: ct.CSource, fn: ct.Function) -> set[str]:
    out = {"threadIdx.x"}
    for n in ct.walk(fn.body):
        if n.type == "init_declarator" and n.child_by_field_name("value") is not None \
                and cs.text(n.child_by_field_name("value")) == "threadIdx.x":
            out.add(cs.text(n.child_by_field_name("declarator")))
    return out


def _shared(cs: ct.CSource, fn: ct.Function) -> dict[str, str]:
    """The kernel's `__shared__` arrays and their element types."""
    out = {}
    for n in ct.walk(fn.body):
        if n.type == "declaration" and "__shared__" in {cs.text(q) for q in n.children if q.type == "type_qualifier"}:
            for d in n.children:
                if d.type == "array_declarator":
                    out[cs.text(d.child_by_field_name("declarator"))] = cs.text(n.child_by_field_name("type"))
    return out


def trees(cs: ct.CSource, fn: ct.Function) -> list[Tree]:
    """The shared-memory trees of `fn`, in source order."""
    shared, tids, out = _shared(cs, fn), _tid_names(cs, fn), []
    for block in (n for n in ct.walk(fn.body) if n.type == "compound_statement"):
        stmts = [c for c in block.named_children if c.type != "comment"]
        for a, b, c in zip(stmts, stmts[1:], stmts[2:]):
            s = _halving(cs, c) if c.type == "for_statement" else None
            store = a.named_children[0] if a.type == "expression_statement" and a.named_children else None
            if s is None or not _stmt_call(cs, b, "__syncthreads") or store is None \
                    or store.type != "assignment_expression" or cs.text(store.child_by_field_name("operator")) != "=":
                continue
            left = store.child_by_field_name("left")
            if left.type != "subscript_expression":
                continue
            array = cs.text(left.child_by_field_name("argument"))
            index = cs.text(left.child_by_field_name("indices"))[1:-1].strip()
            if array not in shared or index not in tids:
                continue
            combine = _combine(cs, c.child_by_field_name("body"), array, index, s)
            if combine is None or (combine != "+" and shared[array] not in FLOATS):
                continue
            out.append(Tree(a, c, array, index, cs.text(store.child_by_field_name("right")), combine, shared[array]))
    return out


def _step(combine: str, v: str) -> str:
    shuffled = f"__shfl_down_sync(0xffffffff, {v}, offset)"
    return f"{v} += {shuffled};" if combine == "+" else f"{v} = {combine}({v}, {shuffled});"


def _identity(tree: Tree) -> str:
    if tree.combine == "+":
        return FLOATS.get(tree.element, "0")
    return ("-" if "max" in tree.combine else "") + COMBINE[tree.combine]


def replacement(tree: Tree, v: str, pad: str, unit: str) -> str:
    """The warp-shuffle reduction, as lines indented like the tree's first statement (its own first
    line takes that statement's place)."""
    step, t = _step(tree.combine, v), tree.tid
    lines = [
        "{",
        f"{unit}{tree.element} {v} = {tree.value};",
        f"{unit}for (int offset = 16; offset > 0; offset /= 2) {{",
        f"{unit * 2}{step}",
        f"{unit}}}",
        f"{unit}if ({t} % 32 == 0) {{",
        f"{unit * 2}{tree.array}[{t} / 32] = {v};",
        f"{unit}}}",
        f"{unit}__syncthreads();",
        f"{unit}if ({t} < 32) {{",
        f"{unit * 2}{v} = {t} < blockDim.x / 32 ? {tree.array}[{t}] : {_identity(tree)};",
        f"{unit * 2}for (int offset = 16; offset > 0; offset /= 2) {{",
        f"{unit * 3}{step}",
        f"{unit * 2}}}",
        f"{unit * 2}if ({t} == 0) {{",
        f"{unit * 3}{tree.array}[0] = {v};",
        f"{unit * 2}}}",
        f"{unit}}}",
        f"{unit}__syncthreads();",
        "}",
    ]
    return ("\n" + pad).join(lines)


def _fresh(cs: ct.CSource, fn: ct.Function, stem: str) -> str:
    used = {cs.text(n) for n in ct.walk(fn.node) if n.type == "identifier"}
    return next(f"{stem}{i or ''}" for i in range(100) if f"{stem}{i or ''}" not in used)


@register
class WarpShuffle(PatternRecipe):
    id = "cuda-warp-shuffle"
    title = "A shared-memory tree reduction replaced by warp shuffles"
    languages = ("cuda",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        t = read(source, analysis)
        out, reasons = [], []
        for name, fn in t.kernels.items():
            found = trees(t.cs, fn)
            if not found:
                reasons.append(f"{name} has no shared-memory tree reduction (partial[tid] = v; __syncthreads(); "
                               "a loop halving s with partial[tid] += partial[tid + s])")
                continue
            odd = [s.value for s in (block_site(t, launch) for launch in t.launches_of(name))
                   if s is not None and s.value % 32]
            if odd:
                reasons.append(f"{name} is launched with {odd[0]} threads, not a multiple of 32: whole warps are "
                               "needed")
                continue
            v = _fresh(t.cs, fn, "warp_v")
            edits = []
            for tree in found:
                pad = ct.indent(t.cs, tree.first)
                unit = "\t" if pad.startswith("\t") else "    "
                edits.append(ct.Edit(tree.first.start_byte, tree.last.end_byte, replacement(tree, v, pad, unit)))
            lines = ", ".join(str(t.cs.line(tree.first)) for tree in found)
            out.append(Candidate(
                self.id, "warp-shuffle", f"{self.id}:{name}",
                f"{name}: the shared-memory tree reduction(s) at line {lines} -> warp shuffles",
                f"{name}: log2(threads) block-wide barriers and shared-memory round trips per reduction replaced by "
                "register shuffles within each warp and two barriers; expect 5-30% on row kernels whose rows are "
                "short enough that the reduction is a large share of the time, little on long rows",
                ct.apply(t.cs, edits)))
        return proposed(out, reasons, "no kernel on solve's path")

