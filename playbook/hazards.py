"""Tile IR hazards, found statically in a target's AST and reported with their line.

CUDA Tile IR (nvtriton with ENABLE_TILE=1, and cuTile) has an unordered memory model: global
accesses are not ordered unless tokens say so. Kernels that rely on ordering (aliasing between a
load and a store, cross-block reductions through atomics, split-K / stream-K) can silently give
wrong results; some Triton ops are not supported at all and make nvtriton fall back to PTX.
The kernels scanned, nested ones included, are those `loop.common.kernel_source` reads.
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


def scan(source: str, language: str) -> list[Hazard]:
    tree = ast.parse(source)
    out: list[Hazard] = []
    for fn in [n for n in kernel_source.kernels(tree, nested=True) if isinstance(n, ast.FunctionDef)]:
        params = {a.arg for a in fn.args.args}
        root = {p: p for p in params}  # local names that are pointer arithmetic on a parameter
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                base = _base_name(node.value)
                if base in root:
                    root[node.targets[0].id] = root[base]
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
                if language == "triton" and name == "load" and isinstance(node.args[0], ast.BinOp):
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
