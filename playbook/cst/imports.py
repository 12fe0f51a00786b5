"""The module's top-level imports of other modules (torch, functools, os, ...): whether and
under which name a module is imported."""

from __future__ import annotations

import libcst as cst


def import_alias(module: cst.Module, name: str) -> str | None:
    """The local name of a top-level `import name [as alias]`."""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        if isinstance(alias.name, cst.Name) and alias.name.value == name:
                            return alias.asname.name.value if alias.asname is not None else name
    return None


def imports(module: cst.Module, name: str) -> bool:
    """`import <name>` at module level, under its own name."""
    return any(isinstance(small, cst.Import) and any(isinstance(a.name, cst.Name) and a.name.value == name
                                                     and a.asname is None for a in small.names)
               for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine) for small in stmt.body)
