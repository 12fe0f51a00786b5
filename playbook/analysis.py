"""Static analysis of a target: kernel class from the AST, never from regex on source text."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from loop.contract import detect_language

REDUCTIONS = {"sum", "max", "min", "reduce", "argmax", "argmin", "xor_sum"}
NORM_HINTS = {"rsqrt", "sqrt", "exp", "exp2", "log"}

# Which variable to try first, per kernel class (memory-bound classes: bytes in flight first).
PRIORITY = {
    "element-wise": ["block", "num_warps", "num_stages"],
    "norm-like": ["block", "num_warps", "num_stages"],
    "reduction": ["block", "num_warps", "num_stages"],
    "dot": ["block", "num_stages", "num_warps"],
}


@dataclass(frozen=True)
class Analysis:
    language: str
    kernel_class: str  # dot | norm-like | reduction | element-wise
    calls: frozenset[str]

    def priority(self) -> list[str]:
        if self.language == "cutile":  # cuTile's default occupancy leaves most SMs idle: the first lever
            return ["occupancy"] + PRIORITY[self.kernel_class]
        return PRIORITY[self.kernel_class]


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
