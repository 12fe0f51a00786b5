"""What a change to the target is: the kinds of differences between the incumbent's source and the
candidate's (`loop.decide.measurable` says which kinds can show in which timing mode).

Both versions are put in a canonical form (`loop.target.canonical`); equal forms are a formatting
change. Otherwise the forms are peeled in layers, each a rewrite that removes one kind of difference:

    autotune_configs  an autotuned kernel becomes the plain kernel launched with its first config
                      (what the interpreter runs): the config's meta-parameters and launch settings
                      written into each launch, `meta["X"]` in a grid lambda replaced by the value
    persistent        a loop over program ids strided by the number of programs becomes one program's
                      body, and the grid of such a kernel's launches is set aside
    launch            num_warps, num_stages, num_ctas, maxnreg, occupancy dropped from launches and configs
    cache_hint        eviction_policy and cache_modifier dropped from every call

A kind is in the change when the versions differ with every layer but its own applied; `code` when
they differ with all layers applied. A loop over program ids that one version has and the other has
not counts as `persistent` even then. The recipe that made a candidate may add what it changes (a
persistent rewrite); for an agent's edit the sources alone decide.
"""

from __future__ import annotations

import ast
import copy
from collections import Counter
from typing import Callable

from loop.common import kernel_source
from loop.decide.measurable import Change
from loop.target.canonical import canonical, drop_dead, dump, is_config, is_literal

LAUNCH_KW = ("num_warps", "num_stages", "num_ctas", "maxnreg", "occupancy")
CONFIG_POSITIONAL = ("num_warps", "num_stages", "num_ctas", "maxnreg")  # triton.Config(kwargs, num_warps, ...)
CACHE_KW = ("eviction_policy", "cache_modifier")
PID_CALLS = ("program_id", "bid")  # Triton, cuTile
NPROG_CALLS = ("num_programs", "num_blocks")
GRID_ASIDE = "__grid_of_a_persistent_kernel__"
RECIPE_KINDS = {"persistent": "persistent"}  # a recipe's kind -> the change kind it makes, where the diff may not show it


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _kernels(tree: ast.Module) -> list[ast.FunctionDef]:
    """The module-level kernels (`loop.common.kernel_source`; async functions are not launched)."""
    imports = kernel_source.imported_names(tree)
    return [fn for fn in tree.body if isinstance(fn, ast.FunctionDef) and kernel_source.is_kernel(fn, imports)]


# ----------------------------------------------------------------------------- autotune: the first config


def _bind(target: ast.expr, value: ast.expr, out: dict[str, ast.expr]) -> bool:
    if isinstance(target, ast.Name):
        out[target.id] = value
        return True
    if isinstance(target, ast.Tuple) and isinstance(value, (ast.Tuple, ast.List)) and len(target.elts) == len(value.elts):
        return all(_bind(t, v, out) for t, v in zip(target.elts, value.elts))
    return False


class _Substitute(ast.NodeTransformer):
    def __init__(self, values: dict[str, ast.expr]):
        self.values = values

    def visit_Name(self, node: ast.Name):
        return copy.deepcopy(self.values[node.id]) if isinstance(node.ctx, ast.Load) and node.id in self.values else node


def first_config(expr: ast.expr, assigned: dict[str, ast.expr]) -> ast.Call | None:
    """The first `triton.Config(...)` of an autotuner's `configs=` value, where it can be read from
    the source: a list, a module-level name bound to one, or a comprehension over literal tuples."""
    if isinstance(expr, ast.Name) and expr.id in assigned:
        expr = assigned[expr.id]
    if isinstance(expr, (ast.List, ast.Tuple)):
        first = expr.elts[0] if expr.elts else None
        return first if isinstance(first, ast.Call) and is_config(first) else None
    if isinstance(expr, ast.ListComp) and isinstance(expr.elt, ast.Call) and is_config(expr.elt):
        values: dict[str, ast.expr] = {}
        for gen in expr.generators:
            it = gen.iter
            if gen.ifs or gen.is_async or not isinstance(it, (ast.Tuple, ast.List)) or not it.elts \
                    or not is_literal(it.elts[0]) or not _bind(gen.target, it.elts[0], values):
                return None
        return _Substitute(values).visit(copy.deepcopy(expr.elt))
    return None


