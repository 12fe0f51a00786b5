"""Recipe `triton-persistent`: a fixed grid of programs that loop over the work items.

A kernel launched with one program per work item (a row, a block of elements, an output tile)
becomes persistent: the launch starts `min(work items, SMs x PROGRAMS_PER_SM)` programs and each
walks the work items `tl.num_programs(0)` apart,

    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):

so every item is still computed exactly once, by the program the round-robin gives it. A
parameter the body reassigns (`x_ptr += row * stride`, `eps = eps.to(tl.float32)`) is copied at
the top of each item (`x_ptr_item = x_ptr`) and the body uses the copy, so no item starts from
the value the previous one left. The
original grid is kept as the loop bound, translated into kernel terms:

* 1-D grids (`(rows,)`, `(triton.cdiv(n, BLOCK),)`): the program id statement `row = tl.program_id(0)`
  becomes the loop variable. A bound the kernel cannot compute from its arguments (`rows` is not
  passed to the softmax kernel) becomes a new runtime parameter (`n_rows`), passed by keyword.
* 2-D and 3-D grids (`(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))`): one loop over the
  linear tile index, decoded axis 0 fastest (the order in which a grid is dispatched), so
  `pid_m`, `pid_n` keep their meaning. `tl.num_programs(a)` reads become the grid sizes, and the
  launch-order index `tl.program_id(1) * num_pid_m + tl.program_id(0)` of grouped ordering
  becomes the loop variable: GROUP_SIZE_M swizzling composes unchanged.
* A grid that is a function of the autotuner's meta-parameters (`lambda meta: ...`) stays one:
  `meta["BLOCK"]` becomes the kernel's own `BLOCK`.

Statements that do not depend on the work item and are assigned once (`offs_k = tl.arange(...)`,
`num_pid_m = tl.cdiv(...)`) stay before the loop, computed once per program. The SM count comes
from `torch.cuda.get_device_properties(device).multi_processor_count` of the device the data is
on (cached per device; a CPU tensor under the Triton interpreter counts as one SM).
`PROGRAMS_PER_SM` starts at an estimate of the programs one SM holds at the launch's num_warps;
once the kernel is persistent the recipe proposes halving and doubling it (second thoughts).

Skipped (with the reason): kernels that `return` (an early exit would drop the program's other
items), that use `tl.atomic_cas` / `tl.atomic_xchg` (a program may spin on an item it owns
itself), that are already persistent, whose program ids reach helper functions, whose grid is not a tuple of 1-3
sizes or reads a name the wrapper reassigns, or that are launched more than once. The kernel side
of the rewrite lives in playbook/triton/persistent_loop.py.
"""

from __future__ import annotations

import sys

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases, calls
from playbook.cst.constants import SetConstant, int_value, module_int_constants
from playbook.cst.edits import add_kwarg, replace
from playbook.cst.imports import import_alias
from playbook.cst.kernels import is_constexpr, module_functions, params, triton_helpers
from playbook.cst.launches import Launch, bound_args, only_launch, read_triton, triton_launches
from playbook.cst.names import assign_of, assignments, names_in
from playbook.cst.source import Skip, checked, code_of, parse, walk
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register
from playbook.triton.persistent_grid import WRAPPER_INDENT, Grid, Translator, resolve_grid
from playbook.triton.persistent_loop import plan_kernel
from playbook.triton.whole_row import SUFFIX as WHOLE_ROW_SUFFIX

CONSTANT = "PROGRAMS_PER_SM"
HELPER = "_num_sms"
MAX_PROGRAMS_PER_SM = 32  # resident thread blocks per SM (sm_80 .. sm_100)
WARP_SLOTS_PER_SM = 64  # resident warps per SM (sm_80, sm_90, sm_100; 48 on sm_86/89/120)
DOT_WARPS_PER_SM = 16  # dot tiles: registers (~128 a thread) bound residency before warp slots do
DEFAULT_NUM_WARPS = 4  # Triton's default when the launch does not set num_warps
LINE_WIDTH = 120


