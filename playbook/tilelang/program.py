"""What the TileLang recipes read of a target: its `@tilelang.jit` kernels, the host call that compiles
each one, the `T.*` calls in a kernel's body, and the tunable integers (*knobs*) those calls take, traced
to where the source states them; and the rewrite that sets one.

A knob is a value a kernel reads (`block_M`, `num_stages=` of `T.Pipelined`, `threads=` of `T.Kernel`):
a literal where it is used, or a kernel parameter whose value the compile call passes (`matmul(M, N, K,
BLOCK_M, ...)`) as a literal or as a module-level int constant (`BLOCK_M = 64`), or leaves at the
parameter's default. A knob is rewritten where it is stated (the constant's definition, or the literal),
so every reader of it moves together. Which functions are kernels and which calls launch them is
`loop.common.kernel_source`'s rule; tilelang itself is never imported here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import libcst as cst

from loop.common import kernel_source
from playbook.analysis import TILELANG_DOT
from playbook.cst.constants import SetConstant, module_int_constants
from playbook.cst.edits import replace
from playbook.cst.source import Skip, checked, parse, walk
from playbook.recipe import off_path, off_path_reason

LANGUAGE_MODULE = "tilelang.language"


@dataclass(frozen=True)
class Knob:
    """One tunable integer of a kernel: where the source states it, and its value there."""

    name: str  # what the kernel calls it: a parameter (`block_M`) or a keyword (`num_stages`)
    value: int
    constant: str | None = None  # the module-level constant holding it (`BLOCK_M`), or None
    literal: cst.Integer | None = None  # the literal to rewrite, where no constant holds it

    @property
    def label(self) -> str:
        """How a title names it: the constant, else the kernel's own name for it."""
        return self.constant or self.name


@dataclass(frozen=True)
class Kernel:
    """A `@tilelang.jit` kernel on the forward path, and the host call that compiles it (None: not found)."""

    name: str
    fn: cst.FunctionDef
    compile_call: cst.Call | None


@dataclass(frozen=True)
class Program:
    module: cst.Module
    imports: dict[str, str]  # local name -> dotted name (`T` -> tilelang.language)
    constants: dict[str, int]
    kernels: dict[str, Kernel]


