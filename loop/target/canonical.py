"""A target's source in a canonical form, so that two versions compare equal when nothing that runs
differs: docstrings and bare strings dropped (comments and layout are gone with the parse), module
constants inlined where they are read (`BLOCK = 128` ... `BLOCK=BLOCK` reads as `BLOCK=128`), a
local name used once as a launch grid inlined into the launch, keywords of launches and configs in
name order, and module-level names nothing reads (imports, constants, config lists, private helpers)
dropped.

`loop.target.change` compares versions in this form, layer by layer. What a launch is, is
`loop.common.kernel_source`'s rule. Everything here is ast only; the trees are copied, never
changed in place.
"""

from __future__ import annotations

import ast
import copy

from loop.common.kernel_source import is_launch

def is_literal(node: ast.AST) -> bool:
    """A constant, a negated number, or a tuple/list of literals."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return isinstance(node.operand, ast.Constant)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(is_literal(e) for e in node.elts)
    return False


def is_config(call: ast.Call) -> bool:
    """`triton.Config(...)` (or a bare `Config(...)`)."""
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "Config") or (isinstance(f, ast.Name) and f.id == "Config")


def _strip_strings(body: list[ast.stmt]) -> list[ast.stmt]:
    kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                    and isinstance(s.value.value, str))]
    return kept or [ast.Pass()]


class _Docstrings(ast.NodeTransformer):
    def generic_visit(self, node):
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and all(isinstance(s, ast.stmt) for s in body):
                setattr(node, name, _strip_strings(body) if name == "body" else
                        [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))])
        return node


def _stores(node: ast.AST) -> set[str]:
    """Names bound in a function's own scope (parameters, assignments, loop and with targets)."""
    out = set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = node.args
        out |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        out |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            out.add(child.id)
    return out


def module_constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level names bound once, to a literal, and never bound again anywhere."""
    counts: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            counts[node.id] = counts.get(node.id, 0) + 1
        elif isinstance(node, ast.Global):
            for n in node.names:
                counts[n] = counts.get(n, 0) + 2
    out = {}
    for stmt in tree.body:
        name = _assigned(stmt)
        if name is not None and counts.get(name) == 1 and is_literal(stmt.value):
            out[name] = stmt.value
    return out


class _Inline(ast.NodeTransformer):
    """Replace reads of module constants by their literal, except where a scope rebinds the name."""

    def __init__(self, constants: dict[str, ast.expr]):
        self.constants, self.shadow = constants, [set()]

    def _scoped(self, node):
        self.shadow.append(self.shadow[-1] | (_stores(node) & set(self.constants)))
        self.generic_visit(node)
        self.shadow.pop()
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scoped
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _scoped

    def visit_Name(self, node: ast.Name):
        if isinstance(node.ctx, ast.Load) and node.id in self.constants and node.id not in self.shadow[-1]:
            return copy.deepcopy(self.constants[node.id])
        return node


def inline_constants(tree: ast.Module) -> ast.Module:
    constants = module_constants(tree)
    if not constants:
        return tree
    tree.body = [s for s in tree.body if _assigned(s) not in constants]
    return _Inline(constants).visit(tree)


def _assigned(stmt: ast.stmt) -> str | None:
    """The one name a module-level assignment binds, or None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def _inline_grids(fn: ast.FunctionDef) -> None:
    """A local bound once and read once, as the grid of a launch, is written into the launch."""
    loads: dict[str, list[ast.Name]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loads.setdefault(node.id, []).append(node)
    stored = {}
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            stored[name] = None if name in stored else stmt
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Call) and is_launch(node) and isinstance(node.func.slice, ast.Name)):
            continue
        name = node.func.slice.id
        stmt = stored.get(name)
        if stmt is not None and len(loads.get(name, [])) == 1 and sum(
                isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(fn)) == 1:
            node.func.slice = stmt.value
            fn.body = [s for s in fn.body if s is not stmt] or [ast.Pass()]


class _SortKeywords(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if (is_launch(node) or is_config(node)) and all(k.arg is not None for k in node.keywords):
            node.keywords = sorted(node.keywords, key=lambda k: k.arg)
        return node


def _reads(tree: ast.Module) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _bound(stmt: ast.stmt) -> list[str] | None:
    """The names a droppable module-level statement binds (None: never drop it)."""
    if isinstance(stmt, ast.Import):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.ImportFrom):
        return None if stmt.module == "__future__" else [a.asname or a.name for a in stmt.names]
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name.startswith("_"):
        return [stmt.name]
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets) and (
            is_literal(stmt.value) or is_config_list(stmt.value)):
        return [t.id for t in stmt.targets]
    return None


def is_config_list(node: ast.AST) -> bool:
    """A list or tuple of `triton.Config(...)`, or a comprehension making them: an autotuner's configs."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return bool(node.elts) and all(isinstance(e, ast.Call) and is_config(e) for e in node.elts)
    return isinstance(node, ast.ListComp) and isinstance(node.elt, ast.Call) and is_config(node.elt)


def drop_dead(tree: ast.Module) -> ast.Module:
    """Module-level imports, literal constants, config lists and private functions that nothing reads, dropped
    until none is left (a dropped helper may leave its imports unread)."""
    while True:
        reads = _reads(tree)
        body = []
        for stmt in tree.body:
            names = _bound(stmt)
            if names is not None and not any(n in reads for n in names):
                continue
            body.append(stmt)
        if len(body) == len(tree.body):
            return tree
        tree.body = body


def canonical(tree: ast.Module) -> ast.Module:
    """A canonical copy of a parsed target (see the module docstring)."""
    tree = _Docstrings().visit(copy.deepcopy(tree))
    tree = inline_constants(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _inline_grids(node)
    tree = _SortKeywords().visit(tree)
    return drop_dead(tree)


def dump(tree: ast.AST) -> str:
    return ast.dump(tree)
