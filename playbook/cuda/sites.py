"""What the CUDA C recipes read of a target: the kernels on `solve`'s path, the block size of each
launch and where it is written (a literal, a `#define`, a `constexpr`, or a host local assigned a
literal once), and a kernel's pointer parameters with what the kernel does through them.

Read from the tree-sitter parse of `loop.common.cuda_tree`; a source it cannot read whole, or
without the pieces a recipe needs, is a `Skip` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from loop.common import cuda_tree as ct
from loop.common.errors import UserError
from playbook.analysis import Analysis
from playbook.cst.source import Skip

@dataclass(frozen=True)
class Target:
    """A parsed target: its source, what `solve` reaches, and the kernels a recipe may change."""

    cs: ct.CSource
    reach: ct.Reach
    kernels: dict[str, ct.Function]  # on the forward path, by name
    constants: dict[str, ct.Constant]

    def launches_of(self, kernel: str) -> list[ct.Launch]:
        return [launch for launch in self.reach.launches if launch.kernel == kernel]


def read(source: str, analysis: Analysis | None = None) -> Target:
    """The target as the recipes read it; Skip where it cannot be read or launches no kernel."""
    try:
        cs = ct.parse(source)
    except UserError as exc:
        raise Skip(f"{exc} ({ct.INSTALL_HINT})") from None
    bad = cs.errors()
    if bad:
        raise Skip(f"the CUDA C parser does not read line {bad[0]}: left alone")
    reach = ct.reach(cs)
    if not reach.hosts:
        raise Skip(f"no {ct.ENTRY}() is defined: nothing launches a kernel")
    every = ct.kernels(cs)
    launched = {name: every[name] for name in sorted(reach.kernels) if name in every}
    if not launched:
        raise Skip(f"{ct.ENTRY}() launches no __global__ kernel defined in the file")
    on_path = {name: fn for name, fn in launched.items() if analysis is None or analysis.on_path(name)}
    return Target(cs, reach, on_path, ct.constants(cs))


# ---------------------------------------------------------------------------------------- block size


@dataclass(frozen=True)
class BlockSite:
    """Where a launch's threads per block is written: the node holding the value and what it is."""

    value: int
    node: object  # the literal (at the launch, in the #define, the constexpr or the host local)
    how: str  # "literal", "define", "constexpr" or "local"
    name: str | None  # the constant's or local's name

    @property
    def label(self) -> str:
        return self.name or "threads per block"


def _local_literal(cs: ct.CSource, host: ct.Function, name: str, before: int) -> object | None:
    """The literal a host local `name` is initialised with, where it is declared once before byte
    `before` and never assigned again; None otherwise."""
    inits, assigned = [], False
    for n in ct.walk(host.body):
        if n.type == "init_declarator" and ct.child(n, "identifier") is not None \
                and cs.text(n.child_by_field_name("declarator")) == name:
            inits.append(n.child_by_field_name("value"))
        elif n.type in ("assignment_expression", "update_expression"):
            target = n.child_by_field_name("left") or n.child_by_field_name("argument")
            if target is not None and cs.text(target) == name:
                assigned = True
        elif n.type == "pointer_expression" and cs.text(n) == f"&{name}":
            assigned = True
    if assigned or len(inits) != 1 or inits[0] is None or inits[0].start_byte > before:
        return None
    return inits[0] if inits[0].type == "number_literal" else None


def block_site(t: Target, launch: ct.Launch) -> BlockSite | None:
    """The launch's block size where it is a literal, a file constant or a host local set once to a
    literal; None where it is computed (or a dim3)."""
    node, cs = launch.block, t.cs
    if node.type == "number_literal":
        value = ct.int_value(cs, node)
        return None if value is None else BlockSite(value, node, "literal", None)
    if node.type != "identifier":
        return None
    name = cs.text(node)
    if name in t.constants:
        c = t.constants[name]
        how = "define" if c.node.type == "preproc_arg" else "constexpr"
        return BlockSite(c.value, c.node, how, name)
    host = ct.functions(cs)[launch.host]
    literal = _local_literal(cs, host, name, launch.call.start_byte)
    value = ct.int_value(cs, literal) if literal is not None else None
    return None if value is None else BlockSite(value, literal, "local", name)


