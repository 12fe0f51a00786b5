"""The element loop of an element-wise CUDA C kernel, as the grid-stride and vector recipes read it:
a global thread index `int i = blockIdx.x * blockDim.x + threadIdx.x;` and either a guard
`if (i < n) { ... }` (one element per thread) or a grid-stride loop
`for (int i = ...; i < n; i += blockDim.x * gridDim.x) { ... }`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loop.common import cuda_tree as ct
from playbook.cst.source import Skip

_CAST = r"(?:\((?:size_t|int64_t|long long|long|unsigned|unsigned int|int)\))?"
_GLOBAL = re.compile(rf"^(?:{_CAST}blockIdx\.x\*blockDim\.x|{_CAST}blockDim\.x\*blockIdx\.x)\+threadIdx\.x$"
                     rf"|^threadIdx\.x\+(?:{_CAST}blockIdx\.x\*blockDim\.x|{_CAST}blockDim\.x\*blockIdx\.x)$")
STRIDES = ("blockDim.x*gridDim.x", "gridDim.x*blockDim.x")


@dataclass(frozen=True)
class ElementLoop:
    var: str
    form: str  # "guard" (`if (i < n)`) or "stride" (a grid-stride `for`)
    node: object  # the if_statement or for_statement
    condition: object  # `i < n`
    bound: object  # `n`
    body: object  # the guarded statement (a compound statement)
    decl: object | None  # the declaration of the index (guard form)


def _squash(cs: ct.CSource, node) -> str:
    return re.sub(r"\s+", "", cs.text(node)) if node is not None else ""


def _is_global(cs: ct.CSource, node) -> bool:
    return node is not None and bool(_GLOBAL.match(_squash(cs, node)))


def _bound(cs: ct.CSource, cond, var: str):
    if cond is not None and cond.type in ("parenthesized_expression", "condition_clause") \
            and cond.named_child_count == 1:
        cond = cond.named_children[0]
    if cond is None or cond.type != "binary_expression" or cs.text(cond.child_by_field_name("operator")) != "<" \
            or cs.text(cond.child_by_field_name("left")) != var:
        return None, None
    return cond, cond.child_by_field_name("right")


def element_loop(cs: ct.CSource, fn: ct.Function) -> ElementLoop:
    """The kernel's element loop; Skip with what is missing."""
    stmts = [s for s in fn.body.named_children if s.type != "comment"]
    index: dict[str, object] = {}
    for s in stmts:
        if s.type == "declaration":
            for init in (c for c in s.children if c.type == "init_declarator"):
                if _is_global(cs, init.child_by_field_name("value")):
                    index[cs.text(init.child_by_field_name("declarator"))] = s
        elif s.type == "if_statement" and s.child_by_field_name("alternative") is None:
            for var, decl in index.items():
                cond, bound = _bound(cs, s.child_by_field_name("condition"), var)
                if cond is not None:
                    return ElementLoop(var, "guard", s, cond, bound, s.child_by_field_name("consequence"), decl)
        elif s.type == "for_statement":
            init = s.child_by_field_name("initializer")
            decl = next((n for n in ct.walk(init) if n.type == "init_declarator"), None) if init is not None else None
            var = cs.text(decl.child_by_field_name("declarator")) if decl is not None else ""
            stride = _squash(cs, s.child_by_field_name("update"))
            if init is None:  # `for (; i < n; i += ...)` over an index declared before
                var = next((v for v in index if stride in (f"{v}+={x}" for x in STRIDES)), "")
            indexed = var in index and init is None
            if (indexed or decl is not None and _is_global(cs, decl.child_by_field_name("value"))) \
                    and stride in (f"{var}+={x}" for x in STRIDES):
                cond, bound = _bound(cs, s.child_by_field_name("condition"), var)
                if cond is not None:
                    return ElementLoop(var, "stride", s, cond, bound, s.child_by_field_name("body"), None)
    raise Skip(f"{fn.name} has no element loop (int i = blockIdx.x * blockDim.x + threadIdx.x; then if (i < n) or a "
               "grid-stride for): not an element-wise kernel")


def forbidden(cs: ct.CSource, body) -> str | None:
    """What in the loop body stops a rewrite of its trip (a barrier, a return), or None."""
    for n in ct.walk(body):
        if n.type == "return_statement":
            return "a return"
        if n.type == "call_expression" and cs.text(n.child_by_field_name("function")) in ("__syncthreads",
                                                                                          "__syncwarp"):
            return "a barrier"
    return None


def used_after(cs: ct.CSource, fn: ct.Function, node, var: str) -> bool:
    """Whether `var` is read after `node` in the kernel's body."""
    return any(n.type == "identifier" and cs.text(n) == var and n.start_byte >= node.end_byte
               for n in ct.walk(fn.body))


def grid_edit(cs: ct.CSource, launch: ct.Launch, divisor: int) -> ct.Edit:
    """The launch's grid divided by `divisor`, rounded up: `blocks` -> `(blocks + 3) / 4`."""
    g = launch.grid
    text = cs.text(g)
    inner = text if g.type in ("identifier", "number_literal", "parenthesized_expression") else f"({text})"
    return ct.Edit(g.start_byte, g.end_byte, f"({inner} + {divisor - 1}) / {divisor}")


def dim3_grid(cs: ct.CSource, launch: ct.Launch) -> bool:
    """Whether the launch's grid is a dim3 (a constructor call, or a host local declared dim3)."""
    g = launch.grid
    if g.type == "call_expression" or "dim3" in cs.text(g):
        return True
    host = ct.functions(cs)[launch.host]
    return g.type == "identifier" and any(
        n.type == "declaration" and cs.text(n.child_by_field_name("type")) == "dim3"
        and cs.text(g) in {cs.text(i) for i in ct.walk(n) if i.type == "identifier"} for n in ct.walk(host.body))
