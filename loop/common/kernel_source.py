"""What a kernel file's source says, read with `ast` and never run: its kernels, the launches of
them, the forward call graph among its module functions, and the entry point its spec names.

A *kernel* is a function decorated, through the module's imports, by `triton.jit`,
`triton.autotune`, `triton.heuristics` (any `triton.*` module's jit/autotune/heuristics) or
`cuda.tile.kernel`; a *device function* is a kernel or a `cuda.tile.function`. Decorators are read
through aliases: `import triton as tr` makes `@tr.jit` a kernel, `from triton import jit` makes
`@jit` one; `@numba.jit` or a local `jit` is not. Where the module does not import them (a
fragment), `triton` and `ct` read as triton and cuda.tile. A *launch* is a Triton launch, the call
of a subscript `kernel[grid](...)`, or a cuTile launch `ct.launch(stream, grid, kernel, args)`
(`cuda.tile.launch` read through the imports, its arguments by position: `CUTILE_LAUNCH_ARGS`).

A TileLang kernel is a function `@tilelang.jit` decorates (also under `@tilelang.autotune`): in the
lazy form it returns a `@T.prim_func` (`tilelang.language.prim_func`, device code, as a `T.macro`
is) and its call compiles, in the eager form (no `T.prim_func` inside) its call compiles and runs.
A TileLang launch (`tilelang_launches`) is a call that runs the compiled kernel: `kernel(...)(args)`,
a name bound to `kernel(...)` in the same function called (`k = kernel(M, N); k(a, b)`), or an
eager kernel called.

The spec's entry point is what the worker calls (`loop.common.spec`): the spec's `entry` when it
binds one at module level (an adapter `entry(target, **inputs)`, or any name bound to `entry`),
else the target's function its last `ENTRY` names (default `run`).

The orchestrator's checks, the worker and the playbook all read a target through this module.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

DEFAULT_ENTRY = "run"
TRITON_DECORATORS = ("jit", "autotune", "heuristics")
FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef)
CUTILE_KERNEL, CUTILE_FUNCTION = "cuda.tile.kernel", "cuda.tile.function"
CUTILE_LAUNCH = "cuda.tile.launch"
CUTILE_LAUNCH_ARGS = ("stream", "grid", "kernel", "args")  # ct.launch's arguments, by position
CONVENTIONAL = {"ct": "cuda.tile"}  # what a name no import binds reads as
TILELANG_KERNELS = ("tilelang.jit", "tilelang.jit.jit")  # the decorator of a TileLang kernel
TILELANG_DEVICE = ("tilelang.language.prim_func", "tilelang.language.macro")  # TileLang device code in a kernel


def imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it is bound to, for every import of the module: `import
    triton.language as tl` -> {"tl": "triton.language"}, `import triton.language` -> {"triton":
    "triton"}, `from triton import jit` -> {"jit": "triton.jit"}."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    out[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def dotted(node: ast.AST, imports: dict[str, str]) -> str:
    """The dotted name an expression reads, its first name resolved through the imports:
    `tr.jit` with `import triton as tr` -> "triton.jit"; "" for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([imports.get(node.id, CONVENTIONAL.get(node.id, node.id)), *reversed(parts)])


def decorator_name(dec: ast.expr, imports: dict[str, str]) -> str:
    """The dotted name of a decorator, called (`@triton.autotune(...)`) or not."""
    return dotted(dec.func if isinstance(dec, ast.Call) else dec, imports)


def triton_decorator(name: str) -> str:
    """"jit", "autotune" or "heuristics" for a dotted name that is that decorator of triton (of any
    of its modules: `triton.runtime.jit`); "" otherwise."""
    head, _, last = name.rpartition(".")
    return last if head.split(".")[0] == "triton" and last in TRITON_DECORATORS else ""


