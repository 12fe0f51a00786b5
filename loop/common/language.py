"""The language of a kernel file, decided by what it imports (never by regex on its text)."""

from __future__ import annotations

import ast
from typing import Literal

Language = Literal["triton", "cutile"]

def detect_language(tree: ast.Module) -> Language | None:
    """cuTile if the module imports cuda.tile, Triton if it imports triton; decided by imports."""
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{a.name}" for a in node.names)
    if any(name == "cuda.tile" or name.startswith("cuda.tile.") for name in imported):
        return "cutile"
    if any(name == "triton" or name.startswith("triton.") for name in imported):
        return "triton"
    return None

