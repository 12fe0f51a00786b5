"""Index expressions of a Triton kernel, taken apart and compared: the summands of an address,
the conjuncts of a mask, broadcasts `x[:, None]` / `x[None, :]`, multiples of a block size, the
names an expression reads and how often the kernel binds each name. Expressions compare by their
code without whitespace or outer parentheses."""

from __future__ import annotations

from collections import Counter

import libcst as cst

from playbook.cst.source import walk


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node).strip()


def strip_parens(text: str) -> str:
    while text.startswith("(") and text.endswith(")"):
        depth = 0
        for ch in text[1:-1]:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth < 0:
                return text
        if depth:
            return text
        text = text[1:-1]
    return text


def norm(node: cst.CSTNode | str) -> str:
    """An expression's code without whitespace or outer parentheses, for comparing expressions."""
    return strip_parens("".join((node if isinstance(node, str) else code(node)).split()))


def summands(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The summands of `a + b + c`."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return summands(node.left) + summands(node.right)
    return [node]


def conjuncts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitAnd):
        return conjuncts(node.left) + conjuncts(node.right)
    return [node]


def bcast(node: cst.BaseExpression) -> tuple[cst.BaseExpression, int] | None:
    """(x, dim) for `x[:, None]` (dim 0) or `x[None, :]` (dim 1)."""
    if not (isinstance(node, cst.Subscript) and len(node.slice) == 2):
        return None
    kinds = []
    for el in node.slice:
        s = el.slice
        if isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None:
            kinds.append(":")
        elif isinstance(s, cst.Index) and isinstance(s.value, cst.Name) and s.value.value == "None":
            kinds.append("None")
        else:
            return None
    dim = {(":", "None"): 0, ("None", ":"): 1}.get(tuple(kinds))
    return (node.value, dim) if dim is not None else None


def multiple_of(node: cst.BaseExpression, block: str) -> bool:
    """`node` is `block` or a product with `block` as a factor (`pid_n * BLOCK_N`)."""
    if norm(node) == norm(block):
        return True
    return (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply)
            and (multiple_of(node.left, block) or multiple_of(node.right, block)))


def free_names(node: cst.CSTNode) -> list[str]:
    """Names an expression reads (not attribute names, keyword names or lambda parameters)."""
    skip: set[int] = set()
    for n in walk(node):
        if isinstance(n, cst.Attribute):
            skip.add(id(n.attr))
        elif isinstance(n, cst.Arg) and n.keyword is not None:
            skip.add(id(n.keyword))
    return [n.value for n in walk(node) if isinstance(n, cst.Name) and id(n) not in skip and n.value != "None"]


def bindings(fn: cst.FunctionDef) -> Counter:
    """How often each name is bound in the kernel (assignments, augmented ones, loop targets)."""
    out: Counter = Counter()
    for node in walk(fn.body):
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.For)):
            targets = [node.target]
        else:
            continue
        for t in targets:
            out.update(n.value for n in walk(t) if isinstance(n, cst.Name))
    return out
