"""The module's import aliases of triton, triton.language and cuda.tile, and attributes, calls and
decorators read through them (`tl.load`, `ct.bid(0)`, `@tr.jit` as triton.jit)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from playbook.cst.source import walk


@dataclass(frozen=True)
class Aliases:
    triton: str | None  # `import triton` -> "triton"
    tl: str | None  # `import triton.language as tl` -> "tl"
    ct: str | None  # `import cuda.tile as ct` -> "ct"
    # other names bound to triton's and cuda.tile's modules and functions, for reading decorators:
    # `from triton import jit` -> ("jit", "triton.jit"), `import triton.runtime` -> ("triton", "triton")
    names: tuple[tuple[str, str], ...] = ()


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def _ours(dotted: str) -> bool:
    return dotted.split(".")[0] == "triton" or dotted == "cuda.tile" or dotted.startswith("cuda.tile.")


def aliases(module: cst.Module) -> Aliases:
    found: dict[str, str] = {}
    names: dict[str, str] = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom):
                _from_names(small, names)
            if not isinstance(small, cst.Import):
                continue
            for name in small.names:
                dotted = _dotted(name.name)
                if name.asname is not None and isinstance(name.asname.name, cst.Name):
                    local = name.asname.name.value
                elif dotted and "." not in dotted:
                    local = dotted
                else:
                    if dotted and _ours(dotted):
                        names[dotted.split(".")[0]] = dotted.split(".")[0]
                    continue  # `import a.b` binds `a`, not `a.b`: not an alias we can use
                if dotted in ("triton", "triton.language", "cuda.tile"):
                    found[dotted] = local
                elif dotted and _ours(dotted):
                    names[local] = dotted
    return Aliases(found.get("triton"), found.get("triton.language"), found.get("cuda.tile"), tuple(sorted(names.items())))


def _from_names(node: cst.ImportFrom, names: dict[str, str]) -> None:
    """`from triton import jit` (or `as j`) -> names["jit"] = "triton.jit"."""
    module = _dotted(node.module) if node.module is not None and not node.relative else None
    if not module or not _ours(module) or isinstance(node.names, cst.ImportStar):
        return
    for alias in node.names:
        local = alias.asname.name if alias.asname is not None else alias.name
        if isinstance(local, cst.Name) and isinstance(alias.name, cst.Name):
            names[local.value] = f"{module}.{alias.name.value}"


def is_attr(node: cst.BaseExpression, base: str | None, *attrs: str) -> bool:
    """`node` is `base.attr` for one of `attrs` (base is a module alias)."""
    return (base is not None and isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)
            and node.value.value == base and node.attr.value in attrs)


def decorator_name(dec: cst.Decorator, al: Aliases) -> str:
    """The dotted name of a decorator read through the module's aliases (`@tr.jit` with `import
    triton as tr` -> "triton.jit"); "" when it is not read through one of them."""
    parts: list[str] = []
    node = dec.decorator.func if isinstance(dec.decorator, cst.Call) else dec.decorator
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    modules = {**dict(al.names), al.triton: "triton", al.tl: "triton.language", al.ct: "cuda.tile"}
    if not isinstance(node, cst.Name) or node.value not in modules:
        return ""
    return ".".join([modules[node.value], *reversed(parts)])


def is_call(node: cst.CSTNode, base: str | None, *attrs: str) -> bool:
    return isinstance(node, cst.Call) and is_attr(node.func, base, *attrs)


def calls(node: cst.CSTNode, base: str | None, *attrs: str) -> list[cst.Call]:
    return [n for n in walk(node) if is_call(n, base, *attrs)]


def device_math(module: cst.Module) -> set[str]:
    """Local names the module binds to Triton's device functions or their modules, by imports
    anywhere in it (also inside `try`/`if`): `from triton.language.extra.libdevice import rsqrt`,
    `from triton.language.extra import libdevice`, `import triton.language.extra.cuda.libdevice as ld`."""
    out: set[str] = set()
    for node in walk(module):
        if isinstance(node, cst.FunctionDef):
            continue
        if isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative:
            if (_dotted(node.module) or "").startswith("triton.language") \
                    and not isinstance(node.names, cst.ImportStar):
                for name in node.names:
                    local = name.asname.name if name.asname is not None else name.name
                    if isinstance(local, cst.Name):
                        out.add(local.value)
        elif isinstance(node, cst.Import):
            for name in node.names:
                dotted = _dotted(name.name) or ""
                if dotted.startswith("triton.language.") and name.asname is not None \
                        and isinstance(name.asname.name, cst.Name):
                    out.add(name.asname.name.value)
    return out


def root_name(node: cst.BaseExpression) -> str | None:
    """The name an attribute chain starts from: `tl.extra.cuda.libdevice.rsqrt` -> tl."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None