def is_kernel_decorator(name: str) -> bool:
    """`triton.jit`, `triton.autotune`, `triton.heuristics` (of any triton module), `cuda.tile.kernel`
    or `tilelang.jit`."""
    return bool(triton_decorator(name)) or name == CUTILE_KERNEL or name in TILELANG_KERNELS


def is_kernel(fn: ast.AST, imports: dict[str, str]) -> bool:
    """A function that a kernel decorator, read through the imports, decorates."""
    return isinstance(fn, FUNCTION) and any(is_kernel_decorator(decorator_name(d, imports)) for d in fn.decorator_list)


def is_device_decorator(name: str) -> bool:
    """A kernel decorator, `cuda.tile.function` (a cuTile helper that runs on the device), or TileLang's
    `T.prim_func` / `T.macro`."""
    return is_kernel_decorator(name) or name == CUTILE_FUNCTION or name in TILELANG_DEVICE


def is_device(fn: ast.AST, imports: dict[str, str]) -> bool:
    """A kernel, or a `cuda.tile.function` (a cuTile helper that runs on the device)."""
    return isinstance(fn, FUNCTION) and any(is_device_decorator(decorator_name(d, imports)) for d in fn.decorator_list)


def functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The module-level functions by name."""
    return {n.name: n for n in tree.body if isinstance(n, FUNCTION)}


def kernels(tree: ast.Module, nested: bool = False) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The module's kernels in source order: module-level ones, or with `nested` also those defined
    in functions and classes (two of one name are both kept)."""
    imports = imported_names(tree)
    return [n for n in (ast.walk(tree) if nested else tree.body) if is_kernel(n, imports)]


def device_functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The module-level kernels and cuTile device functions by name."""
    imports = imported_names(tree)
    return {n.name: n for n in tree.body if is_device(n, imports)}


def is_launch(call: ast.Call) -> bool:
    """A Triton launch: the call of a subscript, `kernel[grid](...)`."""
    return isinstance(call.func, ast.Subscript)


def is_cutile_launch(call: ast.Call, imports: dict[str, str]) -> bool:
    """A cuTile launch: `ct.launch(stream, grid, kernel, args)`, read through the imports, with every
    positional argument there."""
    return dotted(call.func, imports) == CUTILE_LAUNCH and len(call.args) >= len(CUTILE_LAUNCH_ARGS) \
        and not any(isinstance(a, ast.Starred) for a in call.args[:len(CUTILE_LAUNCH_ARGS)])


def launch_argument(call: ast.Call, role: str) -> ast.expr:
    """The argument of a cuTile launch in `role` (one of `CUTILE_LAUNCH_ARGS`)."""
    return call.args[CUTILE_LAUNCH_ARGS.index(role)]


def _name_of(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def launched(call: ast.Call, imports: dict[str, str] | None = None) -> str:
    """The kernel a launch runs: `kernel[grid](...)` (or `mod.kernel[grid](...)`), and with the
    module's `imports`, `ct.launch(stream, grid, kernel, args)` too; "" for other calls."""
    if is_launch(call):
        return _name_of(call.func.value)
    if imports is not None and is_cutile_launch(call, imports):
        return _name_of(launch_argument(call, "kernel"))
    return ""