def set_value(t: Target, site: BlockSite, value: int) -> ct.Edit:
    """The edit that writes `value` where `site` holds its number (a #define's text keeps its spacing)."""
    text = t.cs.text(site.node)
    old = str(site.value)
    at = text.find(old)
    start = site.node.start_byte + len(text[:at].encode())
    return ct.Edit(start, start + len(old), str(value))


# --------------------------------------------------------------------------------- pointer parameters


@dataclass(frozen=True)
class Pointer:
    """A kernel's pointer parameter."""

    name: str
    element: str  # the pointed-to type, qualifiers dropped: "float", "__half"
    const: bool
    restrict: bool
    param: object  # the parameter_declaration
    star: object  # the `*` of its pointer_declarator


def pointers(cs: ct.CSource, fn: ct.Function) -> list[Pointer]:
    """The pointer parameters of `fn` that point to one element type (one level of pointer)."""
    out = []
    for p in fn.params.named_children:
        decl = p.child_by_field_name("declarator") if p.type == "parameter_declaration" else None
        if decl is None or decl.type != "pointer_declarator":
            continue
        inner = decl.child_by_field_name("declarator")
        if inner is None or inner.type != "identifier":
            continue  # a pointer to a pointer, a function pointer
        quals = {cs.text(q) for q in p.children if q.type == "type_qualifier"}
        own = {cs.text(q) for q in decl.children if q.type == "type_qualifier"}
        element = cs.text(p.child_by_field_name("type"))
        out.append(Pointer(cs.text(inner), element, "const" in quals, bool({"__restrict__", "__restrict"} & own),
                           p, ct.child(decl, "*")))
    return out


def derived(cs: ct.CSource, fn: ct.Function, names: set[str]) -> dict[str, str]:
    """Locals of `fn` initialised from a parameter in `names` (`float* dst = out + row * cols;`), mapped
    to that parameter; the parameters map to themselves."""
    out = {n: n for n in names}
    for n in ct.walk(fn.body):
        if n.type != "init_declarator":
            continue
        decl, value = n.child_by_field_name("declarator"), n.child_by_field_name("value")
        if decl is None or value is None or decl.type != "pointer_declarator":
            continue
        ids = {cs.text(i) for i in ct.walk(value) if i.type == "identifier"} & set(out)
        local = decl.child_by_field_name("declarator")
        if len(ids) == 1 and local is not None and local.type == "identifier":
            out[cs.text(local)] = out[ids.pop()]
    return out


def _base_name(cs: ct.CSource, node) -> str | None:
    """The pointer a store goes through: `p[i]` and `*(p + i)` -> p."""
    while node is not None and node.type in ("parenthesized_expression", "subscript_expression", "pointer_expression",
                                               "binary_expression", "cast_expression"):
        node = (node.child_by_field_name("argument") or node.child_by_field_name("left")
                or node.child_by_field_name("value") or (node.named_children[0] if node.named_children else None))
    return cs.text(node) if node is not None and node.type == "identifier" else None


def written(cs: ct.CSource, fn: ct.Function, names: set[str]) -> set[str]:
    """The parameters of `names` the kernel may write through: a store through one (or a local derived
    from it), or one handed to any call (an atomic, a device function, a cast)."""
    alias = derived(cs, fn, names)
    out = set()
    for n in ct.walk(fn.body):
        if n.type in ("assignment_expression", "update_expression"):
            target = n.child_by_field_name("left") or n.child_by_field_name("argument")
            base = _base_name(cs, target) if target is not None and target.type != "identifier" else None
            if base in alias:
                out.add(alias[base])
        elif n.type == "argument_list":
            for arg in n.named_children:
                if arg.type == "pointer_expression" and cs.text(arg).startswith("&"):
                    arg = arg.child_by_field_name("argument")
                out |= {alias[name] for name in _pointer_names(cs, arg) if name in alias}
    return out


def _pointer_names(cs: ct.CSource, arg) -> set[str]:
    """The names an argument may hand on as a pointer: `p`, `p + i`, `(T*)p`; not an element (`p[i]`)
    nor a call's result."""
    if arg is None or arg.type in ("subscript_expression", "call_expression", "number_literal", "field_expression"):
        return set()
    if arg.type == "identifier":
        return {cs.text(arg)}
    return set().union(*(_pointer_names(cs, c) for c in arg.named_children)) if arg.named_children else set()
