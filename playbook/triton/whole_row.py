"""Recipe `triton-whole-row`: a Triton row kernel that walks its row in chunks of BLOCK columns,
pass after pass (max, then sum, then normalise), gets a twin that holds the whole row in one block,
with no chunk loop; the chunked kernel stays for rows wider than the twin's limit.

Why: a chunked row kernel reads each row once per pass and recomputes what the passes share
(softmax computes exp(x - max) twice). At the widest benchmark row (16384 fp16 columns) the tuned
chunked softmax and layernorm kept SM issue 71-75% busy with DRAM at 46-48% on an H200, and
reached 0.75-0.77 of clone bandwidth: they are bound by instructions, not bytes. With the whole
row in registers the passes become one straight-line block: where the passes load the row the
same way, one load of the row, its values reused by every statistic, one store.

Pattern, recognised exactly (anything else is a Skip with the reason):

* the kernel's loops are all statements of its body (not nested) of the form
  `for v in range(0, N, B):` (or `tl.range(0, N, B)`) with the same N, a runtime parameter (the
  row width), and the same B,
  a `tl.constexpr` parameter (the chunk); no `else`, `break` or `continue`; v, N and B are never
  assigned;
* every `tl.store` in those loops has a mask, so a row of width 0 stores nothing either way;
* the kernel is launched once, as a statement of its own; the grid does not read B (one row per
  program, `(rows,)`, not a lambda of the meta-parameters); the launch argument for N is a tensor
  size in the wrapper (`rows, cols = x.shape`).

The rewrite:

* adds the twin `<kernel>_row` after the kernel, under its `@triton.jit` and `@triton.heuristics`
  (an autotune on the kernel tunes the chunk, which the twin does not have). Each loop becomes
  `v = 0` followed by its body: when B >= N the loop runs exactly once with v = 0. Then an
  assignment that recomputes the value its name already holds (the second pass's `cols = ...` and
  `x = tl.load(...)`, when nothing they read was assigned since and no store came between) is
  dropped (playbook/triton/repeated_values.py). Where every pass loads the row the same way, the
  twin loads it once (softmax); a load written differently stays (rmsnorm and layernorm load
  under `mask=mask` in their last pass), and the candidate's comments and hypothesis count the
  load sites of the twin as it is: "the row is read once" only where that is so;
* launches the twin from the wrapper with B = `triton.next_power_of_2(N)` when that is at most
  `MAX_ROW_BLOCK` (a new module constant, 16384: 16 fp32 values per thread at 32 warps); wider
  rows launch the kernel as it was. The twin is a new kernel with no launch configuration of its
  own to keep, so it gets one: `@triton.autotune` over num_warps 4/8/16/32 keyed on N (the warps
  that hold a row best depend on its width: register pressure against threads per row). A kernel
  that writes a buffer it reads cannot be tuned on live arguments; its twin gets num_warps =
  row block / 512 between 4 and 16 instead (the rule of thumb of published row kernels).
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases, calls, device_math, is_attr
from playbook.cst.constants import add_module_constant, module_int_constants
from playbook.cst.edits import add_kwarg, kwarg_value, remove_kwargs, replace, shift_aligned
from playbook.cst.kernels import is_constexpr, is_triton_decorator, is_triton_jit, module_functions, params, triton_helpers
from playbook.cst.launches import Launch, bound_args, only_launch, read_triton
from playbook.cst.memory import accesses, loaded_at
from playbook.cst.names import assigned_names, names_in
from playbook.cst.source import Skip, checked, code_of, walk
from playbook.hazards import scan
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register
from playbook.triton.autotune_key import is_size, shape_names, size_names
from playbook.triton.repeated_values import dedupe, pure_helpers

SUFFIX = "_row"
LIMIT = "MAX_ROW_BLOCK"
LIMIT_VALUE = 16384  # columns: 16 fp32 values per thread at 32 warps
WARPS = (4, 8, 16, 32)  # the twin's autotune space
COLUMNS_PER_WARP = 512  # in-place kernels (not autotuned): 16 columns per thread
MIN_WARPS, MAX_WARPS = 4, 16
HYPOTHESIS = ("{kernel} reads each row in {passes} pass(es) of BLOCK-column chunks; its twin holds the whole row in "
              "one block (up to {limit} columns, {warps}) with no chunk loop: {reads}{dropped}, so an "
              "instruction-bound row kernel should move toward clone bandwidth; rows wider than {limit} keep the "
              "chunked kernel")


def _reads_text(reloads: dict[str, int]) -> str:
    if not reloads:
        return "each row is loaded once"
    return ", ".join(f"{b} is still loaded at {n} sites (loads written differently are kept; the compiler may or "
                     f"may not merge them)" for b, n in reloads.items())


def _statements(block: cst.BaseSuite) -> list[cst.BaseStatement]:
    if isinstance(block, cst.IndentedBlock):
        return list(block.body)
    return [cst.SimpleStatementLine(body=list(block.body))]  # `for ...: a; b` on one line


def _row_loops(fn: cst.FunctionDef, al: Aliases) -> tuple[list[cst.For], str, str]:
    """The kernel's loops over its row, and the names of the row width N and the chunk B."""
    name = fn.name.value
    ps = params(fn)
    pnames = {p.name.value for p in ps}
    constexpr = {p.name.value for p in ps if is_constexpr(p, al)}
    loops = [s for s in fn.body.body if isinstance(s, cst.For)]
    if not loops:
        raise Skip(f"{name} has no loop over its row")
    if len(loops) == 1:
        raise Skip(f"{name} walks its row in one pass: it reads each value once already (the autotune space "
                   f"sizes its chunk)")
    if sum(isinstance(n, (cst.For, cst.While)) for n in walk(fn.body)) != len(loops):
        raise Skip(f"{name} has a loop inside another statement (not a walk over one row)")
    pair: tuple[str, str] | None = None
    for loop in loops:
        it = loop.iter
        args = it.args if isinstance(it, cst.Call) else ()
        if not (isinstance(it, cst.Call) and (isinstance(it.func, cst.Name) and it.func.value == "range"
                                              or is_attr(it.func, al.tl, "range"))
                and len(args) == 3 and all(a.keyword is None and not a.star for a in args)
                and isinstance(args[0].value, cst.Integer) and args[0].value.evaluated_value == 0
                and isinstance(args[1].value, cst.Name) and args[1].value.value in pnames - constexpr
                and isinstance(args[2].value, cst.Name) and args[2].value.value in constexpr
                and isinstance(loop.target, cst.Name)):
            loop_code = " ".join(code_of(it).split())
            raise Skip(f"{name}: a loop that is not `for v in range(0, n, BLOCK)` (or tl.range) over a runtime "
                       f"width n and a constexpr BLOCK: `for {code_of(loop.target)} in {loop_code}`")
        here = (args[1].value.value, args[2].value.value)
        if pair is not None and here != pair:
            raise Skip(f"{name}: its loops walk different extents ({', '.join(pair)} and {', '.join(here)})")
        pair = here
        if loop.orelse is not None or any(isinstance(n, (cst.Break, cst.Continue)) for n in walk(loop.body)):
            raise Skip(f"{name}: a row loop with else, break or continue")
        if loop.target.value in assigned_names(loop.body):
            raise Skip(f"{name}: the loop variable {loop.target.value} is assigned in the loop")
        for store in calls(loop.body, al.tl, "store"):
            if kwarg_value(store, "mask") is None and len(store.args) < 3:
                raise Skip(f"{name}: an unmasked tl.store in a row loop (a row of width 0 would store)")
    assert pair is not None
    if set(pair) & assigned_names(fn.body):
        raise Skip(f"{name} assigns {' or '.join(pair)} in its body")
    return loops, pair[0], pair[1]


