"""Launch coverage: whether a change to the target touches code that the correctness checks ran.

The worker records which of the target's kernels launched over the checked shapes, and which of its
host functions were called (`loop.worker.launches`). Here, from the two sources alone: which
top-level functions the change touched, which of them are device code (`@triton.jit`, `@ct.kernel`,
or a helper they call), and which device code the launched kernels reach (the kernels and the
call graph as `loop.common.kernel_source` reads them). A change none of whose
functions ran cannot have been checked: the run does not keep it (`unexercised`). Module-level
statements and class bodies count as exercised: they run on import; except declarations a change
only adds for its functions (an import of the standard library or of a module the file already
imports, a new name bound to a literal: a persistent rewrite's `import functools` and
`PROGRAMS_PER_SM = 16`), which do nothing until those functions run.
"""

from __future__ import annotations

import ast
import sys

from loop.common import kernel_source



def touched(before: str, after: str) -> tuple[set[str], bool]:
    """(top-level functions whose code differs, whether anything outside functions differs)."""
    old, new = ast.parse(before), ast.parse(after)
    f_old, f_new = kernel_source.functions(old), kernel_source.functions(new)
    changed = {name for name in f_old.keys() | f_new.keys()
               if name not in f_old or name not in f_new or ast.dump(f_old[name]) != ast.dump(f_new[name])}
    rest_old = [n for n in old.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    rest_new = [n for n in new.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return changed, not _only_declarations_added(rest_old, rest_new)


def _only_declarations_added(old: list[ast.stmt], new: list[ast.stmt]) -> bool:
    """True when `new` is `old` with nothing but inert declarations added (see the module's doc)."""
    old_dumps, added, i = [ast.dump(n) for n in old], [], 0
    for node in new:
        if i < len(old_dumps) and ast.dump(node) == old_dumps[i]:
            i += 1
        else:
            added.append(node)
    if i < len(old_dumps):
        return False  # a statement removed or changed
    imported = {alias.name.split(".")[0] for n in old if isinstance(n, ast.Import) for alias in n.names} | \
        {(n.module or "").split(".")[0] for n in old if isinstance(n, ast.ImportFrom)}
    bound = {t.id for n in old if isinstance(n, (ast.Assign, ast.AnnAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    return all(_inert(node, imported, bound) for node in added)


def _inert(node: ast.stmt, imported: set[str], bound: set[str]) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        return not getattr(node, "level", 0) and all(
            n.split(".")[0] in imported or n.split(".")[0] in sys.stdlib_module_names for n in names)
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        try:
            ast.literal_eval(node.value)
        except ValueError:
            return False
        return all(isinstance(t, ast.Name) and t.id not in bound for t in targets)
    return False


def unexercised(before: str, after: str, launched: list[str], called: list[str] | None = None) -> list[str]:
    """The functions a change touched when none of them ran in the checks: device code no launched
    kernel reaches, and (when `called` is known) host functions the checks never called; [] when
    any part of the change may have run (or the sources do not parse)."""
    try:
        changed, elsewhere = touched(before, after)
        tree = ast.parse(after)
    except SyntaxError:
        return []
    functions = kernel_source.functions(tree)
    if elsewhere or not changed:
        return []
    imports = kernel_source.imported_names(tree)
    device = {name for name, fn in functions.items() if kernel_source.is_device(fn, imports)}
    host = [name for name in changed if name in functions and name not in device]
    if host and (called is None or any(name in called for name in host)):
        return []  # host code changed that ran, or that may have: the checks saw it
    reached = kernel_source.reached(tree, launched)
    present = [name for name in changed if name in functions]
    if any(name in reached for name in present):
        return []  # part of the change ran: the checks saw it
    return sorted(present)
