"""Static analysis of a target: kernel class from the AST, never from regex on source text."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from loop.contract import detect_language

REDUCTIONS = {"sum", "max", "min", "reduce", "argmax", "argmin", "xor_sum"}
NORM_HINTS = {"rsqrt", "sqrt", "exp", "exp2", "log"}

# Which variable (Candidate.kind) to try first, per language and kernel class. Kinds not listed
# go after the listed ones; kinds the run has demoted go last (next_candidate).
#
# Triton, memory-bound classes: bytes in flight first (block size, the autotune space around it,
# warps), then cache policy and pipelining, math rewrites last (they rarely matter when memory
# is the limit). Dot: the autotune space (tiles x warps x stages) first, then program order for
# L2 reuse, then pipelining depth.
_TRITON_MEMORY = ["block", "autotune", "num_warps", "eviction", "num_stages", "exp2", "sigmoid"]
TRITON_PRIORITY = {
    "element-wise": _TRITON_MEMORY,
    "norm-like": _TRITON_MEMORY,
    "reduction": _TRITON_MEMORY,
    "dot": ["autotune", "grouped-ordering", "num_stages", "block", "num_warps", "exp2", "sigmoid", "eviction"],
}
# cuTile (TileGym perf-knobs order): occupancy first (the compiler's default leaves most SMs
# idle on one-row-per-block kernels), then tile sizes, then store path, latency hints and
# approximate math. For MMA kernels 2-CTA clusters come last: they pay on Blackwell only, and on
# an H200 the reference matmul and attention ran 2-28x slower with num_ctas=2.
_CUTILE_MEMORY = ["occupancy", "block", "store-tma", "latency", "approx", "ftz"]
CUTILE_PRIORITY = {
    "element-wise": _CUTILE_MEMORY,
    "norm-like": _CUTILE_MEMORY,
    "reduction": _CUTILE_MEMORY,
    "dot": ["occupancy", "block", "latency", "approx", "ftz", "store-tma", "num_ctas"],
}
PRIORITY = TRITON_PRIORITY  # the Triton table, under its earlier name


@dataclass(frozen=True)
class Analysis:
    language: str
    kernel_class: str  # dot | norm-like | reduction | element-wise
    calls: frozenset[str]

    def priority(self) -> list[str]:
        table = CUTILE_PRIORITY if self.language == "cutile" else TRITON_PRIORITY
        return list(table[self.kernel_class])


def _called_attrs(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Attribute):
                names.add(fn.attr)
            elif isinstance(fn, ast.Name):
                names.add(fn.id)
    return names


def analyze(source: str) -> Analysis:
    tree = ast.parse(source)
    language = detect_language(tree) or "triton"
    calls = _called_attrs(tree)
    if "dot" in calls or "mma" in calls:
        cls = "dot"
    elif calls & REDUCTIONS and calls & NORM_HINTS:
        cls = "norm-like"
    elif calls & REDUCTIONS:
        cls = "reduction"
    else:
        cls = "element-wise"
    return Analysis(language, cls, frozenset(calls))
