"""What of a Triton target the interpreter (`TRITON_INTERPRET=1`, `--device cpu`) cannot run, found
from the source and the failure: `.to()` on a scalar argument (the interpreter passes Python
numbers), libdevice functions (`tl.extra.libdevice`, `triton.language.extra.cuda.libdevice`),
inline assembly. The GPU runs all of them; the CPU check names the construct and its line instead
of a stack trace. The kernels are those `loop.common.kernel_source` reads."""

from __future__ import annotations

import ast
import traceback
from pathlib import Path

from loop.common import kernel_source

SCALAR_TO = "object has no attribute 'to'"


def failing_line(exc: BaseException, path: Path) -> int | None:
    """The innermost line of `path` in the traceback of `exc` or of the exceptions it was raised from
    (the interpreter re-raises a kernel's error as its own: the kernel's frame is in the cause)."""
    found, seen = None, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
        if frames:
            found = frames[-1].lineno
        exc = exc.__cause__ or exc.__context__
    return found


def interpreter_limits(source: str, message: str, line: int | None = None) -> tuple[str, int] | None:
    """The construct of `source` that the interpreter's failure `message` points at, and its line: the
    one on `line` (where the failure happened, when known), else the first of the kind the message
    names."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found = _constructs(tree)
    if not found:
        return None
    on_line = [f for f in found if f[2] == line]
    if on_line:
        return on_line[0][1], on_line[0][2]
    scalar_error = SCALAR_TO in message
    best = next((f for f in found if (f[0] == "scalar") == scalar_error), found[0])
    return best[1], best[2]


def _constructs(tree: ast.Module) -> list[tuple[str, str, int]]:
    """(kind, what, line) of every construct the interpreter cannot run, in source order: calls to
    libdevice functions at their call (the import when none is called)."""
    kernels = [fn for fn in kernel_source.kernels(tree) if isinstance(fn, ast.FunctionDef)]
    scalars = {a.arg for fn in kernels for a in fn.args.args if not a.arg.endswith("_ptr") and a.annotation is None}
    libdevice_names, libdevice_imports = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and "libdevice" in (node.module or ""):
            libdevice_names.update(a.asname or a.name for a in node.names)
            libdevice_imports.append(("libdevice", "libdevice functions", node.lineno))
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and "libdevice" in ast.unparse(node):
            libdevice_names.add("libdevice")
            libdevice_imports.append(("libdevice", "libdevice functions", node.lineno))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "to" and isinstance(node.value, ast.Name) \
                and node.value.id in scalars:
            found.append(("scalar", f"`{node.value.id}.to(...)` on a scalar argument (a Python number there)", node.lineno))
        elif isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            if (isinstance(node.func, ast.Name) and callee in libdevice_names) or "libdevice." in callee:
                found.append(("libdevice", f"the libdevice function `{callee}`", node.lineno))
            elif callee.endswith("inline_asm_elementwise") or ".extra." in callee:
                found.append(("asm", f"`{callee}`", node.lineno))
    if not any(kind == "libdevice" for kind, _, _ in found):
        found += libdevice_imports[:1]
    return sorted(found, key=lambda f: f[2])