def programs_per_sm(num_warps: int, dot: bool) -> int:
    """Programs one SM holds at `num_warps` warps each (an estimate: warp slots, or registers for dot tiles)."""
    return max(1, min(MAX_PROGRAMS_PER_SM, (DOT_WARPS_PER_SM if dot else WARP_SLOTS_PER_SM) // num_warps))


# ----------------------------------------------------------------------------------- the host side


def _launch_num_warps(launch: Launch, constants: dict[str, int]) -> int:
    arg = launch.kwarg("num_warps")
    value = int_value(arg.value, constants) if arg is not None else None
    return value[0] if value else DEFAULT_NUM_WARPS


def _device_tensor(launch: Launch, fn: cst.FunctionDef) -> str:
    """A tensor argument of the wrapper passed to the kernel (a `*_ptr` parameter first), or a local
    made from one (`x2d = x.contiguous().view(-1, n)`, `y = torch.empty_like(x2d)`): its device is
    the one whose SMs count."""
    tensors = {p.name.value for p in params(launch.wrapper)}
    assigned = assignments(launch.wrapper)
    changed = True
    while changed:  # locals derived from a tensor argument, through tensor methods or *_like
        changed = False
        for name, values in assigned.items():
            if name not in tensors and len(values) == 1 and _from_tensor(values[0], tensors):
                tensors.add(name)
                changed = True
    bound = bound_args(launch, [p.name.value for p in params(fn)])
    found = [(not pname.endswith("ptr"), value.value) for pname, value in bound
             if isinstance(value, cst.Name) and value.value in tensors]
    if not found:
        raise Skip(f"cannot tell which tensor argument of {launch.wrapper.name.value} gives the device (for its SM count)")
    return min(found, key=lambda f: f[0])[1]


def _from_tensor(value: cst.BaseExpression, tensors: set[str]) -> bool:
    """`t.view(...)`, `t.contiguous().view(...)` or `torch.empty_like(t)` of a tensor `t`."""
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Attribute):
        return False
    if value.func.attr.value.endswith("_like"):
        first = value.args[0].value if value.args else None
        return isinstance(first, cst.Name) and first.value in tensors
    base = value.func.value
    while isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute):
        base = base.func.value
    return isinstance(base, cst.Name) and base.value in tensors


def _grid_code(grid: Grid, device: str, column: int) -> str:
    """The persistent grid; past LINE_WIDTH (starting at `column`) the second argument of min() goes on
    a line of its own."""
    simple = (cst.Name, cst.Attribute, cst.Subscript, cst.Call, cst.Integer)
    factors = [code_of(a) if isinstance(a, simple) else f"({code_of(a)})" for a in grid.axes]
    first, second = f"(min({' * '.join(factors)}, ", f"{HELPER}({device}.device) * {CONSTANT}),)"
    if column + len(first) + len(second) > LINE_WIDTH:
        # (libcst re-adds the wrapper's indentation to a continuation line parsed at column 0)
        return first.rstrip() + "\n" + " " * (column + len("(min(") - WRAPPER_INDENT) + second
    return first + second


