"""Launches on libcst nodes: which kernel a call launches, decided by `loop.common.kernel_source`'s
rule on the call's own code (`kernel[grid](...)`, `ct.launch(stream, grid, kernel, args)`); the
Triton launches in module-level functions, and which kernel parameter each launch argument is
bound to."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable

import libcst as cst

from loop.common import kernel_source
from playbook.cst.aliases import Aliases
from playbook.cst.kernels import module_functions, triton_aliases, triton_kernels
from playbook.cst.source import Skip, parse, walk


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


_EMPTY = cst.Module(body=[])


def imports_of(al: Aliases) -> dict[str, str]:
    """The module's imports of triton and cuda.tile as `kernel_source` reads them (local name ->
    dotted name), from its aliases."""
    out = dict(al.names)
    out.update({local: name for local, name in ((al.triton, "triton"), (al.tl, "triton.language"),
                                                (al.ct, "cuda.tile")) if local})
    return out


def as_ast(node: cst.CSTNode) -> ast.Call | None:
    """A libcst call as `ast` reads its own code; None for any other node."""
    if not isinstance(node, cst.Call):
        return None
    try:
        call = ast.parse(f"(\n{_EMPTY.code_for_node(node)}\n)", mode="eval").body
    except SyntaxError:
        return None
    return call if isinstance(call, ast.Call) else None


def launched(node: cst.CSTNode, imports: dict[str, str] | None = None) -> str:
    """The kernel a call launches, "" for any other node: `kernel_source.launched` of the call's own
    code (with the module's `imports`, `imports_of`, a cuTile launch too)."""
    call = as_ast(node)
    return kernel_source.launched(call, imports) if call is not None else ""


def is_cutile_launch(node: cst.CSTNode, imports: dict[str, str]) -> bool:
    """`ct.launch(stream, grid, kernel, args)` by `kernel_source.is_cutile_launch`, read through the
    module's `imports` (`imports_of`)."""
    call = as_ast(node)
    return call is not None and kernel_source.is_cutile_launch(call, imports)


def cutile_launch_argument(call: cst.Call, role: str) -> cst.BaseExpression:
    """The argument of a cuTile launch (`is_cutile_launch`) in `role`, one of
    `kernel_source.CUTILE_LAUNCH_ARGS`."""
    return call.args[kernel_source.CUTILE_LAUNCH_ARGS.index(role)].value


def triton_launches(module: cst.Module, kernels: Iterable[str]) -> list[Launch]:
    """The launches (`launched`) of the given kernels inside module-level functions, where the
    kernel is named as a local name and the grid is one subscript (the form the recipes rewrite)."""
    names = set(kernels)
    out = []
    for fn in module_functions(module):
        for node in walk(fn.body):
            if (launched(node) in names and isinstance(node.func, cst.Subscript)
                    and isinstance(node.func.value, cst.Name)
                    and len(node.func.slice) == 1 and isinstance(node.func.slice[0].slice, cst.Index)):
                out.append(Launch(fn, node, node.func.value.value))
    return out


def only_launch(name: str, launches: list[Launch]) -> Launch:
    """The one launch of kernel `name`; Skip when it is launched more or less than once."""
    mine = [launch for launch in launches if launch.kernel == name]
    if len(mine) != 1:
        raise Skip(f"{name} is launched {len(mine)} times (one launch expected)")
    return mine[0]


def bound_args(launch: Launch, pnames: list[str]) -> list[tuple[str, cst.BaseExpression]]:
    """(kernel parameter, launch argument) pairs: positional ones up to the first `*args`, then keywords."""
    out, positional = [], True
    for i, arg in enumerate(launch.call.args):
        if arg.keyword is not None:
            if arg.keyword.value in pnames:
                out.append((arg.keyword.value, arg.value))
        elif arg.star or i >= len(pnames):
            positional = False  # parameter positions past *args are unknown
        elif positional:
            out.append((pnames[i], arg.value))
    return out


def read_triton(source: str) -> tuple[cst.Module, Aliases, dict[str, cst.FunctionDef], list[Launch]]:
    """A Triton target as the recipes read it: its module, aliases, @triton.jit kernels and their launches."""
    module = parse(source)
    al = triton_aliases(module)
    kernels = triton_kernels(module, al)
    return module, al, kernels, triton_launches(module, kernels)
