"""Recipe `cutile-row-chunks`: a cuTile row kernel that loads the whole row as one tile of
next_power_of_2(cols) columns loops over the row in chunks of CHUNK columns instead, carrying its
statistics across chunks.

Why: a whole-row tile of up to 16384 columns lives in registers. At the widest benchmark row
the whole-row softmax, rmsnorm and layernorm compile to 160-255 registers per thread (sm_90 and
sm_100), so one or two blocks fit on an SM and DRAM sits mostly idle. A chunk of 1024 columns bounds the tile whatever
the width; the statistics become loop-carried (1, 1) or (1, CHUNK) tiles.

Pattern, recognised exactly (anything else is a Skip with the reason, never a guess):

* the kernel is one of the whole-row forms of `row_forms.WHOLE_ROW` (softmax, rmsnorm, layernorm,
  row_sum), up to the names of its parameters and locals, comments and formatting: the same loads
  (tile index `(row, 0)`, shape `(1, TILE_N)`, the same padding), reductions along axis 1 and stores;
* the kernel is launched once, by `ct.launch(stream, grid, kernel, (args...))` or from a launch
  plan `return (grid, kernel, (args...), hints)` (what cutile-autotune writes), and the argument
  for TILE_N is `next_power_of_2(cols)` with `rows, cols = x.shape` in the same function and
  `next_power_of_2` the module function `1 << (n - 1).bit_length()`, so the whole-row tile covers
  exactly the columns of `x` (and `n_cols`, where the kernel has it, is that same `cols`).

The rewrite puts in the chunked form of the same op (`row_forms.CHUNKED`): `ct.num_tiles(x,
axis=1, shape=(1, CHUNK))` chunks, loads and stores at tile index `(row, k)` with the padding the
whole-row version used (stores drop the columns of the last chunk past the row, as the whole-row store
dropped those past `cols`). The wrapper passes CHUNK, a new UPPERCASE module constant (so
cutile-autotune can tune it), for TILE_N; `next_power_of_2` goes when nothing reads it any more.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases
from playbook.cst.edits import replace
from playbook.cst.imports import imports
from playbook.cst.kernels import ct_kernels, module_functions, params
from playbook.cst.launches import cutile_launch_argument, imports_of, is_cutile_launch
from playbook.cst.names import assign_of, global_references
from playbook.cst.source import Skip, checked, parse, walk
from playbook.cst.templates import Rename, match, template, without_docstring
from playbook.cutile.row_forms import CHUNKED, NEW_FREE, NEXT_POW2, TEMPLATE_FREE, WHOLE_ROW
from playbook.recipe import Candidate, PatternRecipe, on_path, register

CHUNK = "CHUNK"
CHUNK_COLS = 1024  # columns per chunk: 8 fp32 values per thread at 128 threads, whatever the row width


# ----------------------------------------------------------------------------------- the launch


@dataclass
class Site:
    fn: cst.FunctionDef  # the wrapper or launch plan that launches the kernel
    args: cst.Tuple  # the kernel arguments


def _launch_site(module: cst.Module, al: Aliases, kernel: str) -> Site:
    sites: list[tuple[cst.FunctionDef, cst.BaseExpression, cst.Name]] = []
    imports = imports_of(al)
    for fn in module_functions(module):
        for node in walk(fn.body):
            if (is_cutile_launch(node, imports) and isinstance(cutile_launch_argument(node, "kernel"), cst.Name)
                    and cutile_launch_argument(node, "kernel").value == kernel):
                sites.append((fn, cutile_launch_argument(node, "args"), cutile_launch_argument(node, "kernel")))
            elif (isinstance(node, cst.Tuple) and len(node.elements) >= 3
                  and isinstance(node.elements[1].value, cst.Name) and node.elements[1].value.value == kernel):
                sites.append((fn, node.elements[2].value, node.elements[1].value))
    refs = global_references(module).get(kernel, [])
    if len(sites) != 1 or len(refs) != 1 or refs[0] is not sites[0][2]:
        raise Skip(f"{kernel} is not launched exactly once by ct.launch(stream, grid, {kernel}, (args...)) "
                   f"or a launch plan (grid, {kernel}, (args...), hints), and used nowhere else")
    fn, args, _ = sites[0]
    if not isinstance(args, cst.Tuple) or any(isinstance(e, cst.StarredElement) for e in args.elements):
        raise Skip(f"the arguments of {kernel} are not a tuple literal")
    return Site(fn, args)


def _module_function(module: cst.Module, name: str) -> cst.FunctionDef | None:
    return next((f for f in module_functions(module) if f.name.value == name), None)


def _assigned(fn: cst.FunctionDef, name: str) -> list[cst.CSTNode]:
    """Statements of `fn` that bind `name` (assignments, loops, with, augmented)."""
    out = []
    for node in walk(fn.body):
        targets = []
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
            targets = [node.target]
        elif isinstance(node, cst.NamedExpr):
            targets = [node.target]
        if any(isinstance(n, cst.Name) and n.value == name for t in targets for n in walk(t)):
            out.append(node)
    return out


def _check_width(module: cst.Module, site: Site, mapping: dict[str, str], kernel_params: list[str], kernel: str) -> str:
    """The name of `next_power_of_2`, after checking that TILE_N is next_power_of_2(cols) with
    `rows, cols = x.shape` (and n_cols is cols); raises Skip otherwise."""
    if len(site.args.elements) != len(kernel_params):
        raise Skip(f"{kernel} is launched with {len(site.args.elements)} arguments for {len(kernel_params)} parameters")
    arg = {p: e.value for p, e in zip(kernel_params, site.args.elements)}
    tile = arg[mapping["TILE_N"]]
    if not (isinstance(tile, cst.Call) and isinstance(tile.func, cst.Name) and len(tile.args) == 1
            and tile.args[0].keyword is None and isinstance(tile.args[0].value, cst.Name)):
        raise Skip(f"the argument for {mapping['TILE_N']} is not next_power_of_2(cols)")
    helper = _module_function(module, tile.func.value)
    if helper is None or match(template(NEXT_POW2), without_docstring(helper)[0].with_changes(decorators=())) is None:
        raise Skip(f"{tile.func.value} is not a module function returning 1 << (n - 1).bit_length()")
    cols = tile.args[0].value.value
    x = arg[mapping["x"]]
    bound = _assigned(site.fn, cols)
    ok = (isinstance(x, cst.Name) and len(bound) == 1 and isinstance(bound[0], cst.Assign)
          and len(bound[0].targets) == 1 and isinstance(bound[0].targets[0].target, cst.Tuple)
          and [isinstance(e.value, cst.Name) for e in bound[0].targets[0].target.elements] == [True, True]
          and bound[0].targets[0].target.elements[1].value.value == cols
          and isinstance(bound[0].value, cst.Attribute) and bound[0].value.attr.value == "shape"
          and isinstance(bound[0].value.value, cst.Name) and bound[0].value.value.value == x.value
          and not _assigned(site.fn, x.value))
    if not ok:
        raise Skip(f"{site.fn.name.value}: the row width {cols} is not bound once by `rows, {cols} = "
                   f"<{mapping['x']}>.shape`: cannot prove the whole-row tile covers exactly the row")
    if "n_cols" in mapping:
        n_cols = arg[mapping["n_cols"]]
        if not (isinstance(n_cols, cst.Name) and n_cols.value == cols):
            raise Skip(f"the argument for {mapping['n_cols']} is not {cols}, the width the tile is sized from")
    return tile.func.value


# ----------------------------------------------------------------------------------- rewrite


def _import_stdlib(module: cst.Module, name: str) -> cst.Module:
    """`import <name>` among the standard-library imports at the top (a group of its own before the
    first third-party import when there is none)."""
    body = list(module.body)
    imports = [i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
               and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)]
    if not imports:
        raise Skip(f"no import block to add `import {name}` to")

    def top(stmt) -> str | None:
        small = stmt.body[0]
        node = small.names[0].name if isinstance(small, cst.Import) else small.module
        while isinstance(node, cst.Attribute):
            node = node.value
        return node.value if isinstance(node, cst.Name) else None

    std = [i for i in imports if top(body[i]) in sys.stdlib_module_names and top(body[i]) != "__future__"]
    later = [i for i in std if (top(body[i]) or "") > name]
    new = cst.parse_statement(f"import {name}\n")
    if later:  # alphabetical among the stdlib imports
        at = later[0]
        new = new.with_changes(leading_lines=body[at].leading_lines)
        body[at] = body[at].with_changes(leading_lines=[])
    elif std:
        at = std[-1] + 1
    else:  # before the first third-party import, as a group of its own
        at = next(i for i in imports if top(body[i]) != "__future__")
        new = new.with_changes(leading_lines=body[at].leading_lines)
        body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(at, new)
    return module.with_changes(body=body)


def _add_constant(module: cst.Module, name: str, value: int, comment: str) -> cst.Module:
    """`NAME = value  # comment` after the last UPPERCASE module constant before the first def (or
    after the imports, with a blank line before it)."""
    body = list(module.body)
    first_def = next((i for i, s in enumerate(body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))), len(body))
    consts = [i for i, s in enumerate(body[:first_def]) if assign_of(s) and assign_of(s)[0].isupper()]
    imports = [i for i, s in enumerate(body[:first_def]) if isinstance(s, cst.SimpleStatementLine)
               and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)]
    stmt = cst.parse_statement(f"{name} = {value}  # {comment}\n")
    if consts:
        at = consts[-1] + 1
    else:
        at = imports[-1] + 1 if imports else 0
        stmt = stmt.with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(at, stmt)
    return module.with_changes(body=body)


def _module_names(module: cst.Module) -> set[str]:
    return set(global_references(module))


def rewrite(source: str, chunk: int = CHUNK_COLS) -> tuple[str, str, str]:
    """(new source, op, kernel name) of the chunked rewrite; raises Skip with the reason."""
    module = parse(source)
    al, kernels = ct_kernels(module)
    if len(kernels) != 1:
        raise Skip(f"{len(kernels)} @ct.kernel functions: the recipe rewrites a module with one")
    (name, kernel), = kernels.items()
    if CHUNK in _module_names(module):
        raise Skip(f"{CHUNK} is already a module-level name (already chunked?)")
    bare, doc = without_docstring(kernel)
    op, mapping = next(((op, m) for op, code in WHOLE_ROW.items()
                        if (m := match(template(code), bare)) is not None), (None, None))
    if op is None:
        looped = any(isinstance(n, (cst.For, cst.While)) for n in walk(bare.body))
        raise Skip(f"{name} is not one of the whole-row forms this recipe can prove equivalent "
                   f"({', '.join(WHOLE_ROW)}: one (1, TILE_N) tile at (row, 0), reduced along axis 1)"
                   + ("; it already loops over the row" if looped else ""))
    for free in TEMPLATE_FREE:
        if free in mapping and mapping[free] != (al.ct if free == "ct" else free):
            raise Skip(f"{name}: {mapping[free]} stands where the form has {free}")
    chunked = template(CHUNKED[op])
    new_names = {n.value for n in walk(chunked) if isinstance(n, cst.Name)} - set(mapping) - {CHUNK}
    own = set(mapping.values())
    clash = sorted((new_names & own) | ({CHUNK} & own))
    if clash:
        raise Skip(f"{name}: the chunked form needs the names {', '.join(clash)}, which the kernel uses")
    module_names = _module_names(module)
    shadowed = sorted(n for n in NEW_FREE if n in new_names and n in module_names
                      and not (n == "math" and imports(module, "math")))
    if shadowed:
        raise Skip(f"module-level {', '.join(shadowed)} would shadow what the chunked form reads")

    kernel_params = [p.name.value for p in params(kernel)]
    site = _launch_site(module, al, name)
    helper = _check_width(module, site, mapping, kernel_params, name)

    renamed = chunked.visit(Rename({t: k for t, k in mapping.items() if t != "TILE_N"}))
    body = renamed.body.with_changes(body=[*doc, *renamed.body.body])
    new_kernel = kernel.with_changes(params=renamed.params, body=body)
    tile_arg = site.args.elements[kernel_params.index(mapping["TILE_N"])]
    new_args = site.args.with_changes(elements=[
        e.with_changes(value=cst.Name(CHUNK)) if e is tile_arg else e for e in site.args.elements])
    module = replace(module, {kernel: new_kernel, site.args: new_args})
    if not global_references(module).get(helper):  # nothing reads next_power_of_2 any more
        body = list(module.body)
        at = next(i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == helper)
        gone = body.pop(at)
        if at < len(body):
            body[at] = body[at].with_changes(leading_lines=gone.leading_lines)
        module = module.with_changes(body=body)
    module = _add_constant(module, CHUNK, chunk, "columns per chunk of the row loop")
    if "math" in new_names and not imports(module, "math"):
        module = _import_stdlib(module, "math")
    return checked(module.code), op, name


@register
class CuTileRowChunks(PatternRecipe):
    id = "cutile-row-chunks"
    title = "Loop over the row in chunks of CHUNK columns instead of one whole-row tile"
    languages = ("cutile",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        on_path(ct_kernels(parse(source))[1], analysis)
        code, op, kernel = rewrite(source, CHUNK_COLS)
        passes = "one pass" if op == "row_sum" else "two passes (statistics, then the output)"
        return [Candidate(
            self.id, "row-chunks", f"{self.id}:{kernel}:{CHUNK_COLS}",
            f"{kernel}: loop over the row in chunks of {CHUNK} = {CHUNK_COLS} columns (was one tile of "
            f"next_power_of_2(cols) columns)",
            f"a whole-row tile of up to next_power_of_2(cols) columns holds the row in registers (160-255 per "
            f"thread at 16384 columns), capping residency at 1-2 blocks per SM; {CHUNK_COLS}-column chunks in "
            f"{passes} bound the registers whatever the width, so more blocks are resident and more loads are "
            f"in flight: faster on wide rows (>= 4096 columns), about even or slightly slower on rows of "
            f"{CHUNK_COLS} or fewer columns (one chunk, plus the loop)",
            code)]
