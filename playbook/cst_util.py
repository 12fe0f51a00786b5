"""libcst helpers shared by the recipes: import aliases, kernels, launches, keyword arguments.

Recipes recognise their pattern structurally (libcst nodes, resolved scopes), never by regex on
source text. A recipe that meets something it does not understand raises `Skip` internally and
proposes nothing; `skip_reason` exposes why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider


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


# ----------------------------------------------------------------------------------- aliases


@dataclass(frozen=True)
class Aliases:
    triton: str | None  # `import triton` -> "triton"
    tl: str | None  # `import triton.language as tl` -> "tl"
    ct: str | None  # `import cuda.tile as ct` -> "ct"


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def aliases(module: cst.Module) -> Aliases:
    found: dict[str, str] = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if not isinstance(small, cst.Import):
                continue
            for name in small.names:
                dotted = _dotted(name.name)
                if name.asname is not None and isinstance(name.asname.name, cst.Name):
                    local = name.asname.name.value
                elif dotted and "." not in dotted:
                    local = dotted
                else:
                    continue  # `import a.b` binds `a`, not `a.b`: not an alias we can use
                if dotted in ("triton", "triton.language", "cuda.tile"):
                    found[dotted] = local
    return Aliases(found.get("triton"), found.get("triton.language"), found.get("cuda.tile"))


def is_attr(node: cst.BaseExpression, base: str | None, *attrs: str) -> bool:
    """`node` is `base.attr` for one of `attrs` (base is a module alias)."""
    return (base is not None and isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)
            and node.value.value == base and node.attr.value in attrs)


def is_call(node: cst.CSTNode, base: str | None, *attrs: str) -> bool:
    return isinstance(node, cst.Call) and is_attr(node.func, base, *attrs)


# ----------------------------------------------------------------------------------- kernels


def _decorator_target(dec: cst.Decorator) -> cst.BaseExpression:
    return dec.decorator.func if isinstance(dec.decorator, cst.Call) else dec.decorator


def is_triton_jit(dec: cst.Decorator, al: Aliases) -> bool:
    return is_attr(_decorator_target(dec), al.triton, "jit")


def above_jit(decorator_code: str, al: Aliases) -> Callable[[cst.FunctionDef], cst.FunctionDef]:
    """A function-definition updater (for `replace`) that puts the decorator written in
    `decorator_code` (`@...` source ending in a newline) right above the function's @triton.jit,
    taking over the blank lines that stood before the jit decorator."""
    new = cst.parse_module(decorator_code + "def _f():\n    pass\n").body[0].decorators[0]

    def update(upd: cst.FunctionDef) -> cst.FunctionDef:
        decs = []
        for dec in upd.decorators:
            if is_triton_jit(dec, al):
                decs.append(new.with_changes(leading_lines=dec.leading_lines))
                dec = dec.with_changes(leading_lines=())
            decs.append(dec)
        return upd.with_changes(decorators=decs)

    return update


def is_triton_decorator(dec: cst.Decorator, al: Aliases, *names: str) -> bool:
    return is_attr(_decorator_target(dec), al.triton, *names)


def is_ct_kernel(dec: cst.Decorator, al: Aliases) -> bool:
    return is_attr(_decorator_target(dec), al.ct, "kernel")


def module_functions(module: cst.Module) -> list[cst.FunctionDef]:
    return [s for s in module.body if isinstance(s, cst.FunctionDef)]


def triton_aliases(module: cst.Module) -> Aliases:
    """The module's import aliases; Skip unless it imports both triton and triton.language."""
    al = aliases(module)
    if not (al.triton and al.tl):
        raise Skip("needs `import triton` and `import triton.language as tl`")
    return al


def triton_kernels(module: cst.Module, al: Aliases) -> dict[str, cst.FunctionDef]:
    return {f.name.value: f for f in module_functions(module) if any(is_triton_jit(d, al) for d in f.decorators)}


