"""A function matched against a template function: the same structure (node types, literals,
attribute and keyword names) with its other names renamed one to one. Formatting, comments,
parentheses, the function's own name and its decorators do not count."""

from __future__ import annotations

import libcst as cst

_NOISE = (cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline, cst.Comment,
          cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.Comma, cst.AssignEqual,
          cst.Colon, cst.Dot, cst.Semicolon)


def _tokens(node: cst.CSTNode, out: list, names: list[str]) -> None:
    """The structure of `node` as a flat token list: node types, literal values, attribute and
    keyword names as they are; every other name goes to `names` (in source order) as a placeholder.
    Formatting, comments and parentheses leave no token."""
    if isinstance(node, _NOISE):
        return
    if isinstance(node, cst.Name):
        out.append("Name")
        names.append(node.value)
        return
    if isinstance(node, cst.Attribute):
        out.append("Attribute")
        _tokens(node.value, out, names)
        out.append(("attr", node.attr.value))
        return
    if isinstance(node, cst.Arg):
        out.append(("Arg", node.keyword.value if node.keyword else None, node.star))
        _tokens(node.value, out, names)
        return
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)):
        out.append((type(node).__name__, node.evaluated_value))
        return
    if isinstance(node, cst.FunctionDef):  # its name and decorators are not part of the pattern
        out.append("FunctionDef")
        _tokens(node.params, out, names)
        _tokens(node.body, out, names)
        return
    out.append(type(node).__name__)
    for child in node.children:
        _tokens(child, out, names)


def without_docstring(fn: cst.FunctionDef) -> tuple[cst.FunctionDef, list]:
    """`fn` without its docstring, and the docstring statement (none: an empty list)."""
    body = list(fn.body.body)
    doc = []
    if (body and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1
            and isinstance(body[0].body[0], cst.Expr) and isinstance(body[0].body[0].value, cst.SimpleString)):
        doc = [body.pop(0)]
    return fn.with_changes(body=fn.body.with_changes(body=body)), doc


def template(code: str) -> cst.FunctionDef:
    """The function written in `code` (one `def`, leading newlines allowed)."""
    fn = cst.parse_module(code.lstrip("\n")).body[0]
    assert isinstance(fn, cst.FunctionDef)
    return fn


def match(template: cst.FunctionDef, fn: cst.FunctionDef) -> dict[str, str] | None:
    """Placeholder name -> the function's name, when `fn` has exactly the template's structure with
    its names renamed one to one; None otherwise."""
    t_tokens, t_names, f_tokens, f_names = [], [], [], []
    _tokens(template, t_tokens, t_names)
    _tokens(fn, f_tokens, f_names)
    if t_tokens != f_tokens:
        return None
    forward: dict[str, str] = {}
    backward: dict[str, str] = {}
    for t, f in zip(t_names, f_names):
        if forward.setdefault(t, f) != f or backward.setdefault(f, t) != t:
            return None
    return forward


class Rename(cst.CSTTransformer):
    """Renames variables (not attribute or keyword names)."""

    def __init__(self, mapping: dict[str, str]):
        self.mapping = mapping

    def leave_Name(self, original, updated):
        return updated.with_changes(value=self.mapping.get(original.value, original.value))

    def leave_Attribute(self, original, updated):
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original, updated):
        return updated.with_changes(keyword=original.keyword)
