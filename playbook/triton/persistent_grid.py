"""The grid of a launch that `triton-persistent` rewrites, in kernel terms: the grid tuple (inline,
assigned to a name, or the body of a `lambda meta: ...`), and each grid size as an expression the
kernel can compute from its own arguments (see playbook/triton/persistent.py for the recipe)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from playbook.cst.aliases import Aliases, is_call
from playbook.cst.kernels import is_constexpr, params
from playbook.cst.launches import Launch, bound_args
from playbook.cst.names import assignments
from playbook.cst.source import Skip, code_of, walk

WRAPPER_INDENT = 4  # a launch wrapper's statements, in a module-level function
SIZE_OPS = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)
OP_TEXT = {cst.Add: "+", cst.Subtract: "-", cst.Multiply: "*", cst.FloorDivide: "//"}


@dataclass(frozen=True)
class Grid:
    tuple_node: cst.Tuple  # the grid tuple (inline, assigned to a name, or the body of a lambda)
    axes: list[cst.BaseExpression]
    meta: str | None  # the lambda's parameter, when the grid is a function of the meta-parameters
    column: int  # where the tuple starts once it is assigned to a name (for line breaks)


def resolve_grid(launch: Launch) -> Grid:
    expr = launch.grid
    if isinstance(expr, cst.Name):
        assigns = [n for n in walk(launch.wrapper.body) if isinstance(n, cst.Assign)
                   and any(isinstance(t.target, cst.Name) and t.target.value == expr.value for t in n.targets)]
        uses = [n for n in walk(launch.wrapper.body) if isinstance(n, cst.Name) and n.value == expr.value]
        if len(assigns) != 1 or len(assigns[0].targets) != 1 or len(uses) != 2:
            raise Skip(f"grid `{expr.value}` is not assigned exactly once and used only by the launch")
        expr = assigns[0].value
    meta = None
    if isinstance(expr, cst.Lambda):
        ps = expr.params
        if len(ps.params) != 1 or ps.posonly_params or ps.kwonly_params or ps.star_kwarg is not None \
                or isinstance(ps.star_arg, cst.Param):
            raise Skip("the grid function does not take exactly one argument (the meta-parameters)")
        meta = ps.params[0].name.value
        expr = expr.body
    if not isinstance(expr, cst.Tuple) or not 1 <= len(expr.elements) <= 3 \
            or any(isinstance(e, cst.StarredElement) for e in expr.elements):
        raise Skip(f"the grid is not a tuple of 1 to 3 sizes: `{code_of(expr)}`")
    column = WRAPPER_INDENT + len(f"{code_of(launch.grid) if isinstance(launch.grid, cst.Name) else 'grid'} = ")
    column += len(f"lambda {meta}: ") if meta else 0
    return Grid(expr, [e.value for e in expr.elements], meta, column)


class Translator:
    """Grid sizes (wrapper expressions) as kernel expressions: names through the launch arguments
    they are passed as, `meta["BLOCK"]` as the constexpr BLOCK, `triton.cdiv` as `tl.cdiv`."""

    def __init__(self, launch: Launch, fn: cst.FunctionDef, al: Aliases, meta: str | None):
        self.tl, self.triton, self.meta = al.tl, al.triton, meta
        pnames = [p.name.value for p in params(fn)]
        self.constexprs = {p.name.value for p in params(fn) if is_constexpr(p, al)}
        self.by_code: dict[str, str] = {}
        for name, value in bound_args(launch, pnames):
            if not isinstance(value, cst.Integer):
                self.by_code.setdefault(code_of(value), name)
        assigned = assignments(launch.wrapper)
        self.unstable = {name for name, values in assigned.items() if len(values) > 1}

    def __call__(self, expr: cst.BaseExpression) -> str | None:
        code = code_of(expr)
        if code in self.by_code:
            return self.by_code[code]
        if isinstance(expr, cst.Integer):
            return expr.value
        if (isinstance(expr, cst.Subscript) and self.meta and isinstance(expr.value, cst.Name)
                and expr.value.value == self.meta and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index)
                and isinstance(expr.slice[0].slice.value, cst.SimpleString)):
            key = expr.slice[0].slice.value.evaluated_value
            return key if key in self.constexprs else None
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, SIZE_OPS):
            left, right = self(expr.left), self(expr.right)
            return None if left is None or right is None else f"({left} {OP_TEXT[type(expr.operator)]} {right})"
        if is_call(expr, self.triton, "cdiv") and len(expr.args) == 2 and all(a.keyword is None for a in expr.args):
            a, b = self(expr.args[0].value), self(expr.args[1].value)
            return None if a is None or b is None else f"{self.tl}.cdiv({a}, {b})"
        return None
