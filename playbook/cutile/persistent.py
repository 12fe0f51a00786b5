"""Recipe `cutile-persistent` (TileGym playbook B): a persistent grid.

A fixed grid of min(work, SMs x BLOCKS_PER_SM) blocks, each looping over the work items that the
original grid gave to separate blocks:

* a 1-D grid (`row = ct.bid(0)`, grid `(rows, 1, 1)`) becomes
  `for row in range(ct.bid(0), num_rows, ct.num_blocks(0))`, `num_rows` a new kernel parameter;
* a 2-D grid (`bid_m = ct.bid(0)`, `bid_n = ct.bid(1)`, grid `(M, N, 1)`) becomes a loop over a
  linear work id in the original launch order (axis 0 fastest), `bid_m = work_id % grid_0`,
  `bid_n = work_id // grid_0`; every `ct.bid` / `ct.num_blocks` of the kernel is rewritten so.

The whole kernel body becomes the loop body, so every item runs exactly the code it ran before:
a bijection of the same work items, results bit-identical. The wrapper computes the grid from
the SM count (`torch.cuda.get_device_properties`, cached per device) times BLOCKS_PER_SM, a new
module constant set to the kernel's occupancy hint (1 without one); once persistent, the recipe
proposes doubling BLOCKS_PER_SM. The kernel must be launched once, by a `ct.launch(stream, grid,
kernel, (args...))` statement or a launch plan `return (grid, kernel, (args...), ...)` (the form
cutile-autotune writes); anything else, a 3-D grid, or an early `return` in the kernel is a Skip
with the reason.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases, calls, is_attr
from playbook.cst.constants import add_module_constant, module_int_constants
from playbook.cst.edits import ReplaceNodes, kwarg_value, replace
from playbook.cst.imports import imports
from playbook.cst.kernels import ct_kernels, is_ct_kernel
from playbook.cst.names import assign_of, assignments
from playbook.cst.source import Skip, checked, parse, walk
from playbook.cutile.kernels import MMA_OPS, append_params, axis_of, param, statements, variables
from playbook.cutile.launch_site import CtLaunch, append_args, ct_launch
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register

BLOCKS_PER_SM = "BLOCKS_PER_SM"
MAX_BLOCKS_PER_SM = 32  # cuTile's occupancy hint goes up to 32 as well
SM_COUNT = "_sm_count"


# ----------------------------------------------------------------------------------- kernel and module helpers


def _axes(fn: cst.FunctionDef, ct: str, name: str) -> list[int]:
    out = []
    for call in calls(fn.body, ct, name):
        axis = axis_of(call, ct, name)
        if axis is None:
            raise Skip(f"{fn.name.value}: ct.{name} with a non-literal axis")
        out.append(axis)
    return out


def _is_linear_bid(value: cst.BaseExpression, ct: str, assigned: dict[str, list[cst.BaseExpression]]) -> bool:
    """`ct.bid(1) * n + ct.bid(0)` with `n = ct.num_blocks(0)`: the block's place in launch order."""
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)
            and axis_of(value.right, ct, "bid") == 0 and isinstance(value.left, cst.BinaryOperation)
            and isinstance(value.left.operator, cst.Multiply) and axis_of(value.left.left, ct, "bid") == 1
            and isinstance(value.left.right, cst.Name)):
        return False
    bound = assigned.get(value.left.right.value, [])
    return len(bound) == 1 and axis_of(bound[0], ct, "num_blocks") == 0


def _is_one(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and int(node.evaluated_value) == 1


def _import_functools(module: cst.Module) -> cst.Module:
    """`import functools` first among the imports (a blank line before third-party ones)."""
    body = list(module.body)
    for s in body:
        if isinstance(s, cst.SimpleStatementLine) and any(
                isinstance(x, cst.Import) and any(isinstance(n.name, cst.Name) and n.name.value == "functools"
                                                  and n.asname is None for n in x.names) for x in s.body):
            return module
    at = next((i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
               and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)), None)
    if at is None:
        raise Skip("no import block to add `import functools` to")
    first = body[at]
    new = cst.parse_statement("import functools\n").with_changes(leading_lines=first.leading_lines)
    small = first.body[0]
    top = (small.names[0].name if isinstance(small, cst.Import) else small.module) if not (
        isinstance(small, cst.ImportFrom) and small.relative) else None
    root = top
    while isinstance(root, cst.Attribute):
        root = root.value
    stdlib = isinstance(root, cst.Name) and root.value in sys.stdlib_module_names
    body[at] = first.with_changes(leading_lines=[] if stdlib else [cst.EmptyLine()])
    body.insert(at, new)
    return module.with_changes(body=body)


