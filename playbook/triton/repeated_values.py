"""The repeated-value pass of `triton-whole-row`: in straight-line kernel code, an assignment that
recomputes the value its name already holds is dropped (the later passes' `cols = ...` and
`x = tl.load(...)` once the chunk loops run once each).

A value may be recomputed only if every call in it gives the same value again: tl functions that
neither write nor draw random numbers, tensor methods, builtins like `float("-inf")`, Triton's
device math (`rsqrt` imported from libdevice, `tl.extra.cuda.libdevice.exp`), and @triton.jit
helpers that store nothing (`silu`). Anything else (a helper that may store) stops it.
"""

from __future__ import annotations

import libcst as cst

from playbook.cst.aliases import calls, root_name
from playbook.cst.names import assign_of, assigned_names, names_in
from playbook.cst.source import code_of, walk

# tl calls whose value depends on their arguments and on memory alone (a repeated one may be dropped)
IMPURE_TL = {"store", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or",
             "atomic_xchg", "atomic_xor", "debug_barrier", "device_print", "device_assert", "static_print",
             "rand", "randn", "randint", "randint4x", "inline_asm_elementwise"}

TENSOR_METHODS = {"to", "reshape", "trans", "broadcast_to"}
PURE_BUILTINS = {"float", "int", "min", "max", "abs"}  # float("-inf") as the `other` of a load

def pure_helpers(helpers: dict[str, cst.FunctionDef], tl: str) -> set[str]:
    """The @triton.jit helpers whose calls (and their helpers' calls) neither write nor draw random numbers."""
    impure = {name for name, fn in helpers.items() if calls(fn.body, tl, *IMPURE_TL)}
    changed = True
    while changed:  # a helper that calls an impure helper is impure
        changed = False
        for name, fn in helpers.items():
            if name not in impure and any(isinstance(n, cst.Call) and isinstance(n.func, cst.Name)
                                          and n.func.value in impure for n in walk(fn.body)):
                impure.add(name)
                changed = True
    return set(helpers) - impure


def _pure(value: cst.BaseExpression, tl: str, pure_names: frozenset[str] = frozenset()) -> bool:
    """Whether every call in `value` is a tl function that neither writes nor draws random numbers,
    a method of a tensor (`.to(...)`), a builtin like `float("-inf")`, or one of `pure_names`
    (device math, pure helpers): recomputing it gives the same value."""
    for n in walk(value):
        if not isinstance(n, cst.Call):
            continue
        f = n.func
        root = root_name(f)
        if isinstance(f, cst.Attribute) and root is not None and (root == tl or root in pure_names):
            if f.attr.value in IMPURE_TL:
                return False
        elif isinstance(f, cst.Attribute):
            if f.attr.value not in TENSOR_METHODS:
                return False
        elif not (isinstance(f, cst.Name) and (f.value in PURE_BUILTINS or f.value in pure_names)):
            return False  # a helper function: it may store
    return True


def dedupe(stmts: list[cst.BaseStatement], tl: str,
           pure_names: frozenset[str] = frozenset()) -> tuple[list[cst.BaseStatement], int]:
    """`stmts` without the assignments `name = value` whose value `name` already holds: the same
    expression, nothing it reads assigned since, and (where it reads memory) no store or other
    call statement since. Compound statements end what is known. `pure_names`: functions besides
    tl's that recompute the same value (device math, pure helpers). Returns the statements and how
    many were dropped."""
    held: dict[str, tuple[str, set[str], bool]] = {}  # name -> (value's code, names it reads, reads memory)
    out: list[cst.BaseStatement] = []
    dropped = 0

    def forget(names: set[str]) -> None:
        for k in [k for k, (_, reads, _) in held.items() if k in names or reads & names]:
            del held[k]

    for s in stmts:
        a = assign_of(s)
        if a is not None:
            target, value = a
            code = code_of(value)
            if target in held and held[target][0] == code:
                dropped += 1
                continue
            forget({target})
            reads = names_in(value)
            if target not in reads and _pure(value, tl, pure_names):
                held[target] = (code, reads, bool(calls(value, tl, "load")))
            out.append(s)
            continue
        forget(assigned_names(s))
        if not isinstance(s, cst.SimpleStatementLine):
            held.clear()  # a branch or a block: what it did is not followed
        elif any(isinstance(x, cst.Expr) for x in s.body):
            for k in [k for k, (_, _, memory) in held.items() if memory]:  # a store may have changed memory
                del held[k]
        out.append(s)
    return out, dropped
