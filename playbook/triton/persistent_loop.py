"""The kernel side of `triton-persistent`: the kernel body rewritten into a loop over its work
items (see playbook/triton/persistent.py for the recipe, persistent_grid.py for the grid).

`plan_kernel` decides, statement by statement, what becomes of the body: the statements that
name the program ids (`row = tl.program_id(0)`) become the loop variable or are decoded from it,
`x = tl.num_programs(a)` becomes the grid size it stood for, work-item invariant index
arithmetic assigned once stays before the loop, and everything else moves into the loop in its
original order. Anything it cannot rewrite safely raises `Skip` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import libcst as cst

from playbook.cst.aliases import calls, is_call
from playbook.cst.kernels import params
from playbook.cst.names import assign_of, assigned_names, assignments, names_in
from playbook.cst.source import Skip, code_of, walk
from playbook.cst.templates import Rename
from playbook.triton.persistent_grid import Grid, Translator

HOISTABLE = {"arange", "cdiv", "minimum", "maximum", "multiple_of", "max_contiguous", "full", "zeros"}
SPINNING = ("atomic_cas", "atomic_xchg")  # flags and locks between programs


# ----------------------------------------------------------------------------------- small helpers


def _unparen(code: str) -> str:
    """`code` without redundant outer parentheses."""
    expr = cst.parse_expression(code)
    return code_of(expr)


def program_axis(call: cst.Call) -> int | None:
    """The literal axis of `tl.program_id(a)` / `tl.num_programs(axis=a)`."""
    if len(call.args) != 1 or (call.args[0].keyword is not None and call.args[0].keyword.value != "axis"):
        return None
    value = call.args[0].value
    return int(value.evaluated_value) if isinstance(value, cst.Integer) else None


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _reads_pid(node: cst.CSTNode, tl: str) -> bool:
    return bool(calls(node, tl, "program_id", "num_programs"))


def is_persistent(fn: cst.FunctionDef, tl: str) -> bool:
    """A loop whose range reads `tl.num_programs`: the kernel already strides over its work."""
    return any(isinstance(n, cst.For) and calls(n.iter, tl, "num_programs") for n in walk(fn.body))


# ----------------------------------------------------------------------------------- the plan


@dataclass
class KernelPlan:
    """How one kernel becomes persistent."""
    body: list[cst.BaseStatement]  # the new function body
    new_params: dict[str, cst.BaseExpression]  # runtime size parameters to add -> the wrapper expression passed
    items: str  # rows | blocks | tiles (for the title)
    hoisted: list[str]  # names of the per-program setup statements moved before the loop (run once per program)


class _ReplacePids(cst.CSTTransformer):
    """`tl.program_id(a)` -> the work item's id on axis a; `tl.num_programs(a)` -> the grid's size on it."""

    def __init__(self, tl: str, pid: dict[int, str], size: dict[int, str]):
        self.tl, self.pid, self.size = tl, pid, size

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if is_call(original, self.tl, "program_id", "num_programs"):
            table = self.pid if original.func.attr.value == "program_id" else self.size
            return cst.Name(table[program_axis(original)])
        return updated


def _linear_pid(value: cst.BaseExpression, tl: str, size0: str) -> bool:
    """`tl.program_id(1) * S0 + tl.program_id(0)` (either order), S0 the size of axis 0: the index
    of the program in launch order (grouped ordering's `pid` on a 2-D grid)."""
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)):
        return False
    for prod, first in ((value.left, value.right), (value.right, value.left)):
        if not (is_call(first, tl, "program_id") and program_axis(first) == 0):
            continue
        if isinstance(prod, cst.BinaryOperation) and isinstance(prod.operator, cst.Multiply):
            for pid, size in ((prod.left, prod.right), (prod.right, prod.left)):
                if is_call(pid, tl, "program_id") and program_axis(pid) == 1 and (
                        (isinstance(size, cst.Name) and size.value == size0)
                        or (is_call(size, tl, "num_programs") and program_axis(size) == 0)):
                    return True
    return False


def _hoistable(stmt: cst.CSTNode) -> bool:
    """Only cheap, side-effect-free index arithmetic moves out of the loop (never a load)."""
    for node in walk(stmt):
        if isinstance(node, cst.Call):
            if not (isinstance(node.func, cst.Attribute) and node.func.attr.value in HOISTABLE):
                return False
    return True


@dataclass
class _Ids:
    """The kernel's names for its program ids and grid sizes, by axis."""
    pid: dict[int, str]
    size: dict[int, str]
    drop: set[int]  # statements that only name a program id (or the launch-order index): the loop takes them over
    size_stmt: dict[int, int]  # axis -> index of its `x = tl.num_programs(a)` statement
    own: set[str]  # of those names, the ones the kernel gave itself


