"""Where a cuTile kernel is launched, `ct.launch(stream, grid, kernel, (args...))` or a launch
plan `return (grid, kernel, (args...), ...)` (the form cutile-autotune writes), and the launch's
arguments extended for new kernel parameters."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from playbook.cst.kernels import module_functions
from playbook.cst.launches import cutile_launch_argument, is_cutile_launch
from playbook.cst.names import assign_of, assignments
from playbook.cst.source import Skip, walk


@dataclass(frozen=True)
class CtLaunch:
    """Where a kernel is launched: `ct.launch(stream, grid, kernel, (args...))` as a statement, or
    a launch plan `return (grid, kernel, (args...), ...)` (the form cutile-autotune writes)."""
    wrapper: cst.FunctionDef
    stmt: cst.SimpleStatementLine  # the statement holding it, one of the wrapper's body
    grid_node: cst.BaseExpression  # the grid as written there (a tuple, or a name)
    grid: tuple[cst.BaseExpression, ...]  # the grid's extents
    grid_stmt: cst.SimpleStatementLine | None  # `grid = (...)` when the launch names its grid
    args: cst.Tuple


def _launch_parts(node: cst.CSTNode, ct: str, kernel: str) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(grid, args) when `node` launches (or plans the launch of) `kernel`."""
    if isinstance(node, cst.Call) and is_cutile_launch(node, {ct: "cuda.tile"}):
        parts = [cutile_launch_argument(node, role) for role in ("grid", "kernel", "args")]
    elif isinstance(node, cst.Tuple) and len(node.elements) >= 3:
        parts = [e.value for e in node.elements[:3]]
    else:
        return None
    if isinstance(parts[1], cst.Name) and parts[1].value == kernel:
        return parts[0], parts[2]
    return None


def ct_launch(module: cst.Module, ct: str, kernel: str) -> CtLaunch:
    """The one launch of `kernel` in a module-level function, or Skip with the reason."""
    found = [(fn, node, parts) for fn in module_functions(module) for node in walk(fn.body)
             if (parts := _launch_parts(node, ct, kernel)) is not None]
    if len(found) != 1:
        raise Skip(f"{kernel} is launched {len(found)} times (one ct.launch or launch plan expected)")
    fn, node, (grid_node, args) = found[0]
    stmt = next((s for s in fn.body.body if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and (
        isinstance(s.body[0], cst.Expr) and s.body[0].value is node
        or isinstance(s.body[0], cst.Return) and s.body[0].value is node)), None)
    if stmt is None:
        raise Skip(f"the launch of {kernel} is not a statement (or `return`) of its own in {fn.name.value}")
    if not isinstance(args, cst.Tuple):
        raise Skip(f"the arguments of {kernel} are not a tuple literal in its launch")
    grid, grid_stmt = grid_node, None
    if isinstance(grid, cst.Name):
        bound = [s for s in fn.body.body if assign_of(s) and assign_of(s)[0] == grid.value]
        reads = [n for n in walk(fn.body) if isinstance(n, cst.Name) and n.value == grid.value]
        if len(bound) != 1 or len(assignments(fn).get(grid.value, [])) != 1 or len(reads) != 2:
            raise Skip(f"the grid `{grid.value}` of {kernel} is not one tuple used only by the launch")
        grid_stmt, grid = bound[0], assign_of(bound[0])[1]
    if not isinstance(grid, cst.Tuple) or not 1 <= len(grid.elements) <= 3:
        raise Skip(f"the grid of {kernel} is not a tuple literal of 1 to 3 extents")
    return CtLaunch(fn, stmt, grid_node, tuple(e.value for e in grid.elements), grid_stmt, args)


def append_args(args: cst.Tuple, names: list[str]) -> cst.Tuple:
    elems = list(args.elements)
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    new = [cst.Element(cst.Name(n)) for n in names]
    if elems:
        last = elems[-1]
        if isinstance(last.comma, cst.Comma) and len(elems) > 1:  # keep a trailing comma where it was
            new[-1] = new[-1].with_changes(comma=last.comma)
        elems[-1] = last.with_changes(comma=comma)
    new = [e.with_changes(comma=comma) for e in new[:-1]] + [new[-1]]
    return args.with_changes(elements=[*elems, *new])
