"""A target's source as a libcst module: parsing it, checking a rewrite, printing and walking
nodes; and `Skip`, how a recipe says that it does not recognise its pattern."""

from __future__ import annotations

from typing import Iterator

import libcst as cst


class Skip(Exception):
    """The recipe does not recognise its pattern here; the message says what was missing."""


def parse(source: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise Skip(f"source does not parse: {exc.message}") from None


def checked(source: str) -> str:
    """The rewritten source, after checking that it parses (a recipe never emits broken code)."""
    cst.parse_module(source)
    compile(source, "<candidate>", "exec")
    return source


def code_of(node: cst.CSTNode) -> str:
    """The source of an expression, without its outer parentheses."""
    if hasattr(node, "lpar"):
        node = node.with_changes(lpar=[], rpar=[])
    return cst.Module([]).code_for_node(node)


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under `node` (itself included), depth first, in source order."""
    yield node
    for child in node.children:
        yield from walk(child)