def tilelang_kernels(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The module-level TileLang kernels (`@tilelang.jit`, read through the imports) by name."""
    imports = imported_names(tree)
    return {n.name: n for n in tree.body if isinstance(n, FUNCTION)
            and any(decorator_name(d, imports) in TILELANG_KERNELS for d in n.decorator_list)}


def is_eager(kernel: ast.AST, imports: dict[str, str]) -> bool:
    """A TileLang kernel of the eager form: it defines no `T.prim_func` (its call compiles and runs)."""
    return not any(isinstance(n, FUNCTION) and n is not kernel and any(
        decorator_name(d, imports) == TILELANG_DEVICE[0] for d in n.decorator_list) for n in ast.walk(kernel))


def tilelang_launches(tree: ast.Module) -> list[tuple[ast.Call, str]]:
    """(call, kernel) for every TileLang launch of the module (see the module's doc): `kernel(...)(args)`,
    a name bound to `kernel(...)` in the same function and called, an eager kernel called. A name
    bound to a compiled kernel is read within its function only (module level is one scope)."""
    imports = imported_names(tree)
    kernels = tilelang_kernels(tree)
    eager = {name for name, fn in kernels.items() if is_eager(fn, imports)}
    out: list[tuple[ast.Call, str]] = []
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, FUNCTION) and n.name not in kernels)]
    for scope in scopes:
        body = [n for stmt in scope.body if not isinstance(stmt, (*FUNCTION, ast.ClassDef))
                for n in _walk_scope(stmt)]
        bound = {t.id: n.value.func.id for n in body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                 and isinstance(n.value.func, ast.Name) and n.value.func.id in kernels
                 for t in n.targets if isinstance(t, ast.Name)}
        for call in (n for n in body if isinstance(n, ast.Call)):
            inner = call.func
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id in kernels:
                out.append((call, inner.func.id))
            elif isinstance(inner, ast.Name) and (inner.id in bound or inner.id in eager):
                out.append((call, bound.get(inner.id, inner.id)))
    return out


def _walk_scope(node: ast.AST):
    """The nodes of one scope: `ast.walk` that does not enter nested functions, classes or lambdas."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (*FUNCTION, ast.ClassDef, ast.Lambda)):
            yield from _walk_scope(child)


def called(fn: ast.AST, names: set[str]) -> set[str]:
    """The names of `names` that `fn` calls by name (`helper(...)`)."""
    return {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names}


def reached(tree: ast.Module, roots: list[str]) -> set[str]:
    """The module-level functions that `roots` call by name, directly or through others, roots included."""
    fns = functions(tree)
    out: set[str] = set()
    frontier = [name for name in roots if name in fns]
    while frontier:
        name = frontier.pop()
        if name not in out:
            out.add(name)
            frontier += called(fns[name], set(fns))
    return out


# ----------------------------------------------------------------------------- the spec's entry point


@dataclass(frozen=True)
class Entry:
    """How a spec calls its target: through an adapter `entry(target, **inputs)` (`adapter`), whose
    `names` are the attributes it reads of its first parameter (empty when it is no function of the
    spec's own), or through the target's function `names[0]` (ENTRY, default `run`)."""

    adapter: bool
    names: tuple[str, ...]


def _binds(node: ast.stmt, name: str) -> bool:
    if isinstance(node, FUNCTION + (ast.ClassDef,)):
        return node.name == name
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
        if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
    return any(isinstance(t, ast.Name) and t.id == name for t in targets)


def _adapter_names(fn: ast.AST) -> tuple[str, ...]:
    """The attributes an adapter function reads of its first parameter (the target module)."""
    if not isinstance(fn, FUNCTION):
        return ()
    params = [*fn.args.posonlyargs, *fn.args.args]
    if not params:
        return ()
    target = params[0].arg
    return tuple(sorted({n.attr for stmt in fn.body for n in ast.walk(stmt) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == target}))


def spec_entry(tree: ast.Module) -> Entry:
    """The entry point a spec's module-level code names (see the module's doc): the last binding of
    `entry`, else the last string literal bound to `ENTRY`, as when the spec runs."""
    adapter = [node for node in tree.body if _binds(node, "entry")]
    if adapter:
        return Entry(True, _adapter_names(adapter[-1]))
    name = DEFAULT_ENTRY
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _binds(node, "ENTRY") and node.value is not None:
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                name = node.value.value
    return Entry(False, (name,))


def spec_entry_of(source: str) -> Entry | None:
    """`spec_entry` of a spec's source; None when it does not parse."""
    try:
        return spec_entry(ast.parse(source))
    except SyntaxError:
        return None