def cutile_kernels(module: cst.Module, al: Aliases) -> dict[str, cst.FunctionDef]:
    return {f.name.value: f for f in module_functions(module) if any(is_ct_kernel(d, al) for d in f.decorators)}


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under `node` (itself included), depth first, in source order."""
    yield node
    for child in node.children:
        yield from walk(child)


def calls(node: cst.CSTNode, base: str | None, *attrs: str) -> list[cst.Call]:
    return [n for n in walk(node) if is_call(n, base, *attrs)]


def has_loop(fn: cst.FunctionDef) -> bool:
    return any(isinstance(n, (cst.For, cst.While)) for n in walk(fn.body))


def names_in(node: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


def assigned_names(node: cst.CSTNode) -> set[str]:
    """Names a statement (or block) binds, anywhere inside it: assignment, augmented and annotated
    assignment targets, loop targets, `:=` targets."""
    out: set[str] = set()
    for n in walk(node):
        if isinstance(n, cst.Assign):
            targets = [t.target for t in n.targets]
        elif isinstance(n, (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
            targets = [n.target]
        else:
            continue
        for t in targets:
            if isinstance(t, (cst.Name, cst.Tuple, cst.List)):
                out |= {m.value for m in walk(t) if isinstance(m, cst.Name)}
    return out


class ShiftContinuation(cst.CSTTransformer):
    """Continuation lines moved right by `by` columns (to stay aligned after a longer name)."""

    def __init__(self, by: int):
        self.by = by

    def leave_ParenthesizedWhitespace(self, original, updated):
        if updated.indent and self.by > 0:
            return updated.with_changes(last_line=cst.SimpleWhitespace(updated.last_line.value + " " * self.by))
        return updated


def params(fn: cst.FunctionDef) -> list[cst.Param]:
    p = fn.params
    return [*p.posonly_params, *p.params, *p.kwonly_params]


def is_constexpr(param: cst.Param, al: Aliases) -> bool:
    ann = param.annotation.annotation if param.annotation is not None else None
    return ann is not None and (is_attr(ann, al.tl, "constexpr") or (isinstance(ann, cst.Name) and ann.value == "constexpr"))


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


def global_references(module: cst.Module) -> dict[str, list[cst.CSTNode]]:
    """For each module-level binding, the Name nodes (of `module` itself) that read it."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scope = wrapper.resolve(ScopeProvider)[module]
    out: dict[str, list[cst.CSTNode]] = {}
    for assignment in scope.assignments:
        out.setdefault(assignment.name, []).extend(access.node for access in assignment.references)
    return out


# ----------------------------------------------------------------------------------- launches


@dataclass(frozen=True)
class Launch:
    wrapper: cst.FunctionDef  # the host function holding the launch
    call: cst.Call  # kernel[grid](...)
    kernel: str

    @property
    def grid(self) -> cst.BaseExpression:
        sub = self.call.func
        assert isinstance(sub, cst.Subscript)
        elem = sub.slice[0].slice
        assert isinstance(elem, cst.Index)
        return elem.value

    def kwarg(self, name: str) -> cst.Arg | None:
        return next((a for a in self.call.args if a.keyword is not None and a.keyword.value == name), None)


def triton_launches(module: cst.Module, kernels: Iterable[str]) -> list[Launch]:
    """`kernel[grid](...)` calls of the given kernels inside module-level functions."""
    names = set(kernels)
    out = []
    for fn in module_functions(module):
        for node in walk(fn.body):
            if (isinstance(node, cst.Call) and isinstance(node.func, cst.Subscript)
                    and isinstance(node.func.value, cst.Name) and node.func.value.value in names
                    and len(node.func.slice) == 1 and isinstance(node.func.slice[0].slice, cst.Index)):
                out.append(Launch(fn, node, node.func.value.value))
    return out


# ----------------------------------------------------------------------------------- keyword args


def per_kernel(kernels: dict[str, cst.FunctionDef],
               attempt: Callable[[str, cst.FunctionDef], object]) -> tuple[list, list[str]]:
    """`attempt(name, fn)` for each kernel: the candidates it made, and the Skip reasons of the
    kernels it does not fit (a recipe proposes for every kernel that fits)."""
    out, reasons = [], []
    for name, fn in kernels.items():
        try:
            out.append(attempt(name, fn))
        except Skip as exc:
            reasons.append(str(exc))
    return out, reasons


