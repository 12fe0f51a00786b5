"""The memory a Triton kernel reads and writes: each `tl.load` / `tl.store`, and each load and
store of a tensor descriptor, with the kernel parameter it addresses.

The parameter is followed through local assignments (`x_row = x_ptr + row * stride`), pointer
arithmetic in place (`x_ptr += row * stride` keeps addressing x_ptr), block pointers
(`tl.make_block_ptr(base=x_ptr, ...)`, `tl.advance(p, ...)`) and tensor descriptors built on the
device (`tl.make_tensor_descriptor(x_ptr, ...)`) or passed in (`x_desc.load([...])`, x_desc a
parameter). The parameters a kernel stores to are its outputs (Y and RSTD of a norm: several).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from playbook.cst.aliases import Aliases, is_call
from playbook.cst.edits import kwarg_value
from playbook.cst.kernels import params
from playbook.cst.source import walk

POINTER_MAKERS = ("make_block_ptr", "advance", "make_tensor_descriptor")


def bindings(fn: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """The values each local name is bound to by `=` (not `+=`: that moves a pointer, it does not
    change what it points into)."""
    out: dict[str, list[cst.BaseExpression]] = {}
    for node in walk(fn.body):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                if isinstance(t.target, cst.Name):
                    out.setdefault(t.target.value, []).append(node.value)
        elif isinstance(node, cst.AnnAssign) and node.value is not None and isinstance(node.target, cst.Name):
            out.setdefault(node.target.value, []).append(node.value)
    return out


def pointer_base(expr: cst.BaseExpression, bound: dict[str, list[cst.BaseExpression]], pointers: set[str],
                 tl: str | None, seen: frozenset[str] = frozenset()) -> str | None:
    """The parameter in `pointers` that an address (or block pointer, or descriptor) is computed from."""
    if isinstance(expr, cst.Name):
        if expr.value in pointers:
            return expr.value
        if expr.value in seen:
            return None
        found = {pointer_base(v, bound, pointers, tl, seen | {expr.value}) for v in bound.get(expr.value, [])}
        found.discard(None)
        return found.pop() if len(found) == 1 else None
    if isinstance(expr, cst.BinaryOperation):
        left = pointer_base(expr.left, bound, pointers, tl, seen)
        return left if left is not None else pointer_base(expr.right, bound, pointers, tl, seen)
    if isinstance(expr, cst.Subscript):
        return pointer_base(expr.value, bound, pointers, tl, seen)
    if is_call(expr, tl, *POINTER_MAKERS):
        base = kwarg_value(expr, "base")
        if base is None and expr.args and expr.args[0].keyword is None:
            base = expr.args[0].value
        return pointer_base(base, bound, pointers, tl, seen) if base is not None else None
    return None


@dataclass(frozen=True)
class Access:
    call: cst.Call
    kind: str  # "load" | "store"
    base: str | None  # the parameter it addresses; None when the reading cannot tell
    descriptor: bool  # through a tensor descriptor (`desc.load([...])`)


def _address(call: cst.Call) -> cst.BaseExpression | None:
    if call.args and call.args[0].keyword is None and not call.args[0].star:
        return call.args[0].value
    return kwarg_value(call, "pointer")


def accesses(fn: cst.FunctionDef, al: Aliases) -> list[Access]:
    """Every load and store of the kernel, in source order."""
    pointers = {p.name.value for p in params(fn)}
    bound = bindings(fn)
    out: list[Access] = []
    for node in walk(fn.body):
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            continue
        op = node.func.attr.value
        if op not in ("load", "store"):
            continue
        if is_call(node, al.tl, "load", "store"):
            addr = _address(node)
            base = pointer_base(addr, bound, pointers, al.tl) if addr is not None else None
            out.append(Access(node, op, base, False))
        elif isinstance(node.func.value, cst.Name) and node.func.value.value != al.tl:
            base = pointer_base(node.func.value, bound, pointers, al.tl)
            out.append(Access(node, op, base, True))
    return out


def outputs(fn: cst.FunctionDef, al: Aliases) -> list[str]:
    """The parameters the kernel stores to, in the order of their first store."""
    return list(dict.fromkeys(a.base for a in accesses(fn, al) if a.kind == "store" and a.base is not None))


def loaded_at(fn: cst.FunctionDef, al: Aliases) -> dict[str, int]:
    """For each parameter the kernel loads from, at how many load sites it does."""
    out: dict[str, int] = {}
    for a in accesses(fn, al):
        if a.kind == "load" and a.base is not None:
            out[a.base] = out.get(a.base, 0) + 1
    return out
