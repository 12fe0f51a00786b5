"""cuTile knobs from the TileGym playbook (E, F, H) and the perf-knobs catalog (num_ctas).

* `cutile-latency`: `latency=N` on `ct.load` of streaming inputs (the load's index depends on the
  block id); one candidate per N in 2, 4, 8 that is not already in place.
* `cutile-store-no-tma`: `allow_tma=False` on every `ct.store` that does not set it.
* `cutile-approx`: approximate math on fp32 tiles, three candidates: `rounding_mode=APPROX` on
  `ct.exp` / `ct.tanh`; `a / b` and `ct.truediv` with `rounding_mode=APPROX`; and
  `flush_to_zero=True` on the calls that accept it (`ct.exp2`, `ct.max`, `ct.sum`, `ct.rsqrt`, ...).
* `cutile-num-ctas`: `num_ctas=2` on `@ct.kernel` for kernels that call `ct.mma` / `ct.matmul`.

The signatures are those of cuda-tile 1.7.0 (`ct.exp` takes `rounding_mode` but not
`flush_to_zero`; `ct.exp2` the reverse). APPROX and FULL are fp32-only, so approx and ftz
rewrites touch only operands that a small dataflow over the kernel proves to be fp32 tiles
(`ct.astype(x, ct.float32)`, `ct.full(..., dtype=ct.float32)`, arithmetic on those, `float`
parameters); everything else is left alone.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.base import Candidate, register
from playbook.cst_util import (PatternRecipe, Skip, add_kwarg, calls, checked, ct_kernels, has_kwarg, is_attr, is_call,
                               is_ct_kernel, kwarg, kwarg_value, params, parse, replace, walk)
from playbook.eviction import assignments, depends_on

LATENCIES = (2, 4, 8)
# cuda-tile 1.7.0: functions with a `flush_to_zero` / `rounding_mode` keyword (checked by the tests).
FTZ_OPS = ("add", "cumprod", "cumsum", "exp2", "max", "maximum", "min", "minimum", "mul", "prod", "rsqrt", "sqrt",
           "sub", "sum", "truediv")
APPROX_TRANSCENDENTAL = ("exp", "tanh")  # RoundingMode.APPROX: fp32 only, CTK >= 13.3 (exp) / 13.2 (tanh)
MMA_OPS = ("mma", "matmul")


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


# ----------------------------------------------------------------------------------- latency


def bid_names(fn: cst.FunctionDef, ct: str) -> set[str]:
    assigned = assignments(fn)
    return {name for name, values in assigned.items() if any(is_call(n, ct, "bid") for v in values for n in walk(v))}


def _index(call: cst.Call) -> cst.BaseExpression | None:
    value = kwarg_value(call, "index")
    if value is None and len(call.args) > 1 and call.args[1].keyword is None:
        value = call.args[1].value
    return value


def _array_name(call: cst.Call) -> str:
    first = call.args[0].value if call.args else None
    return first.value if isinstance(first, cst.Name) else "?"


@register
class CuTileLatency(PatternRecipe):
    id = "cutile-latency"
    title = "latency=N hints (2, 4, 8) on ct.load of streaming inputs"
    languages = ("cutile",)

    def streaming_loads(self, module: cst.Module) -> list[cst.Call]:
        al, kernels = ct_kernels(module)
        out = []
        for fn in kernels.values():
            roots = bid_names(fn, al.ct)
            assigned = assignments(fn)
            for call in calls(fn.body, al.ct, "load"):
                index = _index(call)
                if index is not None and (any(is_call(n, al.ct, "bid") for n in walk(index))
                                          or depends_on(index, assigned, roots)):
                    out.append(call)
        return out

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        loads = self.streaming_loads(module)
        if not loads:
            raise Skip("no ct.load whose index depends on the block id")
        current = set()
        for call in loads:
            value = kwarg_value(call, "latency")
            if value is not None and not isinstance(value, cst.Integer):
                raise Skip("a streaming load has a non-literal latency")
            current.add(int(value.evaluated_value) if value is not None else None)
        arrays = ", ".join(dict.fromkeys(_array_name(c) for c in loads))
        out = []
        for n in LATENCIES:
            if current == {n}:
                continue
            code = checked(replace(module, {c: (lambda upd, n=n: add_kwarg(upd, "latency", cst.Integer(str(n))))
                                            for c in loads}).code)
            now = "/".join(sorted("none" if v is None else str(v) for v in current))
            out.append(Candidate(self.id, "latency", f"{self.id}:latency={n}",
                                 f"ct.load latency {now} -> {n} on {len(loads)} streaming load(s) ({arrays})",
                                 f"latency hint {n} on the loads of {arrays}: tells the scheduler how far ahead to issue "
                                 f"them; expect -5..+6% (H200: layernorm +6% at 4-8), a large regression on loads inside "
                                 f"a loop (row_sum 0.3-0.9x)", code))
        if not out:
            raise Skip("every latency value is already in place")
        return out


# ----------------------------------------------------------------------------------- store, no TMA


@register
class CuTileStoreNoTma(PatternRecipe):
    id = "cutile-store-no-tma"
    title = "allow_tma=False on ct.store"
    languages = ("cutile",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        al, kernels = ct_kernels(module)
        stores = [c for fn in kernels.values() for c in calls(fn.body, al.ct, "store") if not has_kwarg(c, "allow_tma")]
        if not stores:
            raise Skip("no ct.store without allow_tma")
        code = checked(replace(module, {c: (lambda upd: add_kwarg(upd, "allow_tma", cst.Name("False")))
                                        for c in stores}).code)
        arrays = ", ".join(dict.fromkeys(_array_name(c) for c in stores))
        return [Candidate(self.id, "store-tma", f"{self.id}:allow_tma=False",
                          f"allow_tma=False on {len(stores)} ct.store ({arrays})",
                          f"plain (non-TMA) stores of {arrays}: skips TMA descriptor setup and the async store "
                          f"round trip; TileGym reports +10-30% on norm kernels whose store overhead dominates, "
                          f"a regression where TMA's bulk stores were winning", code)]


# ----------------------------------------------------------------------------------- approx / ftz


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


# ----------------------------------------------------------------------------------- num_ctas


@register
class CuTileNumCtas(PatternRecipe):
    id = "cutile-num-ctas"
    title = "num_ctas=2 on @ct.kernel for MMA kernels"
    languages = ("cutile",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language == "cutile" and analysis.kernel_class == "dot"

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        al, kernels = ct_kernels(module)
        out = []
        for name, fn in kernels.items():
            if not calls(fn.body, al.ct, *MMA_OPS):
                continue
            dec = next(d for d in fn.decorators if is_ct_kernel(d, al))
            if isinstance(dec.decorator, cst.Call) and has_kwarg(dec.decorator, "num_ctas"):
                continue

            def new_dec(upd: cst.Decorator) -> cst.Decorator:
                two = cst.Integer("2")
                if isinstance(upd.decorator, cst.Call):
                    return upd.with_changes(decorator=add_kwarg(upd.decorator, "num_ctas", two))
                return upd.with_changes(decorator=cst.Call(func=upd.decorator, args=[kwarg("num_ctas", two)]))

            code = checked(replace(module, {dec: new_dec}).code)
            out.append(Candidate(self.id, "num_ctas", f"{self.id}:{name}.num_ctas=2", f"{name}: num_ctas=2",
                                 f"{name} as a 2-CTA cluster: on Blackwell the pair runs one MMA tile together (2-CTA "
                                 f"mode), sharing operand traffic; expect 5-20% on large dot shapes there; on Hopper "
                                 f"expect a large regression (2-28x slower measured on an H200)", code))
        if not out:
            raise Skip("no @ct.kernel with ct.mma/ct.matmul and without num_ctas")
        return out