def _with_params(fn: cst.FunctionDef, names: list[str], launch: Launch, al: Aliases) -> cst.FunctionDef:
    """`fn` with runtime parameters `names` before its first constexpr parameter (or last, when the
    launch passes constexprs by position); the launch passes them by keyword."""
    if not names:
        return fn
    positional = next((i for i, a in enumerate(launch.call.args) if a.keyword is not None or a.star),
                      len(launch.call.args))
    ps = list(fn.params.params)
    if fn.params.posonly_params or fn.params.kwonly_params or isinstance(fn.params.star_arg, cst.Param) \
            or fn.params.star_kwarg is not None or any(p.default is not None for p in ps):
        raise Skip(f"{fn.name.value} has parameter defaults, *args or keyword-only parameters")
    at = next((i for i, p in enumerate(ps) if is_constexpr(p, al)), len(ps))
    if at < positional:
        at = len(ps)
    if any(a.star for a in launch.call.args):  # *args fill positions up to `at` only if the rest come by keyword
        by_keyword = {a.keyword.value for a in launch.call.args if a.keyword is not None}
        if any(p.name.value not in by_keyword for p in ps[at:]):
            raise Skip(f"the launch of {fn.name.value} passes *args: cannot tell where a new parameter may go")
    # one parameter a line where the kernel writes them so (a line break after the parenthesis and
    # after every comma); else on the line of the others
    sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if isinstance(fn.whitespace_before_params, cst.ParenthesizedWhitespace) and len(ps) > 1 and all(
            isinstance(p.comma, cst.Comma) and isinstance(p.comma.whitespace_after, cst.ParenthesizedWhitespace)
            for p in ps[:-1]):
        sep = ps[0].comma
    new = [cst.Param(cst.Name(n), comma=sep) for n in names]
    if at == 0:
        out = [*new, *ps]
    else:
        prev = ps[at - 1]
        new[-1] = new[-1].with_changes(comma=prev.comma)
        out = [*ps[:at - 1], prev.with_changes(comma=sep), *new, *ps[at:]]
    return fn.with_changes(params=fn.params.with_changes(params=out))


def _with_kwargs(call: cst.Call, kwargs: dict[str, cst.BaseExpression]) -> cst.Call:
    """`call` with `name=value` arguments before its first keyword argument (appended if none)."""
    for name, value in kwargs.items():
        args = list(call.args)
        at = next((i for i, a in enumerate(args) if a.keyword is not None), None)
        if at is None:
            call = add_kwarg(call, name, value)
            continue
        new = cst.Arg(keyword=cst.Name(name), value=value, equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        call = call.with_changes(args=[*args[:at], new, *args[at:]])
    return call


def _import_lines(body: list) -> list[tuple[int, str]]:
    """(index, top-level module) of the module's import statements before its first definition."""
    out = []
    for i, stmt in enumerate(body):
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            break
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
            small = stmt.body[0]
            if isinstance(small, cst.Import):
                out.append((i, code_of(small.names[0].name).split(".")[0]))
            elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
                out.append((i, code_of(small.module).split(".")[0]))
    return out


def _insert_import(body: list, name: str, group: list[tuple[int, str]], new_group_at: int) -> None:
    """`import name` in sorted position within `group` (index, module) of import lines, or as a group
    of its own before line `new_group_at` when `group` is empty."""
    if group:
        after = [i for i, mod in group if mod < name]
        at = after[-1] + 1 if after else group[0][0]
        line = cst.parse_statement(f"import {name}\n")
        if not after:  # first of its group: it takes the group's leading lines
            line = line.with_changes(leading_lines=body[at].leading_lines)
            body[at] = body[at].with_changes(leading_lines=[])
        body.insert(at, line)
        return
    line = cst.parse_statement(f"import {name}\n").with_changes(leading_lines=body[new_group_at].leading_lines)
    body[new_group_at] = body[new_group_at].with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(new_group_at, line)


def _imports(module: cst.Module) -> tuple[cst.Module, str, str]:
    """`module` importing functools (with the standard library) and torch (with triton) where it does
    not, and their local names."""
    ft, th = import_alias(module, "functools"), import_alias(module, "torch")
    body = list(module.body)
    lines = _import_lines(body)
    if not lines:
        raise Skip("the target has no imports")
    if th is None:
        third = [(i, mod) for i, mod in lines if mod not in sys.stdlib_module_names]
        _insert_import(body, "torch", third, lines[0][0])
        th = "torch"
    if ft is None:
        lines = _import_lines(body)
        std = [(i, mod) for i, mod in lines if mod in sys.stdlib_module_names]
        _insert_import(body, "functools", std, lines[0][0])
        ft = "functools"
    return module.with_changes(body=body), ft, th


def _add_module_parts(module: cst.Module, wrapper: str, programs: int, warps: int, dot: bool) -> cst.Module:
    module, ft, th = _imports(module)
    body = list(module.body)
    first_def = next((i for i, s in enumerate(body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))), len(body))
    consts = [i for i, s in enumerate(body[:first_def]) if assign_of(s) and assign_of(s)[0].isupper()]
    imports = [i for i, s in enumerate(body[:first_def]) if isinstance(s, cst.SimpleStatementLine)
               and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)]
    why = "dot tiles, registers" if dot else "warp slots"
    const = cst.parse_statement(f"{CONSTANT} = {programs}  # persistent grid: programs per SM (~ what one SM holds at "
                                f"num_warps={warps}: {why})\n")
    if consts:
        at = consts[-1] + 1
    else:
        at = imports[-1] + 1
        const = const.with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(at, const)
    helper = cst.parse_statement(
        f"@{ft}.cache\n"
        f"def {HELPER}(device: {th}.device) -> int:\n"
        f'    """Streaming multiprocessors of `device`, asked once per device; a CPU tensor (the Triton\n'
        f'    interpreter) counts as one."""\n'
        f'    if device.type != "cuda":\n'
        f"        return 1\n"
        f"    return {th}.cuda.get_device_properties(device).multi_processor_count\n")
    at = next(i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == wrapper)
    helper = helper.with_changes(leading_lines=body[at].leading_lines)
    body.insert(at, helper)
    return module.with_changes(body=body)


