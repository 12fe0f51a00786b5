"""Module-level int constants (`BLOCK = 128`): their values, and the rewrites that set one, add
one, or drop those that nothing reads any more."""

from __future__ import annotations

import libcst as cst

from playbook.cst.names import assign_of, global_references


def int_value(node: cst.BaseExpression, constants: dict[str, int]) -> tuple[int, str | None] | None:
    """(value, constant name) of an int literal or a module-level int constant, else None."""
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value), None
    if isinstance(node, cst.Name) and node.value in constants:
        return constants[node.value], node.value
    return None


def module_int_constants(module: cst.Module) -> dict[str, int]:
    out = {}
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if (isinstance(small, cst.Assign) and len(small.targets) == 1
                        and isinstance(small.targets[0].target, cst.Name) and isinstance(small.value, cst.Integer)):
                    out[small.targets[0].target.value] = int(small.value.evaluated_value)
    return out


class SetConstant(cst.CSTTransformer):
    """Sets the module-level int constant `name = <int>` to `value` (a transformer: module.visit)."""

    def __init__(self, name: str, value: int):
        self.name, self.value = name, value

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if (len(updated.targets) == 1 and isinstance(updated.targets[0].target, cst.Name)
                and updated.targets[0].target.value == self.name and isinstance(updated.value, cst.Integer)):
            return updated.with_changes(value=cst.Integer(str(self.value)))
        return updated


def add_module_constant(module: cst.Module, name: str, value: int, comment: str | None = None) -> cst.Module:
    """`NAME = value` after the last UPPERCASE int constant before the first def (or after the imports)."""
    body = list(module.body)
    first_def = next((i for i, s in enumerate(body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))), len(body))
    consts = [i for i, s in enumerate(body[:first_def])
              if assign_of(s) and isinstance(assign_of(s)[1], cst.Integer) and assign_of(s)[0].isupper()]
    imports = [i for i, s in enumerate(body[:first_def]) if isinstance(s, cst.SimpleStatementLine)
               and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)]
    stmt = cst.parse_statement(f"{name} = {value}" + (f"  # {comment}" if comment else "") + "\n")
    if consts:
        at = consts[-1] + 1
    else:
        at = (imports[-1] + 1) if imports else 0
        stmt = stmt.with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(at, stmt)
    return module.with_changes(body=body)


def drop_constants(module: cst.Module, names: set[str]) -> cst.Module:
    """Remove module-level `NAME = <int>` lines for `names` that nothing reads any more."""
    if not names:
        return module
    body = list(module.body)
    references = global_references(module)
    out: list[cst.CSTNode] = []
    carry: list[cst.EmptyLine] = []
    for stmt in body:
        if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
                and len(stmt.body[0].targets) == 1 and isinstance(stmt.body[0].targets[0].target, cst.Name)
                and stmt.body[0].targets[0].target.value in names and stmt.trailing_whitespace.comment is None):
            if not references.get(stmt.body[0].targets[0].target.value):
                carry.extend(stmt.leading_lines)
                continue
        if carry:
            stmt = stmt.with_changes(leading_lines=leading_blank_trim([*carry, *stmt.leading_lines]))
            carry = []
        out.append(stmt)
    return module.with_changes(body=out)


def leading_blank_trim(lines: list[cst.EmptyLine], keep: int = 2) -> list[cst.EmptyLine]:
    """At most `keep` blank lines in a row (comments are kept)."""
    out: list[cst.EmptyLine] = []
    run = 0
    for line in lines:
        blank = line.comment is None
        run = run + 1 if blank else 0
        if not blank or run <= keep:
            out.append(line)
    return out