# ----------------------------------------------------------------------------------- persistent


def _occupancy(fn: cst.FunctionDef, al: Aliases) -> int:
    dec = next(d for d in fn.decorators if is_ct_kernel(d, al))
    value = kwarg_value(dec.decorator, "occupancy") if isinstance(dec.decorator, cst.Call) else None
    return int(value.evaluated_value) if isinstance(value, cst.Integer) else 1


def _body_split(fn: cst.FunctionDef) -> tuple[list[cst.BaseStatement], list[cst.BaseStatement]]:
    """(docstring statements, the rest) of a function body."""
    stmts = list(fn.body.body)
    if stmts and isinstance(stmts[0], cst.SimpleStatementLine) and isinstance(stmts[0].body[0], cst.Expr) \
            and isinstance(stmts[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        return stmts[:1], stmts[1:]
    return [], stmts


def _launch_to_rewrite(module: cst.Module, ct: str, fn: cst.FunctionDef) -> tuple[CtLaunch, bool, bool]:
    """The kernel's launch, whether its grid is 2-D, and whether the module already has the SM
    count and BLOCKS_PER_SM (another kernel's persistent grid: shared); Skip where the kernel or the
    module does not fit."""
    name = fn.name.value
    if any(isinstance(n, cst.For) and calls(n.iter, ct, "bid") for n in walk(fn.body)):
        raise Skip(f"{name} is already persistent (a loop over ct.bid)")
    if any(isinstance(n, cst.Return) for n in walk(fn.body)):
        raise Skip(f"{name} returns early: inside a loop that would end the block's remaining work")
    bid_axes, nb_axes = _axes(fn, ct, "bid"), _axes(fn, ct, "num_blocks")
    if not bid_axes:
        raise Skip(f"{name} never reads ct.bid")
    launch = ct_launch(module, ct, name)
    grid = launch.grid
    if len(grid) == 3 and not _is_one(grid[2]) or 2 in bid_axes + nb_axes:
        raise Skip(f"{name} has a 3-D grid")
    two_d = len(grid) >= 2 and not _is_one(grid[1])
    if not two_d and 1 in bid_axes + nb_axes:
        raise Skip(f"{name} reads axis 1 of a 1-D grid")
    module_names = variables(module)
    shared = _has_sm_count(module) and BLOCKS_PER_SM in module_int_constants(module)  # another kernel's
    clash = {BLOCKS_PER_SM, SM_COUNT} & module_names
    if clash and not shared:
        raise Skip(f"the module already uses {', '.join(sorted(clash))}")
    if "functools" in module_names and not _imports_functools(module):
        raise Skip("`functools` names something other than the module")
    if not imports(module, "torch"):
        raise Skip("needs `import torch` (the SM count comes from torch.cuda.get_device_properties)")
    return launch, two_d, shared


@dataclass
class _Work:
    """How the kernel's block ids become a loop over its work items."""
    body: list[cst.BaseStatement]  # the statements that become the loop body
    mapping: dict[cst.CSTNode, cst.BaseExpression]  # ct.bid / ct.num_blocks reads -> their loop-time values
    header: str  # the `for ... in range(ct.bid(0), ..., ct.num_blocks(0)):` line
    params: list[cst.Param]  # new kernel parameters: the grid's extents
    extents: list[str]  # their names
    what: str  # what the work items are (rows, tiles, work items)
    count: str  # their number, in the kernel


def _work_2d(fn: cst.FunctionDef, ct: str, launch: CtLaunch, body: list[cst.BaseStatement]) -> _Work:
    """A 2-D grid: a loop over the linear work id in launch order (axis 0 fastest), each block id
    decoded from it."""
    name = fn.name.value
    assigned = assignments(fn)
    var, extents = "work_id", ["grid_0", "grid_1"]
    clash = (variables(fn) | variables(launch.wrapper)) & {var, *extents, "blocks"}
    if clash:
        raise Skip(f"{name} or its wrapper already uses {', '.join(sorted(clash))}")
    mapping: dict[cst.CSTNode, cst.BaseExpression] = {}
    direct = {s.body[0].value for s in body if assign_of(s) and axis_of(assign_of(s)[1], ct, "bid") is not None}
    for value in (v for values in assigned.values() for v in values if _is_linear_bid(v, ct, assigned)):
        mapping[value] = cst.Name(var)  # the launch-order linearisation is the work id itself
    for call in calls(fn.body, ct, "bid", "num_blocks"):
        if is_attr(call.func, ct, "num_blocks"):
            mapping[call] = cst.Name(extents[axis_of(call, ct, "num_blocks")])
        else:
            op = "%" if axis_of(call, ct, "bid") == 0 else "//"
            expr = cst.parse_expression(f"{var} {op} {extents[0]}")
            mapping[call] = expr if call in direct else expr.with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    header = f"for {var} in range({ct}.bid(0), {extents[0]} * {extents[1]}, {ct}.num_blocks(0)):"
    what = "tiles" if calls(fn.body, ct, *MMA_OPS) else "work items"
    return _Work(body, mapping, header, [param(e, "int") for e in extents], extents, what,
                 f"{extents[0]} * {extents[1]}")


def _work_1d(fn: cst.FunctionDef, ct: str, launch: CtLaunch, body: list[cst.BaseStatement]) -> _Work:
    """A 1-D grid: a loop whose variable is the block id's own name (`row`), when the kernel names
    it once, else `work_id`; its statement `row = ct.bid(0)` goes."""
    name = fn.name.value
    assigned = assignments(fn)
    used = variables(fn)
    first = next((s for s in body if assign_of(s) and axis_of(assign_of(s)[1], ct, "bid") == 0), None)
    named = assign_of(first)[0] if first is not None else None
    var = named if named and len(assigned.get(named, [])) == 1 else "work_id"
    if var == "work_id" and var in used:
        raise Skip(f"{name} already uses work_id")
    if var != "work_id":
        body = [s for s in body if s is not first]
    count = "num_rows" if var == "row" else "num_items"
    clash = (used | variables(launch.wrapper)) & {count, "blocks"}
    if clash:
        raise Skip(f"{name} or its wrapper already uses {', '.join(sorted(clash))}")
    mapping: dict[cst.CSTNode, cst.BaseExpression] = {}
    for call in calls(fn.body, ct, "bid", "num_blocks"):
        mapping[call] = cst.Name(var if is_attr(call.func, ct, "bid") else count)
    header = f"for {var} in range({ct}.bid(0), {count}, {ct}.num_blocks(0)):"
    return _Work(body, mapping, header, [param(count, "int")], [count], "rows" if var == "row" else "work items",
                 count)


def _fixed_grid(launch: CtLaunch, extents: list[str], two_d: bool) -> tuple[cst.BaseStatement, cst.FunctionDef]:
    """The SM-count helper, and the wrapper launching a fixed grid of min(work, SMs x BLOCKS_PER_SM)
    blocks with the grid's extents passed to the kernel."""
    grid = launch.grid
    if two_d:
        prep = [f"{extents[0]}, {extents[1]} = {_code(grid[0])}, {_code(grid[1])}"]
    elif isinstance(grid[0], cst.Name):
        extents, prep = [grid[0].value], []
    else:
        prep = [f"{extents[0]} = {_code(grid[0])}"]
    work = f"{extents[0]} * {extents[1]}" if two_d else extents[0]
    prep.append(f"blocks = min({work}, {SM_COUNT}(torch.cuda.current_device()) * {BLOCKS_PER_SM})")
    anchor = launch.grid_stmt or launch.stmt
    launch_stmt = launch.stmt.visit(ReplaceNodes({
        launch.grid_node: cst.parse_expression("(blocks, 1, 1)"),
        launch.args: append_args(launch.args, extents)}))
    wrapper_body: list[cst.BaseStatement] = []
    for s in launch.wrapper.body.body:
        if s is anchor:
            wrapper_body.extend(statements(prep, leading=list(anchor.leading_lines)))
        if s is launch.stmt:
            wrapper_body.append(launch_stmt.with_changes(leading_lines=[]) if s is anchor else launch_stmt)
        elif s is not launch.grid_stmt:
            wrapper_body.append(s)
    wrapper = launch.wrapper.with_changes(body=launch.wrapper.body.with_changes(body=wrapper_body))
    helper = cst.parse_statement(
        f"@functools.cache\n"
        f"def {SM_COUNT}(device: int) -> int:\n"
        f'    """Streaming multiprocessors of a device, asked once per device."""\n'
        f"    return torch.cuda.get_device_properties(device).multi_processor_count\n")
    helper = helper.with_changes(leading_lines=launch.wrapper.leading_lines)
    return helper, wrapper.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])


