"""What a target's host code runs: its kernels and the device helpers they call, its host
functions and methods, which of them refers to which, and the kernels that the forward path of
its entry point can launch.

A target is a module whose entry point (`run`, the function a spec's ENTRY names, or what a
spec's `entry(target, **inputs)` adapter reads of the module) calls host code that launches
kernels: directly (`kernel[grid](...)`), through host helpers (`rms_norm_forward(...)`), and
through a `torch.autograd.Function` (`Fn.apply(...)` runs `Fn.forward`). A forward call never
runs `Fn.backward`, so kernels that only the backward pass launches are not on the forward path.

The reading is static and errs on the side of reaching: a reference to a module function, class
or kernel anywhere in reached code counts as a call or a launch (a kernel picked by a branch, or
held in a variable, is reached). Without an entry point it starts from `run` when the module has
one, else from every class's `forward` and every host function that no other code refers to.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from loop.common import kernel_source
from playbook.cst.aliases import Aliases, decorator_name

DEFAULT_ENTRY = "run"
NEVER_FOLLOWED = {"backward", "setup_context", "jvp", "vmap"}  # methods a forward call does not run


def _device(fn: cst.FunctionDef, al: Aliases) -> bool:
    return any(kernel_source.is_device_decorator(decorator_name(d, al)) for d in fn.decorators)


def device_functions(module: cst.Module, al: Aliases) -> dict[str, cst.FunctionDef]:
    """Every module-level kernel (`loop.common.kernel_source`'s rule: @triton.jit, @ct.kernel) and
    @ct.function: code that runs on the device."""
    return {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef) and _device(s, al)}


class _Refs(cst.CSTVisitor):
    """The names code reads (not attribute names, keywords or parameters), and `base.attr` pairs."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.attrs: set[tuple[str, str]] = set()
        self.called: set[str] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if isinstance(node.value, cst.Name):
            self.attrs.add((node.value.value, node.attr.value))
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        if node.default is not None:
            node.default.visit(self)
        return False

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name):
            self.called.add(node.func.value)

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


def refs(node: cst.CSTNode) -> _Refs:
    found = _Refs()
    node.visit(found)
    return found


def helper_calls(fns: dict[str, cst.FunctionDef]) -> dict[str, set[str]]:
    """For each device function, the device functions it calls by name."""
    return {name: refs(fn.body).called & set(fns) for name, fn in fns.items()}


def split_device(module: cst.Module, al: Aliases) -> tuple[dict[str, cst.FunctionDef], dict[str, cst.FunctionDef]]:
    """(kernels, helpers) of the module's device functions: a helper is one that device code calls
    and no host code refers to (`silu` under @triton.jit, called from a kernel); every other one
    is a kernel, launched from the host."""
    device = device_functions(module, al)
    called = set().union(set(), *helper_calls(device).values())
    host_refs: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value in device:
            continue
        host_refs |= refs(stmt).names
    helpers = {n: f for n, f in device.items() if n in called and n not in host_refs}
    return {n: f for n, f in device.items() if n not in helpers}, helpers


def reached_helpers(kernels: list[cst.FunctionDef], helpers: dict[str, cst.FunctionDef]) -> dict[str, cst.FunctionDef]:
    """The helpers the given kernels call, directly or through other helpers."""
    out: dict[str, cst.FunctionDef] = {}
    todo = [refs(k.body).called for k in kernels]
    while todo:
        for name in todo.pop() & set(helpers):
            if name not in out:
                out[name] = helpers[name]
                todo.append(refs(helpers[name].body).called)
    return out


# ----------------------------------------------------------------------------------- host code


@dataclass(frozen=True)
class Host:
    """The module's host code: functions by qualified name (`f`, `Cls.method`), classes, and
    module-level names bound to expressions (`op = Fn.apply`)."""
    functions: dict[str, cst.FunctionDef]
    classes: dict[str, cst.ClassDef]
    aliases: dict[str, cst.BaseExpression]


def host_code(module: cst.Module, device: set[str]) -> Host:
    functions: dict[str, cst.FunctionDef] = {}
    classes: dict[str, cst.ClassDef] = {}
    aliases: dict[str, cst.BaseExpression] = {}
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value not in device:
            functions[stmt.name.value] = stmt
        elif isinstance(stmt, cst.ClassDef):
            classes[stmt.name.value] = stmt
            for item in stmt.body.body:
                if isinstance(item, cst.FunctionDef):
                    functions[f"{stmt.name.value}.{item.name.value}"] = item
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                        and isinstance(small.targets[0].target, cst.Name):
                    aliases[small.targets[0].target.value] = small.value
    return Host(functions, classes, aliases)


