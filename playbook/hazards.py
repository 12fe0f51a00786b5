"""Tile IR hazards, found statically in a target's AST and reported with their line.

CUDA Tile IR (nvtriton with ENABLE_TILE=1, and cuTile) has an unordered memory model: global
accesses are not ordered unless tokens say so. Kernels that rely on ordering (aliasing between a
load and a store, cross-block reductions through atomics, split-K / stream-K) can silently give
wrong results; some Triton ops are not supported at all and make nvtriton fall back to PTX.
The kernels scanned, nested ones included, are those `loop.common.kernel_source` reads.

A *tensor-of-pointer* load (Triton) is a `tl.load` whose address is pointer arithmetic: written in
the call (`tl.load(x_ptr + offs)`) or a name bound to it, through any chain of assignments and
augmented assignments (`a_ptrs = a_ptr + offs; a_ptrs += BLOCK_K * stride; tl.load(a_ptrs)`), the
names read flow-insensitively (every binding of a name in the kernel counts, wherever it sits). A
load of a block pointer (`tl.make_block_ptr`, `tl.advance`), of a tensor descriptor (`desc.load`,
`tl.make_tensor_descriptor`) or of a bare parameter is not one (a parameter offset in place,
`x_ptr += row * stride`, is pointer arithmetic). Scalar offsets are not told apart from tensor ones
(`tl.load(x_ptr + pid)` counts): the hazard is an info-level hint.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

from loop.common import kernel_source

UNSUPPORTED_TRITON = {
    "inline_asm_elementwise": "tt.elementwise_inline_asm is not supported by the Tile IR backend (falls back to PTX)",
    "gather": "tt.gather is not supported by Tile IR in CUDA 13.1",
    "extern_elementwise": "tt.extern_elementwise (libdevice calls) is not supported by the Tile IR backend",
    "dot_scaled": "tt.dot_scaled is not supported by the Tile IR backend",
    "map_elementwise": "tt.map_elementwise is not supported by the Tile IR backend",
    "erf": "math.erf is not supported by the Tile IR backend",
    "unsplat": "tt.unsplat is not supported by the Tile IR backend",
}
ATOMICS = {"atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg", "atomic_cas"}


@dataclass(frozen=True)
class Hazard:
    line: int
    severity: str  # error (unsupported: falls back or fails) | warning (ordering: may be wrong) | info (performance)
    code: str
    message: str

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"line {self.line}: {self.severity}: {self.code}: {self.message}"


def _attr_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _base_name(expr: ast.AST) -> str | None:
    """The pointer or array a load/store addresses: `x_ptr + offs` -> x_ptr, `x` -> x."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, ast.BinOp):
            expr = expr.left
        elif isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Call) and _attr_name(expr.func) in ("advance", "make_block_ptr"):
            base = next((k.value for k in expr.keywords if k.arg == "base"), None)
            if base is None and not expr.args:
                return None
            expr = base if base is not None else expr.args[0]
        else:
            return None


def _bindings(fn: ast.FunctionDef) -> list[tuple[str, ast.expr]]:
    """(name, value) for every binding of a plain name in fn: `t = v`, `a, b = u, v` (element-wise),
    and `t op= v` as `t = t op v`."""
    out: list[tuple[str, ast.expr]] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.append((target.id, node.value))
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                        and len(target.elts) == len(node.value.elts):
                    out += [(t.id, v) for t, v in zip(target.elts, node.value.elts) if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            out.append((node.target.id, ast.BinOp(ast.Name(node.target.id, ast.Load()), node.op, node.value)))
    return out


def _is_arithmetic(expr: ast.AST, arithmetic: set[str]) -> bool:
    """Whether an address is pointer arithmetic: a BinOp, a name bound to one, or a subscript of either
    (`ptrs[:, None]`). A parameter, a block pointer (`make_block_ptr`, `advance`) or a tensor
    descriptor is not."""
    if isinstance(expr, ast.Subscript):
        return _is_arithmetic(expr.value, arithmetic)
    return isinstance(expr, ast.BinOp) or (isinstance(expr, ast.Name) and expr.id in arithmetic)


def _pointer_names(params: list[str], bindings: list[tuple[str, ast.expr]]) -> tuple[dict[str, str], set[str]]:
    """For the kernel's names, to a fixed point (a binding may come after its use in `ast.walk`'s
    order): the parameter each one addresses (`root`, for aliasing; a name bound to several addresses
    the first one met) and those bound to pointer arithmetic."""
    root = {p: p for p in params}
    arithmetic: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, value in bindings:
            base = root.get(_base_name(value) or "")
            if base is not None and name not in root:
                root[name], changed = base, True
            if name not in arithmetic and _is_arithmetic(value, arithmetic):
                arithmetic.add(name)
                changed = True
    return root, arithmetic


def _is_tensor_of_pointer_load(call: ast.Call, arithmetic: set[str], bound: set[str]) -> bool:
    """`tl.load(addr)` with a pointer-arithmetic address; not a method of a kernel value (a tensor
    descriptor's `desc.load(offsets)`)."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in bound:
        return False
    return bool(call.args) and _is_arithmetic(call.args[0], arithmetic)


def scan(source: str, language: str) -> list[Hazard]:
    tree = ast.parse(source)
    out: list[Hazard] = []
    for fn in [n for n in kernel_source.kernels(tree, nested=True) if isinstance(n, ast.FunctionDef)]:
        params = [a.arg for a in fn.args.args]
        bindings = _bindings(fn)
        root, arithmetic = _pointer_names(params, bindings)  # name -> parameter it addresses; names bound to arithmetic
        bound = set(params) | {name for name, _ in bindings}
        loads: dict[str, int] = {}
        stores: dict[str, int] = {}
        pointer_loads = 0
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            name = _attr_name(node.func)
            if language == "triton" and name in UNSUPPORTED_TRITON:
                out.append(Hazard(node.lineno, "error", f"unsupported:{name}", UNSUPPORTED_TRITON[name]))
            if name in ATOMICS:
                out.append(Hazard(node.lineno, "warning", "cross-block-atomic",
                                  f"{name}: blocks are unordered under Tile IR's memory model; cross-block (split-K, "
                                  f"stream-K) reductions need explicit ordering; bf16/fp16 atomics are not supported"))
            if name in ("load", "store") and node.args:
                base = root.get(_base_name(node.args[0]) or "")
                if base is not None:
                    (loads if name == "load" else stores).setdefault(base, node.lineno)
                if language == "triton" and name == "load" and _is_tensor_of_pointer_load(node, arithmetic, bound):
                    pointer_loads += 1
            if name == "debug_barrier":
                out.append(Hazard(node.lineno, "warning", "barrier-ordering",
                                  "tl.debug_barrier does not order global memory under Tile IR's memory model"))
        for base in sorted(set(loads) & set(stores)):
            out.append(Hazard(stores[base], "warning", "aliasing",
                              f"`{base}` is both loaded (line {loads[base]}) and stored: Tile IR does not order these "
                              f"accesses; in-place updates and aliased buffers may read stale or new values"))
        if pointer_loads:
            out.append(Hazard(fn.lineno, "info", "tensor-of-pointer",
                              f"{fn.name}: {pointer_loads} tensor-of-pointer load(s); Tile IR is slow on them, "
                              f"tensor descriptors (TMA) are the fast path"))
    return sorted(out, key=lambda h: (h.line, h.code))