class _Shift(cst.CSTTransformer):
    """Continuation lines `delta` columns further right (they were aligned with a moved parenthesis)."""

    def __init__(self, delta: int):
        self.delta = delta

    def leave_ParenthesizedWhitespace(self, original, updated):
        width = len(updated.last_line.value) + self.delta
        if not updated.last_line.value or width < 0:
            return updated
        return updated.with_changes(last_line=cst.SimpleWhitespace(" " * width))


def _name_inline_grid(module: cst.Module, kernel: str, func_width: int) -> cst.Module:
    """`kernel[(min(...),)](...)` -> `grid = (min(...),)` on the line before and `kernel[grid](...)`
    (the launch line stays readable), when the launch is a statement of its wrapper and `grid` is free;
    `func_width` is the width of `kernel[...]` in the original source (continuation lines follow it)."""
    launches = triton_launches(module, [kernel])
    if len(launches) != 1 or isinstance(launches[0].grid, cst.Name):
        return module
    launch = launches[0]
    if "grid" in names_in(launch.wrapper):
        return module
    stmts = list(launch.wrapper.body.body)
    at = next((i for i, st in enumerate(stmts) if any(n is launch.call for n in walk(st))), None)
    if at is None or not isinstance(stmts[at], cst.SimpleStatementLine):
        return module  # inside a loop or a branch the grid may read names bound there
    assign = cst.parse_statement(f"grid = {cst.Module([]).code_for_node(launch.grid)}\n")
    sub = launch.call.func
    call = launch.call.with_changes(func=sub.with_changes(slice=[sub.slice[0].with_changes(
        slice=cst.Index(cst.Name("grid")))]))
    if not isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):  # arguments aligned with the paren
        call = call.visit(_Shift(len(code_of(call.func)) - func_width))
    stmt = replace(stmts[at], {launch.call: call})
    stmts[at:at + 1] = [assign.with_changes(leading_lines=stmt.leading_lines), stmt.with_changes(leading_lines=[])]
    return replace(module, {launch.wrapper: launch.wrapper.with_changes(
        body=launch.wrapper.body.with_changes(body=stmts))})


# ----------------------------------------------------------------------------------- the recipe


def _hypothesis(name: str, items: str, programs: int, setup: list[str]) -> str:
    if setup:
        shown = ", ".join(setup[:4]) + (", ..." if len(setup) > 4 else "")
        hoisted = (f"{len(setup)} setup statement(s) ({shown}) now run once per program instead of once per "
                   f"item")
    else:
        hoisted = "every statement depends on the item, so none moves out of the loop"
    return (f"{name}: min({items}, SMs x {programs}) programs that loop over the {items} instead of one program per "
            f"item: {hoisted}; if that many programs are resident at once the launch has no partial last wave; "
            f"expect 0-10% where items are many and short (items >> SMs x {programs}), ~0 where each item is long, "
            f"a loss if fewer programs are resident than the SM could hold (then step {CONSTANT})")