def _check(fn: cst.FunctionDef, tl: str, n: int, helpers: dict[str, cst.FunctionDef]) -> None:
    """Skip a kernel whose meaning a loop over its work items would change, or that it cannot see through."""
    name = fn.name.value
    if any(isinstance(node, cst.Return) for node in walk(fn.body)):
        raise Skip(f"{name} returns early: in a persistent loop that would drop the program's other work items")
    if calls(fn.body, tl, *SPINNING):
        raise Skip(f"{name} uses tl.atomic_cas / tl.atomic_xchg: a program could wait on a work item it owns itself")
    if is_persistent(fn, tl):
        raise Skip(f"{name} is already persistent (a loop strides by tl.num_programs)")
    if not calls(fn.body, tl, "program_id"):
        raise Skip(f"{name} does not read its program id")
    axes = {program_axis(c) for c in calls(fn.body, tl, "program_id", "num_programs")}
    if None in axes:
        raise Skip(f"{name} reads a program id whose axis is not a literal")
    if max(axes) >= n:
        raise Skip(f"{name} reads program axis {max(axes)} of a {n}-D grid")
    called = {c.func.value for c in walk(fn.body) if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)}
    for helper in sorted(called & set(helpers)):
        if _reads_pid(helpers[helper], tl):
            raise Skip(f"{name} calls {helper}, which reads the program id itself")


def _program_ids(stmts: list[cst.BaseStatement], tl: str, n: int, once: Callable[[str], bool]) -> _Ids:
    """The kernel's own names for its program ids and grid sizes (top-level `x = tl.program_id(a)`,
    `x = tl.num_programs(a)`), and new names for the axes it does not name."""
    pid: dict[int, str] = {}
    size: dict[int, str] = {}
    drop: set[int] = set()
    size_stmt: dict[int, int] = {}
    for i, stmt in enumerate(stmts):
        a = assign_of(stmt)
        if a is None or not once(a[0]):
            continue
        if is_call(a[1], tl, "program_id") and program_axis(a[1]) not in pid:
            pid[program_axis(a[1])] = a[0]
            drop.add(i)
        elif is_call(a[1], tl, "num_programs") and program_axis(a[1]) not in size:
            size[program_axis(a[1])] = a[0]
            size_stmt[program_axis(a[1])] = i
    own = {*pid.values(), *size.values()}
    for a in range(n):
        pid.setdefault(a, "pid" if n == 1 else f"pid_{a}")
        size.setdefault(a, "n_rows" if n == 1 and pid[a] == "row" else f"num_{pid[a]}")
    return _Ids(pid, size, drop, size_stmt, own)


def _loop_variable(stmts: list[cst.BaseStatement], tl: str, n: int, ids: _Ids, once: Callable[[str], bool]) -> str:
    """The loop variable: the 1-D program id, or the launch-order index of a 2-D grid (its statement
    then goes, as the program ids' do), or a new tile index."""
    loop_var = ids.pid[0] if n == 1 else None
    if n == 2:
        for i, stmt in enumerate(stmts):
            a = assign_of(stmt)
            if a and i not in ids.drop and once(a[0]) and _linear_pid(a[1], tl, ids.size[0]):
                loop_var = a[0]
                ids.own.add(a[0])
                ids.drop.add(i)
                break
    return loop_var or "tile_id"


def _grid_bounds(grid: Grid, translate: Translator, ids: _Ids) -> tuple[dict[int, str], dict[str, cst.BaseExpression]]:
    """The grid in kernel terms, by axis; a size the kernel cannot compute from its arguments
    becomes a new parameter (returned with the wrapper expression the launch passes for it)."""
    bounds: dict[int, str] = {}
    new_params: dict[str, cst.BaseExpression] = {}
    for a, expr in enumerate(grid.axes):
        moving = sorted(names_in(expr) & translate.unstable)
        if moving:  # the grid and the launch could see different values of it
            raise Skip(f"the wrapper assigns {', '.join(moving)} more than once: the grid's value is not the launch's")
        k = translate(expr)
        if k is not None:
            bounds[a] = _unparen(k)
        elif grid.meta and grid.meta in names_in(expr):
            raise Skip(f"grid axis {a} (`{code_of(expr)}`) reads the meta-parameters in a way the kernel cannot recompute")
        else:  # named after the size, unless a `x = tl.num_programs(a)` statement already holds that name
            param = ids.size[a] if a not in ids.size_stmt else f"grid_size_{a}"
            new_params[param] = expr
            bounds[a] = param
    return bounds, new_params


