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
from playbook.cst.constants import drop_constants, module_int_constants
from playbook.cst.edits import remove_kwargs, replace
from playbook.cst.kernels import above_jit, has_loop, heuristic_names, is_constexpr, is_triton_decorator, params
from playbook.cst.launch_values import COMPUTED, CONSTANT, LITERAL, LOCAL, UNKNOWN, LaunchValue, launch_values
from playbook.cst.launches import Launch, only_launch, read_triton
from playbook.cst.names import global_references, names_in
from playbook.cst.source import Skip, checked, walk
from playbook.hazards import scan
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register
from playbook.triton.autotune_key import tuning_key
from playbook.triton.autotune_space import (CONFIG_OPTIONS, MAX_CONFIGS, UNSUPPORTED_LAUNCH_OPTIONS, block_space,
                                            decorator_code, option_space, warps_space)

BlockSize = tuple[str, int, str | None]  # (keyword, value, the module constant holding it or None)


def _pow2(v: int) -> bool:
    return v >= 16 and v & (v - 1) == 0


# ----------------------------------------------------------------------------------- the launch


def _launch_config(launch: Launch, constexpr: set[str], constants: dict[str, int]
                   ) -> tuple[list[BlockSize], dict[str, tuple[int, str | None]], dict[str, LaunchValue], list[str]]:
    """The launch's power-of-two block-size constexprs given as literals or module constants; its
    num_warps / num_stages given so, as (value, constant name); those the wrapper computes
    (`num_warps` of `BLOCK_SIZE, num_warps = calculate_settings(n_cols)`: the configs take them
    over); and the block-size constexprs it computes, which stay as they are."""
    blocks: list[BlockSize] = []
    options: dict[str, tuple[int, str | None]] = {}
    computed: dict[str, LaunchValue] = {}
    kept: list[str] = []
    values, _ = launch_values(launch, constants)
    for kw, v in values.items():
        if kw in UNSUPPORTED_LAUNCH_OPTIONS:
            raise Skip(f"the launch sets {kw}, which a triton.Config would override")
        if kw in CONFIG_OPTIONS:
            if v.via is not None:
                raise Skip(f"the launch passes {kw} through **{v.via}, which a triton.Config would override")
            if v.kind in (LITERAL, CONSTANT):
                options[kw] = (v.value, v.name if v.kind == CONSTANT else None)
            elif v.kind == UNKNOWN:
                raise Skip(f"{kw} is neither a literal nor a module constant nor computed by the wrapper "
                           f"({v.origin})")
            else:
                computed[kw] = v
        elif kw in constexpr and kw.isupper():
            if v.via is None and v.kind in (LITERAL, CONSTANT) and _pow2(v.value):
                blocks.append((kw, v.value, v.name if v.kind == CONSTANT else None))
            elif v.kind in (COMPUTED, LOCAL):
                kept.append(kw)
    return blocks, options, computed, kept


def _grid_expression(launch: Launch) -> tuple[cst.Assign | None, cst.BaseExpression]:
    """The launch's grid: an expression inline, or one assignment in the wrapper (returned too)."""
    grid = launch.grid
    if not isinstance(grid, cst.Name):
        grid_assign, grid_expr = None, grid
    else:
        assigns = [n for n in walk(launch.wrapper.body) if isinstance(n, cst.Assign)
                   and any(isinstance(t.target, cst.Name) and t.target.value == grid.value for t in n.targets)]
        uses = [n for n in walk(launch.wrapper.body) if isinstance(n, cst.Name) and n.value == grid.value]
        if len(assigns) != 1 or len(assigns[0].targets) != 1 or len(uses) != 2:
            raise Skip(f"grid `{grid.value}` is not assigned exactly once and used only by the launch")
        grid_assign = assigns[0]
        grid_expr = grid_assign.value
    if "meta" in names_in(grid_expr) and not isinstance(grid_expr, cst.Lambda):
        raise Skip("the grid already reads a name `meta`")
    return grid_assign, grid_expr


def _grid_reads(module: cst.Module, name: str, grid_expr: cst.BaseExpression, launch: Launch, blocks: list[BlockSize],
                options: dict[str, tuple[int, str | None]], tuned_kws: set[str]
                ) -> tuple[dict[cst.CSTNode, cst.CSTNode], set[str]]:
    """The grid's reads of tuned block constants, each to become `meta["BLOCK"]`; and the tuned
    constants, which nothing but the grid and the launch may read (they go once nothing does)."""
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
    references = global_references(module) if used_for else {}
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
    return to_meta, removable


# ----------------------------------------------------------------------------------- recipe


HYPOTHESIS = ("autotune {kernel} over {space} ({n} configs, keyed on {key}): the best config per problem size "
              "instead of one hand-picked config; expect 10-50% where the current config is far "
              "from the best, ~0 where it already is; the first call per key pays one benchmark sweep")
WARPS_HYPOTHESIS = ("autotune {kernel} over {space} ({n} configs, keyed on {key}): the best warps per problem size "
                    "instead of {origin}; {kept} as the wrapper computes {it}; expect 5-30% where that pick is "
                    "off for a width, ~0 where it is right; the first call per key pays one benchmark sweep")