def config_launch(cfg: ast.Call) -> tuple[dict[str, ast.expr], list[ast.keyword]] | None:
    """(meta-parameters, launch keywords) of a config, or None where it does more (a pre_hook)."""
    meta = cfg.args[0] if cfg.args else next((k.value for k in cfg.keywords if k.arg == "kwargs"), None)
    if not isinstance(meta, ast.Dict) or not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in meta.keys):
        return None
    kws = [ast.keyword(arg=n, value=v) for n, v in zip(CONFIG_POSITIONAL, cfg.args[1:])]
    for k in cfg.keywords:
        if k.arg in LAUNCH_KW:
            kws.append(k)
        elif k.arg != "kwargs":
            return None
    return {k.value: v for k, v in zip(meta.keys, meta.values)}, kws


class _MetaValue(ast.NodeTransformer):
    """`meta["X"]` in a grid lambda, replaced by the config's value of X."""

    def __init__(self, arg: str, meta: dict[str, ast.expr]):
        self.arg, self.meta = arg, meta

    def visit_Subscript(self, node: ast.Subscript):
        self.generic_visit(node)
        s = node.slice
        if isinstance(node.value, ast.Name) and node.value.id == self.arg and isinstance(s, ast.Constant) and s.value in self.meta:
            return copy.deepcopy(self.meta[s.value])
        return node


def autotune_layer(tree: ast.Module, _ctx) -> ast.Module:
    assigned = {s.targets[0].id: s.value for s in tree.body
                if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)}
    plain: dict[str, tuple[dict, list]] = {}
    imports = kernel_source.imported_names(tree)
    for fn in _kernels(tree):
        for dec in list(fn.decorator_list):
            name = kernel_source.decorator_name(dec, imports)
            if isinstance(dec, ast.Call) and kernel_source.is_kernel_decorator(name) and name.endswith(".autotune"):
                configs = next((k.value for k in dec.keywords if k.arg == "configs"), dec.args[0] if dec.args else None)
                cfg = first_config(configs, assigned) if configs is not None else None
                launch = config_launch(cfg) if cfg is not None else None
                if launch is not None:
                    fn.decorator_list.remove(dec)
                    plain[fn.name] = launch
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and kernel_source.launched(call) in plain:
            meta, kws = plain[kernel_source.launched(call)]
            grid = call.func.slice
            if isinstance(grid, ast.Lambda) and len(grid.args.args) == 1:
                call.func.slice = _MetaValue(grid.args.args[0].arg, meta).visit(copy.deepcopy(grid.body))
            call.keywords = sorted(call.keywords + [ast.keyword(arg=k, value=copy.deepcopy(v)) for k, v in meta.items()]
                                   + copy.deepcopy(kws), key=lambda k: k.arg or "")
    return drop_dead(tree)


# ----------------------------------------------------------------------------- persistent grids


def _mentions(expr: ast.expr, calls: tuple[str, ...], names: set[str]) -> bool:
    return any((isinstance(n, ast.Call) and _name(n.func) in calls) or (isinstance(n, ast.Name) and n.id in names)
               for n in ast.walk(expr))


def _derived(fn: ast.FunctionDef, calls: tuple[str, ...]) -> set[str]:
    """Names assigned in `fn` from an expression that calls one of `calls`."""
    return {t.id for s in ast.walk(fn) if isinstance(s, ast.Assign) and _mentions(s.value, calls, set())
            for t in s.targets if isinstance(t, ast.Name)}


def _persistent_loop(node: ast.AST, fn: ast.FunctionDef) -> bool:
    """`for x in range(<a program id>, n, <the number of programs>)` (or tl.range, a NUM_SMS-like step)."""
    if not (isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and _name(node.iter.func) in ("range", "static_range")
            and len(node.iter.args) >= 3):
        return False
    start, step = node.iter.args[0], node.iter.args[2]
    params = {a.arg for a in fn.args.args if any(w in a.arg.upper() for w in ("NUM_SMS", "NUM_PROGRAMS", "PROGRAMS"))}
    return _mentions(start, PID_CALLS, _derived(fn, PID_CALLS)) and _mentions(step, NPROG_CALLS, _derived(fn, NPROG_CALLS) | params)


def persistent_kernels(tree: ast.Module) -> set[str]:
    return {fn.name for fn in _kernels(tree) if any(_persistent_loop(n, fn) for n in ast.walk(fn))}