def _split_body(stmts: list[cst.BaseStatement], tl: str, ids: _Ids, loop_var: str, bounds: dict[int, str],
                declared: list[int], once: Callable[[str], bool]) -> tuple[list, list, list]:
    """The kernel body in three: its docstring, what stays before the loop (the grid sizes it names,
    work-item invariant index arithmetic assigned once), and the loop body in its original order."""
    replacer = _ReplacePids(tl, ids.pid, ids.size)
    tainted = {loop_var, *ids.pid.values()}
    prefix: list[cst.BaseStatement] = []
    hoisted: list[cst.BaseStatement] = [cst.parse_statement(f"{ids.size[a]} = {bounds[a]}\n") for a in declared]
    body: list[cst.BaseStatement] = []
    carry: list[cst.EmptyLine] = []  # comments of dropped statements move to the next statement
    for i, stmt in enumerate(stmts):
        if i == 0 and _is_docstring(stmt):
            prefix.append(stmt)
            continue
        if i in ids.drop:
            carry.extend(line for line in stmt.leading_lines if line.comment is not None)
            continue
        if carry:
            stmt = stmt.with_changes(leading_lines=[*stmt.leading_lines, *carry])
            carry = []
        axis = next((a for a, j in ids.size_stmt.items() if j == i), None)
        if axis is not None:  # `num_pid_m = tl.num_programs(0)` -> the grid size it stood for
            hoisted.append(stmt.with_changes(body=[stmt.body[0].with_changes(value=cst.parse_expression(bounds[axis]))]))
            continue
        new = stmt.visit(replacer)
        a = assign_of(new)
        if a and once(a[0]) and not (names_in(a[1]) & tainted) and _hoistable(new):
            hoisted.append(new)
        else:
            body.append(new)
            tainted |= assigned_names(new)
    return prefix, hoisted, body


def _decode(body: list[cst.BaseStatement], loop_var: str, ids: _Ids, n: int) -> list[cst.BaseStatement]:
    """For multi-axis grids: the program ids the loop body reads, decoded from the tile index (axis
    0 fastest, as a grid is dispatched)."""
    decode: list[cst.BaseStatement] = []
    if n == 1:
        return decode
    pid, size = ids.pid, ids.size
    reads = set().union(set(), *(names_in(s) for s in body))
    for a in range(n):
        if pid[a] not in reads:
            continue
        if a == 0:
            expr = f"{loop_var} % {size[0]}"
        elif a == n - 1:
            expr = f"{loop_var} // " + (size[0] if n == 2 else f"({size[0]} * {size[1]})")
        else:
            expr = f"{loop_var} // {size[0]} % {size[1]}"
        decode.append(cst.parse_statement(f"{pid[a]} = {expr}\n"))
    if decode:
        decode[0] = cst.parse_statement(code_of(decode[0]).rstrip("\n") + "  # axis 0 fastest, as the grid was dispatched\n")
    return decode


def plan_kernel(fn: cst.FunctionDef, tl: str, grid: Grid, translate: Translator,
                helpers: dict[str, cst.FunctionDef]) -> KernelPlan:
    name = fn.name.value
    n = len(grid.axes)
    assigned = assignments(fn)
    _check(fn, tl, n, helpers)

    def once(var: str) -> bool:
        return len(assigned.get(var, [])) == 1

    stmts = list(fn.body.body)
    ids = _program_ids(stmts, tl, n, once)
    loop_var = _loop_variable(stmts, tl, n, ids, once)
    bounds, new_params = _grid_bounds(grid, translate, ids)
    size = ids.size
    named = {size[program_axis(c)] for c in calls(fn.body, tl, "num_programs")} | ({size[a] for a in range(n)} if n > 1 else set())
    declared = [a for a in range(n) if size[a] in named and a not in ids.size_stmt and bounds[a] not in new_params]
    prefix, hoisted, body = _split_body(stmts, tl, ids, loop_var, bounds, declared, once)
    decode = _decode(body, loop_var, ids, n)
    # a parameter the body reassigns (`x_ptr += row * stride`, `eps = eps.to(...)`) gets a copy per
    # work item, so the next item starts from the value the launch passed
    rebound = [p.name.value for p in params(fn) if p.name.value in assigned]
    renames = {p: f"{p}_item" for p in rebound}
    if renames:
        copies = [cst.parse_statement(f"{renames[p]} = {p}\n") for p in rebound]
        copies[0] = copies[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
            "# parameters the body reassigns: a copy per work item"))])
        body = [*copies, *(stmt.visit(Rename(renames)) for stmt in body)]
    if n == 1:
        bound = size[0] if size[0] in named else bounds[0]
    else:
        bound = " * ".join(size[a] for a in range(n))
    introduced = ({loop_var} | {size[a] for a in declared} | set(new_params) | set(renames.values())
                  | {s.body[0].targets[0].target.value for s in decode}) - ids.own
    clash = sorted(introduced & names_in(fn))
    if clash:
        raise Skip(f"{name} already uses {', '.join(clash)}")
    items = "rows" if n == 1 and ids.pid[0] == "row" else ("blocks" if n == 1 else "tiles")
    loop = cst.parse_statement(f"for {loop_var} in {tl}.range({tl}.program_id(0), {bound}, {tl}.num_programs(0)):\n"
                               f"    pass\n")
    loop = loop.with_changes(body=loop.body.with_changes(body=[*decode, *body]), leading_lines=[cst.EmptyLine(
        comment=cst.Comment(f"# persistent: each program walks the {items} {tl}.num_programs(0) apart"))])
    setup = [a[0] for st in hoisted if (a := assign_of(st)) and a[0] not in set(size.values())]
    return KernelPlan([*prefix, *hoisted, loop], new_params, items, setup)