def _twin(fn: cst.FunctionDef, al: Aliases, loops: list[cst.For], block: str,
          pure_names: frozenset[str]) -> tuple[cst.FunctionDef, int]:
    """The kernel with each row loop run once in place (v = 0) and repeated values dropped; it
    keeps the kernel's @triton.heuristics (they fill in constexprs), not its @triton.autotune."""
    body: list[cst.BaseStatement] = []
    first = True
    for s in fn.body.body:
        if s not in loops:
            body.append(s)
            continue
        lines = list(s.leading_lines)
        if first:
            lines.append(cst.EmptyLine(comment=cst.Comment(
                f"# {block} covers the whole row: each chunk loop of the kernel runs once, at column 0")))
            first = False
        body.append(cst.parse_statement(f"{s.target.value} = 0\n").with_changes(leading_lines=lines))
        inner = _statements(s.body)
        body.extend([inner[0].with_changes(leading_lines=[]), *inner[1:]])
    body, dropped = dedupe(body, al.tl, pure_names)
    decorators = [d for d in fn.decorators if is_triton_jit(d, al) or is_triton_decorator(d, al, "heuristics")]
    twin = fn.with_changes(name=cst.Name(f"{fn.name.value}{SUFFIX}"), decorators=decorators,
                           body=fn.body.with_changes(body=body))
    twin = twin.with_changes(params=shift_aligned(twin.params, fn.whitespace_before_params, len(SUFFIX)))
    return twin, dropped