def persistent_layer(tree: ast.Module, ctx: set[str]) -> ast.Module:
    for fn in _kernels(tree):
        if fn.name in ctx:
            body = []
            for stmt in fn.body:
                if _persistent_loop(stmt, fn):
                    body.append(ast.Assign(targets=[copy.deepcopy(stmt.target)], value=stmt.iter.args[0], lineno=0))
                    body += stmt.body
                else:
                    body.append(stmt)
            fn.body = body
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and kernel_source.launched(call) in ctx:
            call.func.slice = ast.Name(id=GRID_ASIDE, ctx=ast.Load())
    return drop_dead(tree)


# ----------------------------------------------------------------------------- launch settings, cache hints


class _DropKeywords(ast.NodeTransformer):
    def __init__(self, names: tuple[str, ...], where: Callable[[ast.Call], bool]):
        self.names, self.where = names, where

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if self.where(node):
            node.keywords = [k for k in node.keywords if k.arg not in self.names]
            if is_config(node):
                node.args = node.args[:1]
        return node


def launch_layer(tree: ast.Module, _ctx) -> ast.Module:
    return drop_dead(_DropKeywords(LAUNCH_KW, lambda c: kernel_source.is_launch(c) or is_config(c)).visit(tree))


def cache_layer(tree: ast.Module, _ctx) -> ast.Module:
    return drop_dead(_DropKeywords(CACHE_KW, lambda c: True).visit(tree))


LAYERS = {"autotune_configs": autotune_layer, "persistent": persistent_layer, "launch": launch_layer,
          "cache_hint": cache_layer}


def _peel(tree: ast.Module, layers, ctx: set[str]) -> str:
    tree = copy.deepcopy(tree)
    for name in layers:
        tree = LAYERS[name](tree, ctx)
    return dump(tree)


def _keywords(tree: ast.Module) -> Counter:
    out: Counter = Counter()
    for call in ast.walk(tree):
        if isinstance(call, ast.Call):
            for k in call.keywords:
                if (k.arg in LAUNCH_KW and (kernel_source.is_launch(call) or is_config(call))) or k.arg in CACHE_KW:
                    out[(k.arg, dump(k.value))] += 1
    return out


def _details(a: ast.Module, b: ast.Module, ctx: set[str]) -> tuple[str, ...]:
    """The launch keywords and cache hints whose values differ, in a fixed order."""
    ta, tb = (autotune_layer(copy.deepcopy(t), ctx) for t in (a, b))
    differ = {k for k, _ in (_keywords(ta) - _keywords(tb)) + (_keywords(tb) - _keywords(ta))}
    return tuple(k for k in LAUNCH_KW + CACHE_KW if k in differ)


def _kinds(a: ast.Module, b: ast.Module, ctx: set[str]) -> set[str]:
    """`code` when the versions differ with every layer applied; else the layers the difference needs."""
    names = list(LAYERS)
    if _peel(a, names, ctx) != _peel(b, names, ctx):
        return {"code"}
    kinds = {n for n in names if _peel(a, [m for m in names if m != n], ctx) != _peel(b, [m for m in names if m != n], ctx)}
    if kinds:
        return kinds
    # two layers each explain the whole difference (a launch setting of a config beyond the first): the first that does
    return {next((n for n in names if _peel(a, [n], ctx) == _peel(b, [n], ctx)), names[0])}


def describe(before: str, after: str, recipe_kind: str = "") -> Change:
    """The kinds of differences between two versions of a target (see the module docstring)."""
    hint = RECIPE_KINDS.get(recipe_kind, "")
    if before == after:
        return Change(frozenset())
    try:
        a, b = canonical(ast.parse(before)), canonical(ast.parse(after))
    except SyntaxError:
        return Change(frozenset({"code"}), hint=hint)
    if dump(a) == dump(b):
        return Change(frozenset({"formatting"}), hint=hint)
    pa, pb = persistent_kernels(a), persistent_kernels(b)
    ctx = pa | pb
    kinds = _kinds(a, b, ctx)
    if "code" in kinds and pa != pb:
        kinds.add("persistent")  # a loop over program ids added or removed, with other code around it
    if hint:
        kinds.add(hint)
    return Change(frozenset(kinds), _details(a, b, ctx) if kinds & {"launch", "cache_hint"} else (), hint)
