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


def is_size(node: cst.BaseExpression, sizes: set[str], shapes: frozenset[str] = frozenset()) -> bool:
    """An expression that is a tensor size (or arithmetic on sizes): a runtime int. `shapes`:
    names bound to a tensor's shape (`ori_shape = x.shape`), whose items are sizes too."""
    if isinstance(node, cst.Name):
        return node.value in sizes
    if isinstance(node, cst.Subscript):
        return _is_shape(node.value) or (isinstance(node.value, cst.Name) and node.value.value in shapes)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.attr.value in ("numel", "size", "dim") or (
            node.func.attr.value == "cdiv" and all(is_size(a.value, sizes, shapes) or isinstance(a.value, cst.Integer)
                                                   for a in node.args))
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
        return node.func.value in ("len", "int") and len(node.args) == 1 and (
            node.func.value == "len" or is_size(node.args[0].value, sizes, shapes))
    if isinstance(node, cst.BinaryOperation) and isinstance(
            node.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)):
        sides = [node.left, node.right]
        return any(is_size(s, sizes, shapes) for s in sides) and all(
            is_size(s, sizes, shapes) or isinstance(s, cst.Integer) for s in sides)
    return False


def shape_names(wrapper: cst.FunctionDef) -> frozenset[str]:
    """Names in the launch wrapper bound to a tensor's shape: `ori_shape = x.shape`."""
    return frozenset(t.target.value for n in walk(wrapper.body) if isinstance(n, cst.Assign) and _is_shape(n.value)
                     for t in n.targets if isinstance(t.target, cst.Name))


def size_names(wrapper: cst.FunctionDef) -> set[str]:
    """Names in the launch wrapper bound to tensor sizes: `rows, cols = x.shape`, `n = x.numel()`,
    `n_cols = ori_shape[-1]` of `ori_shape = x.shape`, `*batch, n_cols = x.shape`."""
    sizes: set[str] = set()
    shapes = shape_names(wrapper)
    assigns = [n for n in walk(wrapper.body) if isinstance(n, cst.Assign)]
    changed = True
    while changed:
        changed = False
        for a in assigns:
            for t in a.targets:
                tgt = t.target
                shape = _is_shape(a.value) or (isinstance(a.value, cst.Name) and a.value.value in shapes)
                if isinstance(tgt, (cst.Tuple, cst.List)) and shape:
                    found = [e.value.value for e in tgt.elements
                             if isinstance(e, cst.Element) and isinstance(e.value, cst.Name)]
                elif isinstance(tgt, cst.Name) and is_size(a.value, sizes, shapes):
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
    sizes, shapes = size_names(launch.wrapper), shape_names(launch.wrapper)
    bound = bound_args(launch, pnames)
    keyed = {p for p, expr in bound if p not in tuned and is_size(expr, sizes, shapes)}
    if not keyed:
        raise Skip(f"{fn.name.value}: no runtime size argument to key the tuning on")
    keyed |= {p for p, expr in bound if p in constexpr and p not in tuned
              and int_value(expr, constants or {}) is None and not _literal(expr)}
    return [p for p in pnames if p in keyed]


def _literal(node: cst.BaseExpression) -> bool:
    """A literal the launch passes as it is: True/False/None, a number or a string."""
    return (isinstance(node, cst.Name) and node.value in ("True", "False", "None")) or isinstance(
        node, (cst.Integer, cst.Float, cst.SimpleString))