def row_reloads(fn: cst.FunctionDef, twin: cst.FunctionDef, loops: list[cst.For], al: Aliases) -> dict[str, int]:
    """The buffers the chunk loops load that the twin still loads at more than one site, and at how
    many: the repeated-value pass drops a later pass's load only where it is written the same way."""
    in_loops = {id(n) for loop in loops for n in walk(loop)}
    row = {a.base for a in accesses(fn, al) if a.kind == "load" and a.base is not None and id(a.call) in in_loops}
    return {base: n for base, n in loaded_at(twin, al).items() if base in row and n > 1}


def _note(name: str, block: str, reloads: dict[str, int]) -> cst.EmptyLine:
    """The comment above the twin: what it reads, as its code does it."""
    if not reloads:
        what = "the row is read once"
    else:
        what = "no chunk loop; " + ", ".join(f"{b} is still loaded at {n} sites" for b, n in reloads.items())
    return cst.EmptyLine(comment=cst.Comment(f"# {name} with the whole row in one block ({block} >= the row width): "
                                             f"{what}"))


def _launch_statement(launch: Launch, fn: cst.FunctionDef, width: str, block: str
                      ) -> tuple[cst.BaseExpression, cst.SimpleStatementLine]:
    """The launch's argument for the row width N (a tensor size in the wrapper), and the launch
    statement; Skip where the launch passes B by position or its grid depends on B."""
    name = fn.name.value
    pnames = [p.name.value for p in params(fn)]
    bound = dict(bound_args(launch, pnames))
    if width not in bound:
        raise Skip(f"the launch of {name} does not show the argument for {width}")
    if block in bound and kwarg_value(launch.call, block) is None:
        raise Skip(f"the launch of {name} passes {block} by position")
    sizes = size_names(launch.wrapper)
    if not is_size(bound[width], sizes, shape_names(launch.wrapper)):
        raise Skip(f"the argument for {width} (`{code_of(bound[width])}`) is not a tensor size in "
                   f"{launch.wrapper.name.value}")
    grid = [launch.grid]
    if isinstance(launch.grid, cst.Name):
        grid += [n.value for n in walk(launch.wrapper.body) if isinstance(n, cst.Assign)
                 and any(isinstance(t.target, cst.Name) and t.target.value == launch.grid.value
                         for t in n.targets)]
    if any(isinstance(n, cst.Lambda) for g in grid for n in walk(g)):
        raise Skip(f"the grid of {name} is a function of the meta-parameters (it depends on {block})")
    chunk = kwarg_value(launch.call, block)
    if chunk is not None and names_in(chunk) & set().union(*(names_in(g) for g in grid)):
        raise Skip(f"the grid of {name} reads the chunk {block}")
    stmt = next((s for s in walk(launch.wrapper.body) if isinstance(s, cst.SimpleStatementLine)
                 and len(s.body) == 1 and isinstance(s.body[0], cst.Expr) and s.body[0].value is launch.call),
                None)
    if stmt is None:
        raise Skip(f"the launch of {name} is not a statement of its own")
    return bound[width], stmt


def _dispatch(launch: Launch, stmt: cst.SimpleStatementLine, twin: str, block: str, width: str, tri: str,
              in_place: bool, once: bool) -> cst.FlattenSentinel:
    """What replaces the launch statement: `row_block = triton.next_power_of_2(N)`, then the twin's
    launch with B = row_block for rows up to LIMIT, the launch as it was for wider rows."""
    taken = names_in(launch.wrapper)
    local, warps = "row_block", "row_warps"
    while local in taken or warps in taken:
        local, warps = local + "_", warps + "_"
    call = launch.call.with_changes(func=launch.call.func.with_changes(value=cst.Name(twin)))
    call = remove_kwargs(call, {block, "num_warps", "num_stages"})
    call = add_kwarg(call, block, cst.Name(local))
    launch_body: list[cst.BaseStatement] = []
    if in_place:
        call = add_kwarg(call, "num_warps", cst.Name(warps))
        launch_body.append(cst.parse_statement(
            f"{warps} = min({MAX_WARPS}, max({MIN_WARPS}, {local} // {COLUMNS_PER_WARP}))  "
            f"# {COLUMNS_PER_WARP // 32} columns per thread (not tuned: the kernel writes what it reads)\n"))
    launch_body.append(shift_aligned(cst.SimpleStatementLine(body=[cst.Expr(call)]), call.whitespace_before_args,
                                     len(SUFFIX)))
    shell = cst.parse_module(
        "def _f():\n"
        f"    {local} = {tri}.next_power_of_2({width})\n"
        f"    if {local} <= {LIMIT}:  # the whole row in one block{', read once' if once else ''}\n"
        "        pass\n"
        f"    else:  # wider rows: the chunked kernel\n"
        "        pass\n").body[0].body.body
    assign_stmt, branch = shell
    dispatch = branch.with_changes(
        body=branch.body.with_changes(body=launch_body),
        orelse=branch.orelse.with_changes(body=branch.orelse.body.with_changes(
            body=[stmt.with_changes(leading_lines=[])])))
    return cst.FlattenSentinel([assign_stmt.with_changes(leading_lines=stmt.leading_lines), dispatch])


