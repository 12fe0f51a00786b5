"""Recipe `cutile-approx` (TileGym playbook H): approximate math on fp32 tiles, three candidates:
`rounding_mode=APPROX` on `ct.exp` / `ct.tanh`; `a / b` and `ct.truediv` with
`rounding_mode=APPROX`; and `flush_to_zero=True` on the calls that accept it (`ct.exp2`, `ct.max`,
`ct.sum`, `ct.rsqrt`, ...).

The signatures are those of cuda-tile 1.7.0 (`ct.exp` takes `rounding_mode` but not
`flush_to_zero`; `ct.exp2` the reverse). APPROX and FULL are fp32-only, so approx and ftz
rewrites touch only operands that a small dataflow over the kernel proves to be fp32 tiles
(`ct.astype(x, ct.float32)`, `ct.full(..., dtype=ct.float32)`, arithmetic on those, `float`
parameters); everything else is left alone.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import calls, is_attr
from playbook.cst.edits import add_kwarg, has_kwarg, kwarg, kwarg_value, replace
from playbook.cst.kernels import ct_kernels, params
from playbook.cst.names import assignments
from playbook.cst.source import Skip, checked, parse, walk
from playbook.recipe import Candidate, PatternRecipe, on_path, register

# cuda-tile 1.7.0: functions with a `flush_to_zero` / `rounding_mode` keyword (checked by the tests).
FTZ_OPS = ("add", "cumprod", "cumsum", "exp2", "max", "maximum", "min", "minimum", "mul", "prod", "rsqrt", "sqrt",
           "sub", "sum", "truediv")
APPROX_TRANSCENDENTAL = ("exp", "tanh")  # RoundingMode.APPROX: fp32 only, CTK >= 13.3 (exp) / 13.2 (tanh)


# ----------------------------------------------------------------------------------- fp32 dataflow

_F32_NEUTRAL = {"load", "bid", "num_blocks", "num_tiles", "cdiv", "arange", "astype", "full", "zeros", "ones",
                "reshape", "permute", "transpose", "store", "gather", "scatter"}


def _is_float32(node: cst.BaseExpression | None, ct: str) -> bool:
    return node is not None and is_attr(node, ct, "float32")


def is_f32(expr: cst.BaseExpression, names: set[str], ct: str) -> bool:
    """Whether `expr` is (statically) an fp32 tile or scalar."""
    if isinstance(expr, cst.Name):
        return expr.value in names
    if isinstance(expr, cst.Float):
        return False  # a literal adopts the other operand's type
    if isinstance(expr, (cst.Subscript,)):
        return is_f32(expr.value, names, ct)
    if isinstance(expr, cst.UnaryOperation):
        return is_f32(expr.expression, names, ct)
    if isinstance(expr, cst.BinaryOperation):
        return is_f32(expr.left, names, ct) or is_f32(expr.right, names, ct)
    if isinstance(expr, cst.Call):
        func = expr.func
        if is_attr(func, ct, "astype"):
            target = expr.args[1].value if len(expr.args) > 1 else kwarg_value(expr, "dtype")
            return _is_float32(target, ct)
        if is_attr(func, ct, "full", "zeros", "ones"):
            return _is_float32(kwarg_value(expr, "dtype"), ct)
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == ct:
            if func.attr.value in _F32_NEUTRAL:
                return False
            return any(is_f32(a.value, names, ct) for a in expr.args if a.keyword is None)
        if isinstance(func, cst.Attribute) and func.attr.value in ("reshape", "permute", "transpose", "item"):
            return is_f32(func.value, names, ct)  # method on a tile keeps its dtype
    return False


def f32_names(fn: cst.FunctionDef, ct: str) -> set[str]:
    names = {p.name.value for p in params(fn) if p.annotation is not None
             and isinstance(p.annotation.annotation, cst.Name) and p.annotation.annotation.value == "float"}
    assigned = assignments(fn)
    changed = True
    while changed:
        changed = False
        for name, values in assigned.items():
            if name not in names and any(is_f32(v, names, ct) for v in values):
                names.add(name)
                changed = True
    return names


def _approx(ct: str) -> cst.BaseExpression:
    return cst.parse_expression(f"{ct}.RoundingMode.APPROX")


# ----------------------------------------------------------------------------------- recipe


def _to_truediv(ct: str):
    def make(upd: cst.BinaryOperation) -> cst.Call:
        bare = [e.with_changes(lpar=[], rpar=[]) if getattr(e, "lpar", None) else e for e in (upd.left, upd.right)]
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        return cst.Call(func=cst.parse_expression(f"{ct}.truediv"),
                        args=[cst.Arg(bare[0], comma=comma), cst.Arg(bare[1], comma=comma),
                              kwarg("rounding_mode", _approx(ct))], lpar=upd.lpar, rpar=upd.rpar)
    return make


@register
class CuTileApprox(PatternRecipe):
    id = "cutile-approx"
    title = "Approximate fp32 math: rounding_mode=APPROX (exp, tanh, division), flush_to_zero=True"
    languages = ("cutile",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        al, kernels = ct_kernels(module)
        kernels = on_path(kernels, analysis)
        ct = al.ct
        out = []
        exp_sites, div_sites, ftz_sites = [], [], []
        for fn in kernels.values():
            f32 = f32_names(fn, ct)
            for node in walk(fn.body):
                if (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide)
                        and (is_f32(node.left, f32, ct) or is_f32(node.right, f32, ct))):
                    div_sites.append(node)
            for call in calls(fn.body, ct, *APPROX_TRANSCENDENTAL, "truediv", *FTZ_OPS):
                if not any(is_f32(a.value, f32, ct) for a in call.args if a.keyword is None):
                    continue
                op = call.func.attr.value
                if op in APPROX_TRANSCENDENTAL and not has_kwarg(call, "rounding_mode"):
                    exp_sites.append(call)
                if op == "truediv" and not has_kwarg(call, "rounding_mode"):
                    div_sites.append(call)
                if op in FTZ_OPS and not has_kwarg(call, "flush_to_zero"):
                    ftz_sites.append(call)

        if exp_sites:
            code = checked(replace(module, {c: (lambda upd: add_kwarg(upd, "rounding_mode", _approx(ct)))
                                            for c in exp_sites}).code)
            ops = "/".join(dict.fromkeys(f"ct.{c.func.attr.value}" for c in exp_sites))
            out.append(Candidate(self.id, "approx", f"{self.id}:exp", f"rounding_mode=APPROX on {len(exp_sites)} {ops}",
                                 f"approximate {ops} on fp32 tiles ({len(exp_sites)} site(s)): the hardware ex2/tanh "
                                 f"approximation instead of the full-precision sequence; expect 1-5% where the kernel "
                                 f"is compute-limited, ~0 when memory-bound; a few ulp of error", code))
        if div_sites:
            to_call = _to_truediv(ct)
            code = checked(replace(module, {
                d: (to_call if isinstance(d, cst.BinaryOperation)
                    else (lambda upd: add_kwarg(upd, "rounding_mode", _approx(ct)))) for d in div_sites}).code)
            n = len(div_sites)
            out.append(Candidate(self.id, "approx", f"{self.id}:div", f"fp32 division with rounding_mode=APPROX ({n} site(s))",
                                 f"approximate fp32 division at {n} site(s) (reciprocal + multiply instead of the "
                                 f"IEEE sequence): expect 1-5% where divisions are on the critical path; up to 2 ulp "
                                 f"of error", code))
        if ftz_sites:
            code = checked(replace(module, {c: (lambda upd: add_kwarg(upd, "flush_to_zero", cst.Name("True")))
                                            for c in ftz_sites}).code)
            ops = "/".join(dict.fromkeys(f"ct.{c.func.attr.value}" for c in ftz_sites))
            out.append(Candidate(self.id, "ftz", f"{self.id}:ftz", f"flush_to_zero=True on {len(ftz_sites)} {ops}",
                                 f"flush-to-zero on {ops} ({len(ftz_sites)} site(s)): no subnormal handling in those "
                                 f"fp32 ops; expect 1-3% where they are on the critical path; values below 1.2e-38 "
                                 f"become 0", code))
        if not out:
            raise Skip("no fp32 ct.exp/tanh, division or flush-to-zero-capable call without the option")
        return out