def proposed(out: list, reasons: list[str], nothing: str = "") -> list:
    """`out`, or Skip with every reason (`nothing` when there is none) when it is empty."""
    if not out:
        raise Skip("; ".join(reasons) or nothing)
    return out


def only_launch(name: str, launches: list[Launch]) -> Launch:
    """The one launch of kernel `name`; Skip when it is launched more or less than once."""
    mine = [launch for launch in launches if launch.kernel == name]
    if len(mine) != 1:
        raise Skip(f"{name} is launched {len(mine)} times (one launch expected)")
    return mine[0]


def assign_of(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """(name, value) for a statement line `name = value`."""
    if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
            and len(stmt.body[0].targets) == 1 and isinstance(stmt.body[0].targets[0].target, cst.Name)):
        return stmt.body[0].targets[0].target.value, stmt.body[0].value
    return None


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


def ct_kernels(module: cst.Module) -> tuple[Aliases, dict[str, cst.FunctionDef]]:
    """The aliases and the @ct.kernel functions of a cuTile module; Skip when there are none."""
    al = aliases(module)
    if not al.ct:
        raise Skip("needs `import cuda.tile as ct`")
    kernels = cutile_kernels(module, al)
    if not kernels:
        raise Skip("no @ct.kernel function")
    return al, kernels


class SetConstant(cst.CSTTransformer):
    """Sets the module-level int constant `name = <int>` to `value` (a transformer: module.visit)."""

    def __init__(self, name: str, value: int):
        self.name, self.value = name, value

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if (len(updated.targets) == 1 and isinstance(updated.targets[0].target, cst.Name)
                and updated.targets[0].target.value == self.name and isinstance(updated.value, cst.Integer)):
            return updated.with_changes(value=cst.Integer(str(self.value)))
        return updated


def _no_space_equal() -> cst.AssignEqual:
    return cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(keyword=cst.Name(name), value=value, equal=_no_space_equal())


def has_kwarg(call: cst.Call, name: str) -> bool:
    return any(a.keyword is not None and a.keyword.value == name for a in call.args)


def add_kwarg(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value` appended (replacing an existing `name=`), formatting kept."""
    args = [a for a in call.args if not (a.keyword is not None and a.keyword.value == name)]
    new = kwarg(name, value)
    if args:
        last = args[-1]
        if isinstance(last.comma, cst.Comma):  # trailing comma: the new argument goes after it, with one too
            new = new.with_changes(comma=last.comma)
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        else:
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, new])


def remove_kwargs(call: cst.Call, names: set[str]) -> cst.Call:
    """`call` without the keyword arguments in `names`; the new last argument keeps the old
    last argument's trailing comma (or none)."""
    args = list(call.args)
    kept = [a for a in args if not (a.keyword is not None and a.keyword.value in names)]
    if kept and args and kept[-1] is not args[-1]:
        kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
    return call.with_changes(args=kept)


def kwarg_value(call: cst.Call, name: str) -> cst.BaseExpression | None:
    arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)
    return arg.value if arg is not None else None


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


# ----------------------------------------------------------------------------------- recipes


class PatternRecipe:
    """Base for recipes that recognise a source pattern: `propose` raises `Skip` (with the reason)
    where the pattern is absent or unsafe to rewrite; `candidates` then returns [] without error."""

    id: str
    title: str
    languages: tuple[str, ...]

    def applies(self, analysis) -> bool:
        return analysis.language in self.languages

    def propose(self, source: str, analysis) -> list:
        raise NotImplementedError

    def attempt(self, source: str, analysis) -> tuple[list, str | None]:
        """The candidates for `source` and, when there are none, why: one pass of `propose`."""
        try:
            cands = self.propose(source, analysis)
        except Skip as exc:
            return [], str(exc)
        return cands, None if cands else "every candidate is already in place"

    def candidates(self, source: str, analysis) -> list:
        return self.attempt(source, analysis)[0]

    def skip_reason(self, source: str, analysis) -> str | None:
        """Why this recipe proposes nothing for `source` (None when it proposes something)."""
        if not self.applies(analysis):
            from playbook.base import inapplicable

            return f"{self.id} {inapplicable(self, analysis)}"
        return self.attempt(source, analysis)[1]