STEP_HYPOTHESIS = ("{old} -> {new} programs per SM on the persistent grid: {why}; expect a few % either way, the best "
                   "value is the number of programs an SM really holds at this config")


@register
class TritonPersistent(PatternRecipe):
    id = "triton-persistent"
    title = "Persistent scheduling: a fixed grid of SMs x PROGRAMS_PER_SM programs looping over the work items"
    languages = ("triton",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module, al, kernels, launches = read_triton(source)
        steps = self._steps(module)
        helpers = triton_helpers(module, al)
        out, reasons = per_kernel(kernels, lambda name, fn: self._rewrite(
            module, al, fn, only_launch(name, launches),
            {**helpers, **{k: f for k, f in kernels.items() if k != name}}), analysis)
        return proposed(steps + out, reasons, "no @triton.jit kernel")

    def _rewrite(self, module: cst.Module, al: Aliases, fn: cst.FunctionDef, launch: Launch,
                 helpers: dict[str, cst.FunctionDef]) -> Candidate:
        name = fn.name.value
        defined = {f.name.value for f in module_functions(module)} | set(module_int_constants(module))
        if {CONSTANT, HELPER} & defined:
            raise Skip(f"{CONSTANT} or {HELPER} is already defined")
        grid = resolve_grid(launch)
        plan = plan_kernel(fn, al.tl, grid, Translator(launch, fn, al, grid.meta), helpers)
        device = _device_tensor(launch, fn)
        new_fn = _with_params(fn.with_changes(body=fn.body.with_changes(body=plan.body)), list(plan.new_params),
                              launch, al)
        mapping = {
            fn: new_fn,
            grid.tuple_node: cst.parse_expression(_grid_code(grid, device, grid.column)),
            launch.call: lambda upd: _with_kwargs(upd, plan.new_params),
        }
        new = replace(module, mapping)
        warps = _launch_num_warps(launch, module_int_constants(module))
        dot = bool(calls(fn.body, al.tl, "dot"))
        programs = programs_per_sm(warps, dot)
        new = _name_inline_grid(new, name, len(code_of(launch.call.func)))
        new = _add_module_parts(new, launch.wrapper.name.value, programs, warps, dot)
        code = checked(new.code)
        title = f"{name}: persistent, {plan.items} looped over min({plan.items}, SMs x {programs}) programs"
        # a kernel with a whole-row twin runs only for rows past the twin's limit: a second thought
        shadowed = f"{name}{WHOLE_ROW_SUFFIX}" in helpers
        if shadowed:
            title += f" (the chunked kernel, for rows past the limit of {name}{WHOLE_ROW_SUFFIX})"
        return Candidate(self.id, "persistent", f"{self.id}:{name}", title,
                         _hypothesis(name, plan.items, programs, plan.hoisted), code, tier=1 if shadowed else 0)

    def _steps(self, module: cst.Module) -> list[Candidate]:
        """Second thoughts on a persistent kernel: PROGRAMS_PER_SM halved and doubled."""
        value = module_int_constants(module).get(CONSTANT)
        if value is None or HELPER not in {f.name.value for f in module_functions(module)}:
            return []
        out = []
        for new, why in ((value * 2, "more programs to hide memory latency"),
                         (value // 2, "fewer programs, each with more work and more registers")):
            if not 1 <= new <= MAX_PROGRAMS_PER_SM:
                continue
            code = checked(module.visit(SetConstant(CONSTANT, new)).code)
            out.append(Candidate(self.id, "persistent", f"{self.id}:{CONSTANT}={new}", f"{CONSTANT} {value} -> {new}",
                                 STEP_HYPOTHESIS.format(old=value, new=new, why=why), code, tier=1))
        return out

    def current_keys(self, source: str) -> list[str]:
        value = module_int_constants(parse(source)).get(CONSTANT)
        return [f"{self.id}:{CONSTANT}={value}"] if value is not None else []
