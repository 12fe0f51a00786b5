"""Recipe `cutile-tf32`: fp32 MMA operands cast to tf32 (TileGym playbook D), fp16/bf16 untouched.

cuTile does not promote fp32 `ct.mma` operands to tf32 by itself: fp32 x fp32 runs without
tensor cores. Casting both operands with `ct.astype(x, ct.tfloat32)` puts them on the TF32 tensor
core path (10-bit mantissa inputs, fp32 accumulation). The cast is guarded by the dtype of the
array each operand comes from, a compile-time constant:

    a_mma_dtype = ct.tfloat32 if a.dtype == ct.float32 else a.dtype
    acc = ct.mma(ct.astype(at, a_mma_dtype), ct.astype(bt, b_mma_dtype), acc)

so fp16/bf16 instantiations compile to the same code as before (checked on the SASS in the
tests) and only fp32 ones change. An operand is traced to its array through local assignments:
`ct.load(a, ...)` (with `.reshape`/`.transpose`/`.permute`, or their `ct.` forms, on top), or
`ct.astype(x, a.dtype)` (then the cast target itself is guarded). An operand traced to nothing
makes the kernel a Skip.

The recipe sees the target's source only, not its spec: whether fp32 inputs occur at all, and
whether the spec's fp32 tolerance admits TF32 rounding (~1e-3 relative), is for the loop's
correctness check and the spec's DTYPES to decide. Its candidates are therefore second thoughts
(tier 1): on a spec without float32 they are no-ops, which must not displace a real move.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import aliases, calls, is_attr, is_call
from playbook.cst.edits import replace
from playbook.cst.kernels import cutile_kernels, params
from playbook.cst.names import assignments
from playbook.cst.source import Skip, checked, parse, walk
from playbook.cutile.kernels import MMA_OPS, variables
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register

SHAPE_METHODS = ("reshape", "transpose", "permute")


def _is_dtype_of(node: cst.BaseExpression, arrays: set[str]) -> str | None:
    """`P` for `P.dtype` with P a kernel parameter."""
    if (isinstance(node, cst.Attribute) and node.attr.value == "dtype" and isinstance(node.value, cst.Name)
            and node.value.value in arrays):
        return node.value.value
    return None


def _astype_target(call: cst.BaseExpression, ct: str) -> cst.BaseExpression | None:
    if not is_call(call, ct, "astype"):
        return None
    if len(call.args) > 1 and call.args[1].keyword is None:
        return call.args[1].value
    return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "dtype"), None)


def source_array(expr: cst.BaseExpression, ct: str, arrays: set[str],
                 assigned: dict[str, list[cst.BaseExpression]], depth: int = 0) -> str | None:
    """The kernel parameter whose dtype `expr` has, traced through loads, shape ops and local names."""
    if depth > 16:
        return None
    if isinstance(expr, cst.Name):
        values = assigned.get(expr.value, [])
        return source_array(values[0], ct, arrays, assigned, depth + 1) if len(values) == 1 else None
    if not isinstance(expr, cst.Call) or not expr.args:
        return None
    first = expr.args[0].value
    if is_call(expr, ct, "load"):
        return first.value if isinstance(first, cst.Name) and first.value in arrays else None
    if is_call(expr, ct, *SHAPE_METHODS):
        return source_array(first, ct, arrays, assigned, depth + 1)
    if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in SHAPE_METHODS:
        return source_array(expr.func.value, ct, arrays, assigned, depth + 1)
    target = _astype_target(expr, ct)
    if target is not None:
        return _is_dtype_of(target, arrays)
    return None


def guard_name(array: str) -> str:
    return f"{array}_mma_dtype"


@register
class CuTileTf32(PatternRecipe):
    id = "cutile-tf32"
    title = "fp32 MMA operands cast to tf32 (guarded: fp16/bf16 unchanged)"
    languages = ("cutile",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language == "cutile" and analysis.kernel_class == "dot"

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        al = aliases(module)
        if not al.ct:
            raise Skip("needs `import cuda.tile as ct`")
        kernels = cutile_kernels(module, al)
        out, reasons = per_kernel(kernels, lambda name, fn: self._rewrite(module, al.ct, fn), analysis)
        return proposed(out, reasons, "no @ct.kernel function")

    def _rewrite(self, module: cst.Module, ct: str, fn: cst.FunctionDef) -> Candidate:
        name = fn.name.value
        mmas = calls(fn.body, ct, *MMA_OPS)
        if not mmas:
            raise Skip(f"{name} has no ct.mma/ct.matmul")
        if any(is_attr(n, ct, "tfloat32") for n in walk(fn.body)):
            raise Skip(f"{name} already uses ct.tfloat32")
        arrays = {p.name.value for p in params(fn) if p.annotation is None}
        assigned = assignments(fn)
        mapping: dict[cst.CSTNode, object] = {}
        order: list[str] = []
        for call in mmas:
            operands = [a for a in call.args[:2] if a.keyword is None]
            if len(operands) != 2:
                raise Skip(f"{name}: a ct.{call.func.attr.value} without two positional operands")
            for arg in operands:
                array = source_array(arg.value, ct, arrays, assigned)
                if array is None:
                    raise Skip(f"{name}: cannot tell which array the MMA operand "
                               f"`{cst.Module(body=[]).code_for_node(arg.value)}` comes from")
                order.append(array)
                guard = cst.Name(guard_name(array))
                target = _astype_target(arg.value, ct)
                if target is not None and _is_dtype_of(target, arrays):
                    mapping[target] = guard  # ct.astype(p, q.dtype) -> ct.astype(p, q_mma_dtype)
                else:
                    mapping[arg.value] = cst.parse_expression(f"{ct}.astype(x, {guard.value})").with_changes(
                        args=[cst.Arg(arg.value, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                              cst.Arg(guard)])
        arrays_used = list(dict.fromkeys(order))
        clash = variables(fn) & {guard_name(a) for a in arrays_used}
        if clash:
            raise Skip(f"{name} already uses {', '.join(sorted(clash))}")
        lines = [cst.parse_statement(f"{guard_name(a)} = {ct}.tfloat32 if {a}.dtype == {ct}.float32 else {a}.dtype\n")
                 for a in arrays_used]
        stmts = list(fn.body.body)
        at = 1 if stmts and isinstance(stmts[0], cst.SimpleStatementLine) and isinstance(stmts[0].body[0], cst.Expr) \
            and isinstance(stmts[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)) else 0
        lines[0] = lines[0].with_changes(leading_lines=[
            cst.EmptyLine(comment=cst.Comment("# TF32 tensor cores for fp32 inputs; fp16/bf16 keep their type"))])

        def new_fn(upd: cst.FunctionDef) -> cst.FunctionDef:
            body = list(upd.body.body)
            return upd.with_changes(body=upd.body.with_changes(body=[*body[:at], *lines, *body[at:]]))

        mapping[fn] = new_fn
        code = checked(replace(module, mapping).code)
        which = ", ".join(arrays_used)
        return Candidate(self.id, "tf32", f"{self.id}:{name}", f"{name}: fp32 MMA operands as tf32 ({which})",
                         f"{name}: fp32 operands of its {len(mmas)} MMA(s) cast to tf32 (arrays {which}), so fp32 "
                         f"inputs run on tensor cores instead of FMA units: TileGym reports ~2x on fp32 MMA; fp16/bf16 "
                         f"compile to the same code, so it is a no-op unless the spec's DTYPES has float32, and the "
                         f"spec's fp32 tolerance decides whether TF32 rounding (~1e-3 relative) passes",
                         code, tier=1)