@register
class TritonWholeRow(PatternRecipe):
    id = "triton-whole-row"
    title = "Whole row in one block: the chunk loops over a row become one pass (chunked kernel kept for wider rows)"
    languages = ("triton",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language in self.languages and analysis.kernel_class != "dot"

    def inapplicable(self, analysis: Analysis) -> str | None:
        if analysis.kernel_class == "dot":
            return ("a dot kernel's loop walks a reduction dimension for tiles of its output, not a row to hold in "
                    "registers")
        return None

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module, al, kernels, launches = read_triton(source)
        defined = {f.name.value for f in module_functions(module)}

        def attempt(name: str, fn: cst.FunctionDef) -> Candidate:
            if name.endswith(SUFFIX) and name[: -len(SUFFIX)] in kernels:
                raise Skip(f"{name} is the whole-row twin of {name[: -len(SUFFIX)]}")
            if f"{name}{SUFFIX}" in defined:
                raise Skip(f"{name} already has a whole-row twin")
            return self._rewrite(source, module, al, fn, only_launch(name, launches))

        return proposed(*per_kernel(kernels, attempt, analysis), "no @triton.jit kernel")

    def _rewrite(self, source: str, module: cst.Module, al: Aliases, fn: cst.FunctionDef,
                 launch: Launch) -> Candidate:
        name = fn.name.value
        loops, width, block = _row_loops(fn, al)
        width_arg, stmt = _launch_statement(launch, fn, width, block)
        constants = module_int_constants(module)
        if LIMIT in {n.value for n in walk(module) if isinstance(n, cst.Name)} and LIMIT not in constants:
            raise Skip(f"the module uses the name {LIMIT} for something other than an int constant")

        pure = frozenset(device_math(module) | pure_helpers(triton_helpers(module, al), al.tl))
        twin, dropped = _twin(fn, al, loops, block, pure)
        reloads = row_reloads(fn, twin, loops, al)
        twin = twin.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), _note(name, block, reloads)])
        tri = al.triton
        # the twin's warps: tuned per row width where the autotuner may run the kernel on the live
        # arguments; a kernel that writes what it reads gets the rule of thumb instead
        in_place = any(h.code == "aliasing" for h in scan(module.code_for_node(fn), "triton"))
        if not in_place:
            tune = cst.Decorator(decorator=cst.parse_expression(
                f"{tri}.autotune(configs=[{tri}.Config({{}}, num_warps=w) for w in {WARPS}], key=[{width!r}])"
                .replace("'", '"')))
            twin = twin.with_changes(decorators=[tune, *twin.decorators])
        dispatch = _dispatch(launch, stmt, twin.name.value, block, code_of(width_arg), tri, in_place, not reloads)
        new = replace(module, {stmt: dispatch})
        body = list(new.body)
        at = next(i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == name)
        body.insert(at + 1, twin)
        new = new.with_changes(body=body)
        if LIMIT not in constants:
            new = add_module_constant(new, LIMIT, LIMIT_VALUE, "widest row the whole-row kernel holds in one block")
        limit = constants.get(LIMIT, LIMIT_VALUE)
        passes = len(loops)
        title = (f"{name}: the whole row in one block ({passes} chunk pass(es) become one; rows up to {limit} "
                 f"columns, the chunked kernel above)")
        if dropped:
            title += f"; {dropped} repeated value(s) computed once"
        warps = (f"num_warps = row block / {COLUMNS_PER_WARP}, {MIN_WARPS} to {MAX_WARPS}" if in_place
                 else "num_warps tuned per row width")
        hyp = HYPOTHESIS.format(kernel=name, passes=passes, limit=limit, warps=warps, reads=_reads_text(reloads),
                                dropped=f"; {dropped} repeated value(s) computed once" if dropped else "")
        return Candidate(self.id, "whole-row", f"{self.id}:{name}", title, hyp, checked(new.code))
