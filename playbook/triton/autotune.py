"""Recipe `triton-autotune`: wrap a @triton.jit kernel in @triton.autotune.

Pattern: a kernel launched once as `kernel[grid](..., BLOCK=BLOCK, num_warps=NUM_WARPS)`, with
the power-of-two block-size constexpr(s), num_warps and num_stages given as literals or
module-level int constants. The rewrite

* adds `@triton.autotune(configs=[...], key=[...])` above `@triton.jit`: block size(s) from
  the current one upwards (powers of two) x num_warps x num_stages (num_stages only when the
  kernel has a loop), at most 24 configs, the current config always among them; a single block
  constexpr in a kernel with a loop and no dot (a row walked in chunks) gets a wider space:
  x1 ... x32 x num_warps up to 16, with the pipelining depth left to the compiler;
* keys the tuning on the kernel's runtime size arguments: the parameters whose launch argument
  is a size in the wrapper (`rows, cols = x.shape`, `x.numel()`, `b.shape[1]`, ...), never
  pointers, strides or floats; and on the untuned constexprs the launch passes a variable
  (`CAUSAL=bool(causal)`), which the autotuner would otherwise not tell apart;
* removes the tuned keywords from the launch and, where the grid reads a tuned constant, makes
  the grid `lambda meta: ...` reading `meta["BLOCK"]`; a grid that does not read it (one row per
  program: `(rows,)`) is left alone;
* deletes the module constants that nothing reads any more.

It skips (no candidate) when a tuned constant is read anywhere but the grid and the launch, the
grid may depend on a literal block size, the kernel is launched more than once, is already
autotuned, or writes memory it also reads (the autotuner would run it repeatedly on live data).
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases, calls
from playbook.cst.constants import drop_constants, int_value, module_int_constants
from playbook.cst.edits import replace
from playbook.cst.kernels import (above_jit, has_loop, is_constexpr, is_triton_decorator, params, triton_aliases,
                                  triton_kernels)
from playbook.cst.launches import Launch, bound_args, only_launch, triton_launches
from playbook.cst.names import global_references, names_in
from playbook.cst.source import Skip, checked, parse, walk
from playbook.hazards import scan
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register
from playbook.tiles import gemm_tiles

MAX_CONFIGS = 24
BLOCK_LIMIT_1D = 16384  # one block constexpr: elements per program
BLOCK_LIMIT_ND = 256  # several block constexprs (2-D tiles of a dot kernel): per dimension
CONFIG_OPTIONS = {"num_warps", "num_stages"}
UNSUPPORTED_LAUNCH_OPTIONS = {"num_ctas", "maxnreg", "occupancy"}  # a Config would silently override them


def _pow2(v: int) -> bool:
    return v >= 16 and v & (v - 1) == 0


# ----------------------------------------------------------------------------------- sizes


def _is_shape(node: cst.BaseExpression) -> bool:
    """`x.shape` or `x.size()`."""
    if isinstance(node, cst.Attribute) and node.attr.value == "shape":
        return True
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size" \
        and not node.args


def is_size(node: cst.BaseExpression, sizes: set[str]) -> bool:
    """An expression that is a tensor size (or arithmetic on sizes): a runtime int."""
    if isinstance(node, cst.Name):
        return node.value in sizes
    if isinstance(node, cst.Subscript):
        return _is_shape(node.value)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.attr.value in ("numel", "size", "dim") or (
            node.func.attr.value == "cdiv" and all(is_size(a.value, sizes) or isinstance(a.value, cst.Integer)
                                                   for a in node.args))
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
        return node.func.value in ("len", "int") and len(node.args) == 1 and (
            node.func.value == "len" or is_size(node.args[0].value, sizes))
    if isinstance(node, cst.BinaryOperation) and isinstance(
            node.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)):
        sides = [node.left, node.right]
        return any(is_size(s, sizes) for s in sides) and all(is_size(s, sizes) or isinstance(s, cst.Integer)
                                                              for s in sides)
    return False


def size_names(wrapper: cst.FunctionDef) -> set[str]:
    """Names in the launch wrapper bound to tensor sizes: `rows, cols = x.shape`, `n = x.numel()`."""
    sizes: set[str] = set()
    assigns = [n for n in walk(wrapper.body) if isinstance(n, cst.Assign)]
    changed = True
    while changed:
        changed = False
        for a in assigns:
            for t in a.targets:
                tgt = t.target
                if isinstance(tgt, (cst.Tuple, cst.List)) and _is_shape(a.value):
                    found = [e.value.value for e in tgt.elements if isinstance(e.value, cst.Name)]
                elif isinstance(tgt, cst.Name) and is_size(a.value, sizes):
                    found = [tgt.value]
                else:
                    found = []
                for name in found:
                    if name not in sizes:
                        sizes.add(name)
                        changed = True
    return sizes


def tuning_key(fn: cst.FunctionDef, launch: Launch, al: Aliases, tuned: set[str],
               constants: dict | None = None) -> list[str]:
    """The autotune key of `fn` launched by `launch`: the parameters whose launch argument is a
    runtime size (never pointers, strides or floats), then the untuned constexpr parameters whose
    launch argument is not a constant (`CAUSAL=bool(causal)`). Triton's autotuner caches its pick
    by the key's values and the tensors' dtypes alone: a constexpr left out of the key would reuse
    the pick made for one value (a non-causal call) for every other (the causal calls), although
    each value compiles a different kernel."""
    ps = params(fn)
    pnames = [p.name.value for p in ps]
    constexpr = {p.name.value for p in ps if is_constexpr(p, al)}
    sizes = size_names(launch.wrapper)
    bound = bound_args(launch, pnames)
    keyed = {p for p, expr in bound if p not in tuned and is_size(expr, sizes)}
    if not keyed:
        raise Skip(f"{fn.name.value}: no runtime size argument to key the tuning on")
    keyed |= {p for p, expr in bound if p in constexpr and p not in tuned
              and int_value(expr, constants or {}) is None and not _literal(expr)}
    return [p for p in pnames if p in keyed]


def _literal(node: cst.BaseExpression) -> bool:
    """A literal the launch passes as it is: True/False/None, a number or a string."""
    return (isinstance(node, cst.Name) and node.value in ("True", "False", "None")) or isinstance(
        node, (cst.Integer, cst.Float, cst.SimpleString))


# ----------------------------------------------------------------------------------- space


def block_space(values: list[int], wide: bool = False, names: list[str] | None = None) -> list[tuple[int, ...]]:
    """Block sizes to try, the current one first: one constexpr -> x1, x2, x4, x8 (halvings if the
    limit is near), or x1 ... x32 when `wide` (a chunk of a row that a loop walks: the chunk sets
    the bytes in flight per program, and a first version's small chunk is often 8-32x too small);
    several -> current, first x2, second x2, both x2 (per-dimension limit 256), and for the
    M, N, K blocks of a GEMM (`names`) the large tiles of GEMM_TILES too."""
    if len(values) == 1:
        v, n = values[0], (6 if wide else 4)
        up = [v << k for k in range(n) if v << k <= BLOCK_LIMIT_1D]
        down = [v >> k for k in range(1, n) if v >> k >= 16]
        return [(b,) for b in sorted((up + down)[:n])]
    out: list[tuple[int, ...]] = [tuple(values)]
    for dims in ((0,), (1,), (0, 1)):
        new = list(values)
        for d in dims:
            new[d] = values[d] * 2 if values[d] * 2 <= BLOCK_LIMIT_ND else values[d] // 2
        if min(new) >= 16 and tuple(new) not in out:
            out.append(tuple(new))
    out += [t for t in gemm_tiles(names or []) if t not in out]
    return out


def option_space(current_warps: int | None, current_stages: int | None, loop: bool, dot: bool,
                 n_blocks: int, wide: bool = False) -> tuple[list[int], list[int]]:
    if wide:
        # a row loop over large chunks wants 8-16 warps to keep a chunk's loads in flight; the
        # pipelining depth is left to the compiler (its default, 3, is the first version's)
        return sorted({current_warps or 4, 4, 8, 16}), ([current_stages] if current_stages else [])
    warps = sorted({current_warps or 4, 4, 8})
    if loop:
        stages = sorted({current_stages or 3} | ({3, 4} if dot else {2, 3}))
    else:
        stages = [current_stages] if current_stages else []  # no loop: nothing to pipeline
    if n_blocks * len(warps) * max(len(stages), 1) > MAX_CONFIGS and stages:
        stages = sorted({current_stages or 3, (current_stages or 3) + 1})
    if n_blocks * len(warps) * max(len(stages), 1) > MAX_CONFIGS:
        warps = sorted({current_warps or 4, 8 if (current_warps or 4) != 8 else 4})
    return warps, stages


def _tuple(items: list) -> str:
    return "(" + ", ".join(map(str, items)) + ("," if len(items) == 1 else "") + ")"


def decorator_code(tt: str, kws: list[str], combos: list[tuple[int, ...]], warps: list[int], stages: list[int],
                   key: list[str]) -> str:
    names = [k.lower() for k in kws]
    meta = ", ".join(f'"{k}": {n}' for k, n in zip(kws, names))
    opts = "num_warps=warps" + (", num_stages=stages" if stages else "")
    if len(kws) == 1:
        loops = [f"for {names[0]} in {_tuple([c[0] for c in combos])}"]
    else:
        loops = [f"for {', '.join(names)} in {_tuple([_tuple(list(c)) for c in combos])}"]
    loops.append(f"for warps in {_tuple(warps)}")
    if stages:
        loops.append(f"for stages in {_tuple(stages)}")
    body = "\n".join(f"        {line}" for line in loops)
    keys = ", ".join(f'"{k}"' for k in key)
    return (f"@{tt}.autotune(\n"
            f"    configs=[\n"
            f"        {tt}.Config({{{meta}}}, {opts})\n"
            f"{body}\n"
            f"    ],\n"
            f"    key=[{keys}],\n"
            f")\n")


# ----------------------------------------------------------------------------------- recipe


HYPOTHESIS = ("autotune {kernel} over {space} ({n} configs, keyed on {key}): the best config per problem size "
              "instead of one hand-picked config; expect 10-50% where the current config is far "
              "from the best, ~0 where it already is; the first call per key pays one benchmark sweep")


@register
class TritonAutotune(PatternRecipe):
    id = "triton-autotune"
    title = "Wrap the kernel in @triton.autotune over block size x num_warps x num_stages"
    languages = ("triton",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        al = triton_aliases(module)
        kernels = triton_kernels(module, al)
        launches = triton_launches(module, kernels)
        out, reasons = per_kernel(kernels, lambda name, fn: self._rewrite(source, module, al, fn,
                                                                          only_launch(name, launches)))
        return proposed(out, reasons, "no @triton.jit kernel")

    def _rewrite(self, source: str, module: cst.Module, al: Aliases, fn: cst.FunctionDef, launch: Launch) -> Candidate:
        name = fn.name.value
        tt = al.triton
        if any(is_triton_decorator(d, al, "autotune", "heuristics") for d in fn.decorators):
            raise Skip(f"{name} is already autotuned")
        if isinstance(fn.params.star_arg, cst.Param) or fn.params.star_kwarg is not None:
            raise Skip(f"{name} takes *args/**kwargs")
        if any(h.code == "aliasing" for h in scan(module.code_for_node(fn), "triton")):
            raise Skip(f"{name} loads and stores the same buffer: autotuning would benchmark it on live data")
        ps = params(fn)
        pnames = [p.name.value for p in ps]
        constexpr = {p.name.value for p in ps if is_constexpr(p, al)}
        constants = module_int_constants(module)

        blocks: list[tuple[str, int, str | None]] = []  # (keyword, value, constant name)
        options: dict[str, tuple[int, str | None]] = {}
        for arg in launch.call.args:
            if arg.keyword is None:
                continue
            kw = arg.keyword.value
            if kw in UNSUPPORTED_LAUNCH_OPTIONS:
                raise Skip(f"the launch sets {kw}, which a triton.Config would override")
            if kw in CONFIG_OPTIONS:
                iv = int_value(arg.value, constants)
                if iv is None:
                    raise Skip(f"{kw} is neither a literal nor a module constant")
                options[kw] = iv
            elif kw in constexpr and kw.isupper():
                iv = int_value(arg.value, constants)
                if iv is not None and _pow2(iv[0]):
                    blocks.append((kw, *iv))
        if not blocks:
            raise Skip(f"{name}: no power-of-two block-size constexpr given as a literal or module constant")
        blocks.sort(key=lambda b: pnames.index(b[0]))
        tuned_kws = {b[0] for b in blocks} | set(options)

        key = tuning_key(fn, launch, al, tuned_kws, constants)

        # the grid: an expression (inline or one assignment) that may read tuned constants
        grid = launch.grid
        grid_assign: cst.Assign | None = None
        if isinstance(grid, cst.Name):
            assigns = [n for n in walk(launch.wrapper.body) if isinstance(n, cst.Assign)
                       and any(isinstance(t.target, cst.Name) and t.target.value == grid.value for t in n.targets)]
            uses = [n for n in walk(launch.wrapper.body) if isinstance(n, cst.Name) and n.value == grid.value]
            if len(assigns) != 1 or len(assigns[0].targets) != 1 or len(uses) != 2:
                raise Skip(f"grid `{grid.value}` is not assigned exactly once and used only by the launch")
            grid_assign = assigns[0]
            grid_expr = grid_assign.value
        else:
            grid_expr = grid
        if "meta" in names_in(grid_expr) and not isinstance(grid_expr, cst.Lambda):
            raise Skip("the grid already reads a name `meta`")
        grid_nodes = set(walk(grid_expr))
        launch_values = {n for a in launch.call.args if a.keyword is not None and a.keyword.value in tuned_kws
                         for n in walk(a.value)}
        to_meta: dict[cst.CSTNode, cst.CSTNode] = {}
        removable: set[str] = set()
        used_for: dict[str, str] = {}
        for kw, _, const in blocks:
            if const:
                if const in used_for:
                    raise Skip(f"{const} feeds both {used_for[const]} and {kw}")
                used_for[const] = kw
        for kw, (value, const) in options.items():
            if const:
                used_for.setdefault(const, kw)
        references = global_references(module)
        for const, kw in used_for.items():
            refs = references.get(const, [])
            outside = [r for r in refs if r not in grid_nodes and r not in launch_values]
            if outside:
                raise Skip(f"{const} is read outside the grid and the launch of {name}")
            in_grid = [r for r in refs if r in grid_nodes]
            if in_grid and kw in CONFIG_OPTIONS:
                raise Skip(f"the grid reads {const} ({kw})")
            if in_grid and isinstance(grid_expr, cst.Lambda):
                raise Skip(f"the grid function reads {const} directly")
            for r in in_grid:
                to_meta[r] = cst.parse_expression(f'meta["{kw}"]')
            removable.add(const)
        for kw, value, const in blocks:
            if const is None and any(isinstance(n, cst.Integer) and int(n.evaluated_value) == value for n in grid_nodes):
                raise Skip(f"the grid may depend on the literal {kw}={value}")

        # the space
        loop = has_loop(fn)
        dot = bool(calls(fn, al.tl, "dot"))
        wide = loop and not dot and len(blocks) == 1
        combos = block_space([b[1] for b in blocks], wide, names=[b[0] for b in blocks] if dot else None)
        warps, stages = option_space(options.get("num_warps", (None,))[0], options.get("num_stages", (None,))[0],
                                     loop, dot, len(combos), wide)
        n_configs = len(combos) * len(warps) * max(len(stages), 1)
        assert n_configs <= MAX_CONFIGS, n_configs
        kws = [b[0] for b in blocks]
        deco_src = decorator_code(tt, kws, combos, warps, stages, key)

        def grid_fn(expr: cst.BaseExpression) -> cst.BaseExpression:
            return cst.parse_expression(f"lambda meta: {module.code_for_node(expr)}")

        mapping: dict = dict(to_meta)
        if to_meta:
            if grid_assign is not None:
                mapping[grid_assign] = lambda upd: upd.with_changes(value=grid_fn(upd.value))
            else:
                mapping[launch.grid] = grid_fn

        def new_call(upd: cst.Call) -> cst.Call:
            args = list(upd.args)
            kept = [a for a in args if not (a.keyword is not None and a.keyword.value in tuned_kws)]
            if kept and kept[-1] is not args[-1]:
                kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
            return upd.with_changes(args=kept)

        mapping[launch.call] = new_call

        mapping[fn] = above_jit(deco_src, al)
        new_module = replace(module, mapping)
        new_module = drop_constants(new_module, removable)
        code = checked(new_module.code)
        space = " x ".join([("/".join(kws) if len(kws) > 1 else kws[0]), "num_warps"] + (["num_stages"] if stages else []))
        return Candidate(self.id, "autotune", f"{self.id}:{name}",
                         f"{name}: @triton.autotune over {space} ({n_configs} configs, key {', '.join(key)})",
                         HYPOTHESIS.format(kernel=name, space=space, n=n_configs, key=", ".join(key)), code)