@register
class CuTilePersistent(PatternRecipe):
    id = "cutile-persistent"
    title = "Persistent grid: SMs x BLOCKS_PER_SM blocks, each looping over the work"
    languages = ("cutile",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        al, kernels = ct_kernels(module)
        out, reasons = per_kernel(kernels, lambda name, fn: self._rewrite(module, al, fn), analysis)
        try:
            out.append(self._step_up(module))
        except Skip as exc:
            reasons.append(str(exc))
        return proposed(out, reasons)

    def _step_up(self, module: cst.Module) -> Candidate:
        """Once persistent: BLOCKS_PER_SM doubled (more blocks resident per SM to hide latency)."""
        stmt = next((s for s in module.body if assign_of(s) and assign_of(s)[0] == BLOCKS_PER_SM), None)
        if stmt is None or not _has_sm_count(module) or not isinstance(assign_of(stmt)[1], cst.Integer):
            raise Skip(f"no persistent grid ({BLOCKS_PER_SM} = <int>) to step up")
        k = int(assign_of(stmt)[1].evaluated_value)
        if k * 2 > MAX_BLOCKS_PER_SM:
            raise Skip(f"{BLOCKS_PER_SM} is already {k} (at most {MAX_BLOCKS_PER_SM})")
        code = checked(replace(module, {assign_of(stmt)[1]: cst.Integer(str(k * 2))}).code)
        return Candidate(self.id, "persistent", f"{self.id}:{BLOCKS_PER_SM}={k * 2}", f"{BLOCKS_PER_SM} {k} -> {k * 2}",
                         f"persistent grid of SMs x {k * 2} blocks instead of SMs x {k}: more blocks resident per SM "
                         f"hide more memory latency; expect gains while a block per SM leaves bandwidth unused, none "
                         f"once registers or shared memory cap residency (extra blocks then wait for a second wave)",
                         code)

    def _rewrite(self, module: cst.Module, al: Aliases, fn: cst.FunctionDef) -> Candidate:
        name = fn.name.value
        launch, two_d, shared = _launch_to_rewrite(module, al.ct, fn)
        docstring, body = _body_split(fn)
        leading = body[0].leading_lines if body else ()
        work = (_work_2d if two_d else _work_1d)(fn, al.ct, launch, body)
        if not work.body:
            raise Skip(f"{name} has no work after reading its block id")

        # the kernel: its whole body (minus the docstring) becomes the loop body
        new_body = [s.visit(ReplaceNodes(work.mapping)) for s in work.body]
        loop = cst.ensure_type(cst.parse_statement(f"{work.header}\n    pass\n"), cst.For)
        inner = [new_body[0].with_changes(leading_lines=[l for l in new_body[0].leading_lines if l.comment]),
                 *new_body[1:]]
        loop = loop.with_changes(body=loop.body.with_changes(body=inner), leading_lines=[
            *leading, cst.EmptyLine(comment=cst.Comment(
                f"# persistent: block b computes {work.what} b, b + num_blocks, b + 2 * num_blocks, ..."))])
        kernel_params = append_params(fn, work.params)

        k = _occupancy(fn, al)
        helper, wrapper = _fixed_grid(launch, work.extents, two_d)
        new = replace(module, {
            fn: lambda upd: upd.with_changes(params=kernel_params, body=upd.body.with_changes(body=[*docstring, loop])),
            launch.wrapper: (lambda upd: wrapper) if shared else (lambda upd: cst.FlattenSentinel([helper, wrapper])),
        })
        if not shared:
            new = add_module_constant(new, BLOCKS_PER_SM, k, "persistent grid: blocks per SM (the occupancy hint)")
            new = _import_functools(new)
        code = checked(new.code)
        what, count_expr = work.what, work.count
        return Candidate(self.id, "persistent", f"{self.id}:{name}",
                         f"{name}: persistent grid, min({count_expr}, SMs x {k}) blocks looping over {what}",
                         f"{name}: a fixed grid of SMs x {k} blocks, each looping over {what} with stride "
                         f"num_blocks, instead of one block per item: SMs x {k} block launches instead of one per "
                         f"item, the whole body still run per item (nothing moves out of the loop; whether one "
                         f"item's loads overlap the previous item's math is the compiler's); TileGym reports "
                         f"+50-300% when there are far more items than 2 x SMs; expect a loss when there are fewer, "
                         f"or when {k} block(s) per SM cannot hide memory latency (then raise {BLOCKS_PER_SM})", code)


def _code(node: cst.BaseExpression) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _has_sm_count(module: cst.Module) -> bool:
    return any(isinstance(s, cst.FunctionDef) and s.name.value == SM_COUNT for s in module.body)


def _imports_functools(module: cst.Module) -> bool:
    return imports(module, "functools")