@register
class TritonAutotune(PatternRecipe):
    id = "triton-autotune"
    title = "Wrap the kernel in @triton.autotune over block size x num_warps x num_stages"
    languages = ("triton",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module, al, kernels, launches = read_triton(source)
        out, reasons = per_kernel(kernels, lambda name, fn: self._rewrite(source, module, al, fn,
                                                                          only_launch(name, launches)), analysis)
        return proposed(out, reasons, "no @triton.jit kernel")

    def _rewrite(self, source: str, module: cst.Module, al: Aliases, fn: cst.FunctionDef, launch: Launch) -> Candidate:
        name = fn.name.value
        tt = al.triton
        if any(is_triton_decorator(d, al, "autotune") for d in fn.decorators):
            raise Skip(f"{name} is already autotuned")
        if isinstance(fn.params.star_arg, cst.Param) or fn.params.star_kwarg is not None:
            raise Skip(f"{name} takes *args/**kwargs")
        if any(h.code == "aliasing" for h in scan(module.code_for_node(fn), "triton")):
            raise Skip(f"{name} loads and stores the same buffer: autotuning would benchmark it on live data")
        pnames = [p.name.value for p in params(fn)]
        constexpr = {p.name.value for p in params(fn) if is_constexpr(p, al)}
        constants = module_int_constants(module)
        blocks, options, computed, kept = _launch_config(launch, constexpr, constants)
        kept += sorted(heuristic_names(fn, al) & {n for n in constexpr if n.isupper()})
        if not blocks and not kept:
            raise Skip(f"{name}: no power-of-two block-size constexpr given as a literal or module constant")
        blocks.sort(key=lambda b: pnames.index(b[0]))
        tuned_kws = {b[0] for b in blocks} | set(options) | set(computed)
        key = tuning_key(fn, launch, al, tuned_kws, constants)
        grid_assign, grid_expr = _grid_expression(launch)
        to_meta, removable = _grid_reads(module, name, grid_expr, launch, blocks, options, tuned_kws)
        kws, combos, warps, stages = _space(fn, al, blocks, options)
        n_configs = len(combos) * len(warps) * max(len(stages), 1)
        assert n_configs <= MAX_CONFIGS, n_configs
        deco_src = decorator_code(tt, kws, combos, warps, stages, key)

        def grid_fn(expr: cst.BaseExpression) -> cst.BaseExpression:
            return cst.parse_expression(f"lambda meta: {module.code_for_node(expr)}")

        mapping: dict = dict(to_meta)
        if to_meta:
            if grid_assign is not None:
                mapping[grid_assign] = lambda upd: upd.with_changes(value=grid_fn(upd.value))
            else:
                mapping[launch.grid] = grid_fn
        mapping[launch.call] = lambda upd: remove_kwargs(upd, tuned_kws)
        mapping[fn] = above_jit(deco_src, al)
        new_module = drop_constants(replace(module, mapping), removable)
        code = checked(new_module.code)
        space = " x ".join(([("/".join(kws) if len(kws) > 1 else kws[0])] if kws else []) + ["num_warps"]
                           + (["num_stages"] if stages else []))
        if kws:
            hyp = HYPOTHESIS.format(kernel=name, space=space, n=n_configs, key=", ".join(key))
        else:
            warps_from = computed.get("num_warps")
            origin = (f"the num_warps the wrapper computes ({warps_from.origin})" if warps_from else
                      f"num_warps={options['num_warps'][0]}" if "num_warps" in options else "the default 4 warps")
            hyp = WARPS_HYPOTHESIS.format(kernel=name, space=space, n=n_configs, key=", ".join(key), origin=origin,
                                          kept=f"{' and '.join(kept)} {'stays' if len(kept) == 1 else 'stay'}",
                                          it="it" if len(kept) == 1 else "them")
        return Candidate(self.id, "autotune", f"{self.id}:{name}",
                         f"{name}: @triton.autotune over {space} ({n_configs} configs, key {', '.join(key)})",
                         hyp, code, configs=n_configs)


def _space(fn: cst.FunctionDef, al: Aliases, blocks: list[BlockSize], options: dict[str, tuple[int, str | None]]
           ) -> tuple[list[str], list[tuple[int, ...]], list[int], list[int]]:
    """The tuned block constexprs, their value combinations, num_warps and num_stages."""
    loop = has_loop(fn)
    dot = bool(calls(fn, al.tl, "dot"))
    current_warps, current_stages = options.get("num_warps", (None,))[0], options.get("num_stages", (None,))[0]
    if not blocks:
        warps, stages = warps_space(current_warps, current_stages, loop, dot)
        return [], [()], warps, stages
    wide = loop and not dot and len(blocks) == 1
    combos = block_space([b[1] for b in blocks], wide, names=[b[0] for b in blocks] if dot else None)
    warps, stages = option_space(current_warps, current_stages, loop, dot, len(combos), wide)
    return [b[0] for b in blocks], combos, warps, stages
