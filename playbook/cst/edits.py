"""Rewriting nodes in place: replacing original nodes by identity, adding and removing keyword
arguments with the call's formatting kept, and shifting continuation lines after a rename."""

from __future__ import annotations

from typing import Callable

import libcst as cst


class ReplaceNodes(cst.CSTTransformer):
    """Replace given original nodes (by identity) with new ones, or with what a function makes of them."""

    def __init__(self, mapping: dict[cst.CSTNode, cst.CSTNode | Callable[[cst.CSTNode], cst.CSTNode]]):
        self.mapping = mapping

    def on_leave(self, original, updated):
        if original in self.mapping:
            new = self.mapping[original]
            return new(updated) if callable(new) else new
        return updated


def replace(module: cst.Module, mapping: dict) -> cst.Module:
    return module.visit(ReplaceNodes(mapping))


class ShiftContinuation(cst.CSTTransformer):
    """Continuation lines moved right by `by` columns (to stay aligned after a longer name)."""

    def __init__(self, by: int):
        self.by = by

    def leave_ParenthesizedWhitespace(self, original, updated):
        if updated.indent and self.by > 0:
            return updated.with_changes(last_line=cst.SimpleWhitespace(updated.last_line.value + " " * self.by))
        return updated


def shift_aligned(node: cst.CSTNode, opening: cst.BaseParenthesizableWhitespace, by: int) -> cst.CSTNode:
    """`node` with its continuation lines `by` columns further right, when they are aligned with an
    opening parenthesis whose `opening` whitespace (just after it) stays on its line; a hanging
    indent (a line break right after the parenthesis) does not move with a longer name."""
    return node if isinstance(opening, cst.ParenthesizedWhitespace) else node.visit(ShiftContinuation(by))


# ----------------------------------------------------------------------------------- keyword arguments


def _no_space_equal() -> cst.AssignEqual:
    return cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(keyword=cst.Name(name), value=value, equal=_no_space_equal())


def has_kwarg(call: cst.Call, name: str) -> bool:
    return any(a.keyword is not None and a.keyword.value == name for a in call.args)


def kwarg_value(call: cst.Call, name: str) -> cst.BaseExpression | None:
    arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)
    return arg.value if arg is not None else None


def add_kwarg(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value` appended (replacing an existing `name=`), formatting kept."""
    args = [a for a in call.args if not (a.keyword is not None and a.keyword.value == name)]
    new = kwarg(name, value)
    if args:
        last = args[-1]
        if isinstance(last.comma, cst.Comma):  # trailing comma: the new argument goes after it, with one too
            new = new.with_changes(comma=last.comma)
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        else:  # the whitespace before the closing parenthesis follows the new last argument
            new = new.with_changes(whitespace_after_arg=last.whitespace_after_arg)
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                                         whitespace_after_arg=cst.SimpleWhitespace(""))
    return call.with_changes(args=[*args, new])


def remove_kwargs(call: cst.Call, names: set[str]) -> cst.Call:
    """`call` without the keyword arguments in `names`; the new last argument keeps the old
    last argument's trailing comma (or none) and the whitespace after it (a closing parenthesis
    on a line of its own stays there)."""
    args = list(call.args)
    kept = [a for a in args if not (a.keyword is not None and a.keyword.value in names)]
    if kept and args and kept[-1] is not args[-1]:
        kept[-1] = kept[-1].with_changes(comma=args[-1].comma, whitespace_after_arg=args[-1].whitespace_after_arg)
    return call.with_changes(args=kept)
