"""Recipe `fast-math`: cheaper spellings of transcendental math in Triton kernels.

Two kinds of rewrite, one candidate each (every site of that kind at once):

* `sigmoid`: `1.0 / (1.0 + tl.exp(-x))` -> `tl.sigmoid(x)`, and `a / (1.0 + tl.exp(-x))` ->
  `a * tl.sigmoid(x)` (the SiLU spelling). The literal may be `1` or `1.0`, on either side of `+`.
* `exp2`: `tl.exp(e)` -> `tl.exp2(e * 1.4426950408889634)` (also `tl.math.exp`), i.e. the
  ex2 + multiply form that the Tile IR backend does not derive by itself.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import aliases
from playbook.cst.kernels import triton_helpers, triton_kernels
from playbook.cst.program import reached_helpers
from playbook.cst.source import Skip, checked, parse
from playbook.recipe import Candidate, PatternRecipe, off_path, off_path_reason, register

LOG2E = "1.4426950408889634"


def _is_one(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Integer):
        return node.value == "1"
    return isinstance(node, cst.Float) and float(node.value) == 1.0


def _exp_namespace(call: cst.CSTNode, tl: str) -> cst.BaseExpression | None:
    """For `tl.exp(...)` / `tl.math.exp(...)`: the namespace expression (`tl` / `tl.math`)."""
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "exp"):
        return None
    ns = call.func.value
    if isinstance(ns, cst.Name) and ns.value == tl:
        return ns
    if (isinstance(ns, cst.Attribute) and ns.attr.value == "math" and isinstance(ns.value, cst.Name)
            and ns.value.value == tl):
        return ns
    return None


def _single_positional(call: cst.Call) -> cst.BaseExpression | None:
    if len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star:
        return call.args[0].value
    return None


def sigmoid_argument(denominator: cst.BaseExpression, tl: str) -> cst.BaseExpression | None:
    """x for a denominator `1 + tl.exp(-x)` (either order), else None."""
    if not (isinstance(denominator, cst.BinaryOperation) and isinstance(denominator.operator, cst.Add)):
        return None
    for one, other in ((denominator.left, denominator.right), (denominator.right, denominator.left)):
        if _is_one(one) and _exp_namespace(other, tl) is not None:
            arg = _single_positional(other)
            if isinstance(arg, cst.UnaryOperation) and isinstance(arg.operator, cst.Minus):
                return arg.expression
    return None


def _bare(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def _call(func: str, arg: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.parse_expression(func), args=[cst.Arg(value=_bare(arg))])


class _Sigmoid(cst.CSTTransformer):
    def __init__(self, tl: str):
        self.tl, self.count = tl, 0

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BinaryOperation) -> cst.BaseExpression:
        if not isinstance(updated.operator, cst.Divide):
            return updated
        x = sigmoid_argument(updated.right, self.tl)
        if x is None:
            return updated
        self.count += 1
        sig = _call(f"{self.tl}.sigmoid", x)
        if _is_one(updated.left):
            return sig.with_changes(lpar=updated.lpar, rpar=updated.rpar)
        return cst.BinaryOperation(left=updated.left, operator=cst.Multiply(
            whitespace_before=updated.operator.whitespace_before, whitespace_after=updated.operator.whitespace_after),
            right=sig, lpar=updated.lpar, rpar=updated.rpar)


# Operands that bind tighter than `*` (no parentheses needed in `e * LOG2E`).
_TIGHT = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)


def _times_log2e(e: cst.BaseExpression) -> cst.BaseExpression:
    tight = (isinstance(e, _TIGHT) or getattr(e, "lpar", None)
             or (isinstance(e, cst.UnaryOperation) and isinstance(e.operator, (cst.Minus, cst.Plus)))
             or (isinstance(e, cst.BinaryOperation) and isinstance(e.operator, (cst.Multiply, cst.Divide))))
    left = e if tight else e.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(left=left, operator=cst.Multiply(), right=cst.Float(LOG2E))


class _Exp2(cst.CSTTransformer):
    def __init__(self, tl: str):
        self.tl, self.count = tl, 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if _exp_namespace(updated, self.tl) is None:
            return updated
        e = _single_positional(updated)
        if e is None:
            return updated
        self.count += 1
        func = updated.func.with_changes(attr=cst.Name("exp2"))
        return updated.with_changes(func=func, args=[updated.args[0].with_changes(value=_times_log2e(e))])


HYPOTHESES = {
    "sigmoid": "tl.sigmoid instead of the hand-written 1/(1+exp(-x)) at {n} site(s): one library op a backend may "
               "lower natively; expect ~0 on PTX (Triton 3.6's tl.sigmoid is the same formula; -0.4% measured on "
               "silu_mul, H200), possibly more on Tile IR",
    "exp2": "exp2(x*log2e) instead of exp(x) at {n} site(s): PTX gets ex2.approx.ftz.f32 instead of the subnormal-"
            "preserving ex2.approx.f32 that fp32 tl.exp lowers to, and Tile IR gets the ex2 + multiply form it does "
            "not derive itself; expect 5-30% where exp is on the critical path (+13-31% on the softmax baseline, "
            "H200), ~0 when memory-bound",
}


class _Scoped(cst.CSTTransformer):
    """Apply an inner transformer only inside the given @triton.jit functions."""

    def __init__(self, inner: cst.CSTTransformer, kernels: set[str]):
        self.inner, self.kernels = inner, kernels

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original.name.value in self.kernels:
            return updated.with_changes(body=updated.body.visit(self.inner))
        return updated


@register
class FastMath(PatternRecipe):
    id = "fast-math"
    title = "Fast math: tl.sigmoid for 1/(1+exp(-x)); exp2(x*log2e) for exp(x)"
    languages = ("triton",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language == "triton" and "exp" in analysis.calls

    def inapplicable(self, analysis: Analysis) -> str:
        """Why it does not apply, for `why_nothing`: the kernel calls no exp (any more)."""
        return "no tl.exp call in the kernel (none, or an earlier rewrite replaced them)"

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        al = aliases(module)
        if not al.tl:
            raise Skip("needs `import triton.language as tl`")
        kernels = triton_kernels(module, al)
        if not kernels:
            raise Skip("no @triton.jit kernel")
        left = off_path(kernels, analysis)
        launched = [fn for name, fn in kernels.items() if name not in left]
        if not launched:
            raise Skip(off_path_reason(left, analysis))
        # the kernels the entry point launches, and the @triton.jit helpers they call
        scope = {f.name.value for f in launched} | set(reached_helpers(launched, triton_helpers(module, al)))
        out = []
        for kind, transformer in (("sigmoid", _Sigmoid(al.tl)), ("exp2", _Exp2(al.tl))):
            new = module.visit(_Scoped(transformer, scope))
            if transformer.count:
                code = checked(new.code)
                title = {"sigmoid": f"tl.sigmoid for 1/(1+exp(-x)) ({transformer.count} site(s))",
                         "exp2": f"tl.exp(x) -> tl.exp2(x * log2(e)) ({transformer.count} site(s))"}[kind]
                out.append(Candidate(self.id, kind, f"{self.id}:{kind}", title,
                                     HYPOTHESES[kind].format(n=transformer.count), code))
        if not out:
            raise Skip("no 1/(1+exp(-x)) and no tl.exp call in a kernel" + (
                f" on the forward path ({', '.join(left)} left alone)" if left else ""))
        return out

