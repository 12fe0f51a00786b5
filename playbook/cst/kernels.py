"""The kernels of a module: @triton.jit and @ct.kernel functions, their decorators, parameters
and loops, on libcst nodes (the recipes rewrite them). Which decorators make a kernel is
`loop.common.kernel_source`'s rule, read here through the module's aliases of triton and cuda.tile."""

from __future__ import annotations

from typing import Callable

import libcst as cst

from loop.common import kernel_source
from playbook.cst.aliases import Aliases, aliases, decorator_name, is_attr
from playbook.cst.program import split_device
from playbook.cst.source import Skip, walk


def is_triton_jit(dec: cst.Decorator, al: Aliases) -> bool:
    return kernel_source.triton_decorator(decorator_name(dec, al)) == "jit"


def is_triton_decorator(dec: cst.Decorator, al: Aliases, *names: str) -> bool:
    """The decorator is triton's jit, autotune or heuristics, one of `names`."""
    return kernel_source.triton_decorator(decorator_name(dec, al)) in names


def is_ct_kernel(dec: cst.Decorator, al: Aliases) -> bool:
    return decorator_name(dec, al) == kernel_source.CUTILE_KERNEL


def above_jit(decorator_code: str, al: Aliases) -> Callable[[cst.FunctionDef], cst.FunctionDef]:
    """A function-definition updater (for `replace`) that puts the decorator written in
    `decorator_code` (`@...` source ending in a newline) right above the function's @triton.jit,
    or above its @triton.heuristics when one sits over the jit (heuristics fill constexprs in
    for every config), taking over the blank lines that stood before that decorator."""
    new = cst.parse_module(decorator_code + "def _f():\n    pass\n").body[0].decorators[0]

    def update(upd: cst.FunctionDef) -> cst.FunctionDef:
        decs = list(upd.decorators)
        jit = next((i for i, d in enumerate(decs) if is_triton_jit(d, al)), None)
        if jit is None:
            return upd
        at = jit
        while at > 0 and is_triton_decorator(decs[at - 1], al, "heuristics"):
            at -= 1
        decs[at:at] = [new.with_changes(leading_lines=decs[at].leading_lines)]
        decs[at + 1] = decs[at + 1].with_changes(leading_lines=())
        return upd.with_changes(decorators=decs)

    return update


def heuristic_names(fn: cst.FunctionDef, al: Aliases) -> set[str]:
    """The constexprs an @triton.heuristics({...}) on the kernel computes (they are not launch arguments)."""
    out: set[str] = set()
    for dec in fn.decorators:
        if is_triton_decorator(dec, al, "heuristics") and isinstance(dec.decorator, cst.Call) and dec.decorator.args:
            values = dec.decorator.args[0].value
            if isinstance(values, cst.Dict):
                out |= {str(e.key.evaluated_value) for e in values.elements
                        if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)}
    return out


def module_functions(module: cst.Module) -> list[cst.FunctionDef]:
    return [s for s in module.body if isinstance(s, cst.FunctionDef)]


def triton_aliases(module: cst.Module) -> Aliases:
    """The module's import aliases; Skip unless it imports both triton and triton.language."""
    al = aliases(module)
    if not (al.triton and al.tl):
        raise Skip("needs `import triton` and `import triton.language as tl`")
    return al


def triton_kernels(module: cst.Module, al: Aliases) -> dict[str, cst.FunctionDef]:
    """The module's @triton.jit kernels: not the @triton.jit helpers that kernels call and no
    host code refers to (`silu(x)` in a kernel body; playbook/cst/program.py)."""
    kernels, _ = split_device(module, al)
    return {name: f for name, f in kernels.items() if any(is_triton_jit(d, al) for d in f.decorators)}


def triton_helpers(module: cst.Module, al: Aliases) -> dict[str, cst.FunctionDef]:
    """The @triton.jit helpers: device functions that kernels call, never launched."""
    _, helpers = split_device(module, al)
    return {name: f for name, f in helpers.items() if any(is_triton_jit(d, al) for d in f.decorators)}


def cutile_kernels(module: cst.Module, al: Aliases) -> dict[str, cst.FunctionDef]:
    return {f.name.value: f for f in module_functions(module) if any(is_ct_kernel(d, al) for d in f.decorators)}


def ct_kernels(module: cst.Module) -> tuple[Aliases, dict[str, cst.FunctionDef]]:
    """The aliases and the @ct.kernel functions of a cuTile module; Skip when there are none."""
    al = aliases(module)
    if not al.ct:
        raise Skip("needs `import cuda.tile as ct`")
    kernels = cutile_kernels(module, al)
    if not kernels:
        raise Skip("no @ct.kernel function")
    return al, kernels


def params(fn: cst.FunctionDef) -> list[cst.Param]:
    p = fn.params
    return [*p.posonly_params, *p.params, *p.kwonly_params]


def is_constexpr(param: cst.Param, al: Aliases) -> bool:
    ann = param.annotation.annotation if param.annotation is not None else None
    return ann is not None and (is_attr(ann, al.tl, "constexpr") or (isinstance(ann, cst.Name) and ann.value == "constexpr"))


def has_loop(fn: cst.FunctionDef) -> bool:
    return any(isinstance(n, (cst.For, cst.While)) for n in walk(fn.body))
