"""Names in code: which names an expression reads, which a statement binds, what each local of
a function is assigned, and which nodes of a module read each module-level binding."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from playbook.cst.source import walk


def names_in(node: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


def assigned_names(node: cst.CSTNode) -> set[str]:
    """Names a statement (or block) binds, anywhere inside it: assignment, augmented and annotated
    assignment targets, loop targets, `:=` targets."""
    out: set[str] = set()
    for n in walk(node):
        if isinstance(n, cst.Assign):
            targets = [t.target for t in n.targets]
        elif isinstance(n, (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
            targets = [n.target]
        else:
            continue
        for t in targets:
            if isinstance(t, (cst.Name, cst.Tuple, cst.List)):
                out |= {m.value for m in walk(t) if isinstance(m, cst.Name)}
    return out


def assignments(fn: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """Every expression assigned to each local name (plain, augmented, for-loop targets)."""
    out: dict[str, list[cst.BaseExpression]] = {}
    for node in walk(fn.body):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                for name in target_names(t.target):
                    out.setdefault(name, []).append(node.value)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)) and node.value is not None:
            for name in target_names(node.target):
                out.setdefault(name, []).append(node.value)
        elif isinstance(node, cst.For):
            for name in target_names(node.target):
                out.setdefault(name, []).append(node.iter)
    return out


def target_names(target: cst.BaseExpression) -> list[str]:
    """The names an assignment or a for loop binds (`a`, `a, b = ...`, `[a, (b, c)] = ...`)."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in target_names(e.value)]
    return []


def depends_on(expr: cst.BaseExpression, assigned: dict[str, list[cst.BaseExpression]], roots: set[str]) -> bool:
    """Whether `expr` reads (through local assignments) a name in `roots`."""
    seen: set[str] = set()
    todo = list(names_in(expr))
    while todo:
        name = todo.pop()
        if name in roots:
            return True
        if name in seen:
            continue
        seen.add(name)
        for value in assigned.get(name, []):
            todo.extend(names_in(value))
    return False


def assign_of(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """(name, value) for a statement line `name = value`."""
    if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
            and len(stmt.body[0].targets) == 1 and isinstance(stmt.body[0].targets[0].target, cst.Name)):
        return stmt.body[0].targets[0].target.value, stmt.body[0].value
    return None


def global_references(module: cst.Module) -> dict[str, list[cst.CSTNode]]:
    """For each module-level binding, the Name nodes (of `module` itself) that read it."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scope = wrapper.resolve(ScopeProvider)[module]
    out: dict[str, list[cst.CSTNode]] = {}
    for assignment in scope.assignments:
        out.setdefault(assignment.name, []).extend(access.node for access in assignment.references)
    return out
