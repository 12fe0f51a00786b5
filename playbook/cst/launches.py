"""Launches of Triton kernels: `kernel[grid](...)` calls in module-level functions, and which
kernel parameter each launch argument is bound to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import libcst as cst

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