def dotted(node: cst.BaseExpression, imports: dict[str, str]) -> str:
    """The dotted name an expression reads, its first name resolved through the imports (`T.gemm`
    -> tilelang.language.gemm); "" for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return ""
    return ".".join([imports.get(node.value, node.value), *reversed(parts)])


def read(source: str, analysis=None) -> Program:
    """The target's TileLang kernels on the forward path of the analysis' entry point; Skip with the
    reason when there is none."""
    module = parse(source)
    tree = ast.parse(source)
    names = list(kernel_source.tilelang_kernels(tree))
    if not names:
        raise Skip("no @tilelang.jit kernel")
    left = off_path(names, analysis)
    if len(left) == len(names):
        raise Skip(off_path_reason(left, analysis))
    defs = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    kernels = {n: Kernel(n, defs[n], _compile_call(module, n)) for n in names if n not in left}
    return Program(module, kernel_source.imported_names(tree), module_int_constants(module), kernels)


def _compile_call(module: cst.Module, kernel: str) -> cst.Call | None:
    """The first call of `kernel(...)` in host code (a kernel's own body is not host code)."""
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == kernel:
            continue
        for node in walk(stmt):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == kernel:
                return node
    return None


def tl_calls(node: cst.CSTNode, imports: dict[str, str], *attrs: str) -> list[cst.Call]:
    """The calls of `T.<attr>` (tilelang.language's, read through the imports) under `node`, in source order."""
    wanted = {f"{LANGUAGE_MODULE}.{a}" for a in attrs}
    return [n for n in walk(node) if isinstance(n, cst.Call) and dotted(n.func, imports) in wanted]


def keyword(call: cst.Call, name: str, position: int | None = None) -> cst.BaseExpression | None:
    """The argument `name=` of a call, or its `position`-th positional argument."""
    for i, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
        if arg.keyword is None and arg.star == "" and i == position:
            return arg.value
    return None


def parameter(kernel: Kernel, name: str, program: Program) -> Knob | None:
    """The knob a kernel parameter is: what the compile call passes for it (a literal or a module
    constant), else its default; None when it is computed or not known."""
    params = list(kernel.fn.params.params)
    index = next((i for i, p in enumerate(params) if p.name.value == name), None)
    if index is None:
        return None
    passed = keyword(kernel.compile_call, name, index) if kernel.compile_call is not None else None
    expr = passed if passed is not None else params[index].default
    return None if expr is None else value_knob(name, expr, program)


def value_knob(name: str, expr: cst.BaseExpression, program: Program) -> Knob | None:
    """A knob from an expression: an int literal, or a module-level int constant."""
    if isinstance(expr, cst.Integer):
        return Knob(name, int(expr.evaluated_value), literal=expr)
    if isinstance(expr, cst.Name) and expr.value in program.constants:
        return Knob(name, program.constants[expr.value], constant=expr.value)
    return None


def used_knob(kernel: Kernel, expr: cst.BaseExpression | None, name: str, program: Program) -> Knob | None:
    """The knob an expression in the kernel's body reads: a literal, a kernel parameter, or a module constant."""
    if expr is None:
        return None
    if isinstance(expr, cst.Name) and any(p.name.value == expr.value for p in kernel.fn.params.params):
        return parameter(kernel, expr.value, program)
    return value_knob(name, expr, program)


def params_named(kernel: Kernel, *names: str) -> list[str]:
    """The kernel's parameters whose names are among `names`, compared without case (`block_M`)."""
    wanted = {n.lower() for n in names}
    return [p.name.value for p in kernel.fn.params.params if p.name.value.lower() in wanted]


def set_knob(program: Program, knob: Knob, value: int) -> str:
    """The target with `knob` set to `value` where it is stated; it must parse and compile."""
    if knob.constant:
        code = program.module.visit(SetConstant(knob.constant, value)).code
    else:
        code = replace(program.module, {knob.literal: cst.Integer(str(value))}).code
    return checked(code)


def is_dot(kernel: Kernel, program: Program) -> bool:
    """The kernel multiplies tiles (`T.gemm` or one of its forms)."""
    return any(dotted(n.func, program.imports).rpartition(".")[2] in TILELANG_DOT
               for n in walk(kernel.fn) if isinstance(n, cst.Call)
               and dotted(n.func, program.imports).startswith(f"{LANGUAGE_MODULE}."))


def pipelined(kernel: Kernel, program: Program) -> cst.Call | None:
    """The kernel's first `T.Pipelined(...)` loop, None when it has none."""
    found = tl_calls(kernel.fn, program.imports, "Pipelined")
    return found[0] if found else None


def stages_knob(kernel: Kernel, program: Program) -> Knob | None:
    """The `num_stages` of the kernel's first T.Pipelined loop (its third positional argument or the
    keyword), None when the loop has none or it is not stated as an integer."""
    loop = pipelined(kernel, program)
    return None if loop is None else used_knob(kernel, keyword(loop, "num_stages", 2), "num_stages", program)


def launch_frame(kernel: Kernel, program: Program) -> cst.Call | None:
    """The kernel's first `T.Kernel(...)` (its grid and threads), None when it has none."""
    found = tl_calls(kernel.fn, program.imports, "Kernel")
    return found[0] if found else None


def threads_knob(kernel: Kernel, program: Program) -> Knob | None:
    """The `threads=` of the kernel's T.Kernel, None when it is not given or not an integer."""
    frame = launch_frame(kernel, program)
    return None if frame is None else used_knob(kernel, keyword(frame, "threads"), "threads", program)


def block_knobs(kernel: Kernel, program: Program) -> dict[str, Knob | None]:
    """A dot kernel's tile parameters, `block_M`, `block_N`, `block_K` (croq-tune's names, any case),
    by their upper-case letter: {"M": knob, ...}; a parameter the kernel lacks is left out."""
    out: dict[str, Knob | None] = {}
    for name in params_named(kernel, "block_M", "block_N", "block_K"):
        out[name[-1].upper()] = parameter(kernel, name, program)
    return out


def element_block(kernel: Kernel, program: Program) -> Knob | None:
    """An element-wise kernel's block: the extent of its first `T.Parallel(...)` loop (a literal, or a
    parameter stated as one), None when it has no such loop or the extent is computed."""
    loops = tl_calls(kernel.fn, program.imports, "Parallel")
    if not loops or len(loops[0].args) != 1:
        return None
    return used_knob(kernel, loops[0].args[0].value, "block", program)
