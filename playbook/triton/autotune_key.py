"""The key of an @triton.autotune the playbook writes: the kernel parameters whose launch argument
is a runtime size (a tensor's shape or element count, or arithmetic on those, in the launch
wrapper), and the constexprs the launch passes as variables. Recipes that need to know whether a
launch argument is a tensor size (triton-whole-row's row width) ask here too."""

from __future__ import annotations

import libcst as cst

from playbook.cst.aliases import Aliases
from playbook.cst.constants import int_value
from playbook.cst.kernels import is_constexpr, params
from playbook.cst.launches import Launch, bound_args
from playbook.cst.source import Skip, walk


def _is_shape(node: cst.BaseExpression) -> bool:
    """`x.shape` or `x.size()`."""
    if isinstance(node, cst.Attribute) and node.attr.value == "shape":
        return True
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size" \
        and not node.args


def is_size(node: cst.BaseExpression, sizes: set[str]) -> bool:
    """An expression that is a tensor size (or arithmetic on sizes): a runtime int."""
    if isinstance(node, cst.Name):
        return node.value in sizes
    if isinstance(node, cst.Subscript):
        return _is_shape(node.value)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.attr.value in ("numel", "size", "dim") or (
            node.func.attr.value == "cdiv" and all(is_size(a.value, sizes) or isinstance(a.value, cst.Integer)
                                                   for a in node.args))
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
        return node.func.value in ("len", "int") and len(node.args) == 1 and (
            node.func.value == "len" or is_size(node.args[0].value, sizes))
    if isinstance(node, cst.BinaryOperation) and isinstance(
            node.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)):
        sides = [node.left, node.right]
        return any(is_size(s, sizes) for s in sides) and all(is_size(s, sizes) or isinstance(s, cst.Integer)
                                                              for s in sides)
    return False


def size_names(wrapper: cst.FunctionDef) -> set[str]:
    """Names in the launch wrapper bound to tensor sizes: `rows, cols = x.shape`, `n = x.numel()`."""
    sizes: set[str] = set()
    assigns = [n for n in walk(wrapper.body) if isinstance(n, cst.Assign)]
    changed = True
    while changed:
        changed = False
        for a in assigns:
            for t in a.targets:
                tgt = t.target
                if isinstance(tgt, (cst.Tuple, cst.List)) and _is_shape(a.value):
                    found = [e.value.value for e in tgt.elements if isinstance(e.value, cst.Name)]
                elif isinstance(tgt, cst.Name) and is_size(a.value, sizes):
                    found = [tgt.value]
                else:
                    found = []
                for name in found:
                    if name not in sizes:
                        sizes.add(name)
                        changed = True
    return sizes


def tuning_key(fn: cst.FunctionDef, launch: Launch, al: Aliases, tuned: set[str],
               constants: dict | None = None) -> list[str]:
    """The autotune key of `fn` launched by `launch`: the parameters whose launch argument is a
    runtime size (never pointers, strides or floats), then the untuned constexpr parameters whose
    launch argument is not a constant (`CAUSAL=bool(causal)`). Triton's autotuner caches its pick
    by the key's values and the tensors' dtypes alone: a constexpr left out of the key would reuse
    the pick made for one value (a non-causal call) for every other (the causal calls), although
    each value compiles a different kernel."""
    ps = params(fn)
    pnames = [p.name.value for p in ps]
    constexpr = {p.name.value for p in ps if is_constexpr(p, al)}
    sizes = size_names(launch.wrapper)
    bound = bound_args(launch, pnames)
    keyed = {p for p, expr in bound if p not in tuned and is_size(expr, sizes)}
    if not keyed:
        raise Skip(f"{fn.name.value}: no runtime size argument to key the tuning on")
    keyed |= {p for p, expr in bound if p in constexpr and p not in tuned
              and int_value(expr, constants or {}) is None and not _literal(expr)}
    return [p for p in pnames if p in keyed]


def _literal(node: cst.BaseExpression) -> bool:
    """A literal the launch passes as it is: True/False/None, a number or a string."""
    return (isinstance(node, cst.Name) and node.value in ("True", "False", "None")) or isinstance(
        node, (cst.Integer, cst.Float, cst.SimpleString))