def _class_entry(host: Host, cls: str) -> list[str]:
    """What calling a class runs: its `forward` (an autograd Function's apply, a module's call),
    else its `__call__`."""
    for method in ("forward", "__call__"):
        if f"{cls}.{method}" in host.functions:
            return [f"{cls}.{method}"]
    return []


def _resolve(host: Host, name: str, seen: set[str] | None = None) -> list[str]:
    """The host functions a name stands for: a function, a class (its forward), `Cls.method`, or a
    module-level alias (what its expression refers to: `op = Fn.apply` stands for Fn.forward)."""
    seen = seen if seen is not None else set()
    if name in seen:
        return []
    seen.add(name)
    if name in host.functions and name.split(".")[-1] not in NEVER_FOLLOWED:
        return [name]
    if name in host.classes:
        return _class_entry(host, name)
    if name in host.aliases:
        return [q for n in sorted(refs(host.aliases[name]).names) for q in _resolve(host, n, seen)]
    return []


def _edges(host: Host, qualname: str, kernels: set[str]) -> tuple[set[str], set[str]]:
    """(host functions, kernels) that the function `qualname` refers to: names of functions,
    classes and aliases, and `self.method` / `cls.method` within its class."""
    fn = host.functions[qualname]
    cls = qualname.split(".")[0] if "." in qualname else None
    r = refs(fn.body)
    out: set[str] = set()
    for name in r.names:
        out.update(_resolve(host, name))
    for base, attr in r.attrs:
        if cls is not None and base in ("self", "cls"):
            out.update(_resolve(host, f"{cls}.{attr}"))
    launched = r.names & kernels
    for name in r.names & set(host.aliases):  # a module-level table of kernels: `KERNELS = {"a": k1}`
        launched |= refs(host.aliases[name]).names & kernels
    return out, launched


@dataclass(frozen=True)
class ForwardPath:
    roots: tuple[str, ...]  # the host functions the reading started from
    functions: frozenset[str]  # the host functions and methods reached
    kernels: frozenset[str]  # the kernels reached: those the entry point's forward path can launch


BACKWARD_WORDS = ("backward", "bwd")  # a module's own word for its backward pass (rms_norm_backward, _rms_bwd)


def default_roots(host: Host) -> list[str]:
    """`run`; else every class's forward and every host function no other code refers to, but those
    that name themselves a backward pass (a library's `rms_norm_backward`: what tileloop times is the
    forward path, and a change to a kernel only a backward pass launches would go unmeasured)."""
    if DEFAULT_ENTRY in host.functions:
        return [DEFAULT_ENTRY]
    referred: set[str] = set()
    for fn in host.functions.values():
        referred |= refs(fn.body).names
    for value in host.aliases.values():
        referred |= refs(value).names
    roots = [q for q in host.functions if q.endswith(".forward")]
    return roots + [q for q in host.functions if "." not in q and q not in referred
                    and not any(word in q.lower() for word in BACKWARD_WORDS)]


def forward_path(module: cst.Module, al: Aliases, kernels: set[str], entry: tuple[str, ...] = ()) -> ForwardPath | None:
    """The kernels that the forward path of `entry` (names of the module; default: see
    `default_roots`) can launch; None when no root is found or no kernel is reached from the roots
    (then every kernel counts)."""
    host = host_code(module, set(device_functions(module, al)))
    roots = [q for name in entry for q in _resolve(host, name)] if entry else []
    if not roots:
        roots = default_roots(host)
    if not roots:
        return None
    reached: set[str] = set()
    launched: set[str] = set()
    todo = list(dict.fromkeys(roots))
    while todo:
        q = todo.pop()
        if q in reached:
            continue
        reached.add(q)
        callees, ks = _edges(host, q, kernels)
        launched |= ks
        todo.extend(callees - reached)
    if not launched:  # a reading that reaches no kernel tells nothing about which ones run
        return None
    return ForwardPath(tuple(dict.fromkeys(roots)), frozenset(reached), frozenset(launched))
