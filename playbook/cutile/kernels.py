"""What the cuTile recipes read from and add to a @ct.kernel: block-id axes, the names it uses,
MMA calls, new parameters and new statements."""

from __future__ import annotations

import libcst as cst

from playbook.cst.aliases import is_call
from playbook.cst.source import Skip, walk

MMA_OPS = ("mma", "matmul")  # the calls that make a kernel an MMA (tensor core) kernel


def axis_of(call: cst.BaseExpression, ct: str, *fns: str) -> int | None:
    """k for `ct.<fn>(k)` with an int literal k, else None."""
    if (is_call(call, ct, *fns) and len(call.args) == 1 and call.args[0].keyword is None
            and isinstance(call.args[0].value, cst.Integer)):
        return int(call.args[0].value.evaluated_value)
    return None


def variables(node: cst.CSTNode) -> set[str]:
    """Names read or bound under `node`: not attribute names (`ct.bid`) nor keyword names (`index=`)."""
    skip = set()
    for n in walk(node):
        if isinstance(n, cst.Attribute):
            skip.add(id(n.attr))
        elif isinstance(n, cst.Arg) and n.keyword is not None:
            skip.add(id(n.keyword))
    return {n.value for n in walk(node) if isinstance(n, cst.Name) and id(n) not in skip}


def statements(text: list[str], comment: str | None = None,
               leading: list[cst.EmptyLine] | None = None) -> list[cst.BaseStatement]:
    """Parsed statement lines; the first carries `leading` lines, then `comment` on a line of its own."""
    stmts = [cst.parse_statement(line + "\n") for line in text]
    head = list(leading or [])
    if comment:
        head.append(cst.EmptyLine(comment=cst.Comment(comment)))
    if head:
        stmts[0] = stmts[0].with_changes(leading_lines=head)
    return stmts


def append_params(fn: cst.FunctionDef, new: list[cst.Param]) -> cst.Parameters:
    plist = list(fn.params.params)
    if fn.params.posonly_params or fn.params.kwonly_params or isinstance(fn.params.star_arg, cst.Param) \
            or fn.params.star_kwarg is not None or any(p.default is not None for p in plist) or not plist:
        raise Skip(f"{fn.name.value} has positional-only, keyword-only, default or * parameters")
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    last = plist[-1]
    tail = new[-1].with_changes(comma=last.comma) if isinstance(last.comma, cst.Comma) else new[-1]
    new = [p.with_changes(comma=comma) for p in new[:-1]] + [tail]
    return fn.params.with_changes(params=[*plist[:-1], last.with_changes(comma=comma), *new])


def param(name: str, annotation: str) -> cst.Param:
    return cst.Param(name=cst.Name(name), annotation=cst.Annotation(
        annotation=cst.parse_expression(annotation), whitespace_before_indicator=cst.SimpleWhitespace("")))


def array_name(call: cst.Call) -> str:
    """The array a ct.load / ct.store reads or writes, by name ("?" when it is not a name)."""
    first = call.args[0].value if call.args else None
    return first.value if isinstance(first, cst.Name) else "?"
