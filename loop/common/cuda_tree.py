"""A CUDA C source as a parse tree, and what is read of it: its `__global__` kernels, the
`<<<grid, block>>>` launches of its host functions, the host functions and kernels `solve` reaches,
its integer constants (`#define N 256`, `constexpr int N = 256;`), and edits of byte ranges that
leave the rest of the file exactly as written.

The parser is tree-sitter with the tree-sitter-cuda grammar (the `cuda` extra), imported when a
source is first parsed, so nothing that never reads CUDA C needs it. The playbook's analysis and its
CUDA C recipes read a source through this one module (the Python languages' counterpart is
`kernel_source`). Offsets are byte offsets into the UTF-8 source, as tree-sitter gives them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

from loop.common.errors import UserError

INSTALL_HINT = "pip install -e '.[cuda]'"
ENTRY = "solve"

Node = Any  # a tree_sitter.Node


@lru_cache(maxsize=1)
def _parser() -> Any:
    try:
        import tree_sitter
        import tree_sitter_cuda
    except ImportError:
        raise UserError("reading CUDA C needs tree-sitter and its CUDA grammar (tree-sitter-cuda), not installed",
                        hint=INSTALL_HINT) from None
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))


def available() -> bool:
    """Whether CUDA C sources can be parsed here."""
    try:
        _parser()
    except UserError:
        return False
    return True


@dataclass(frozen=True)
class CSource:
    """A parsed CUDA C source: its bytes and its tree's root."""

    data: bytes
    root: Node

    def text(self, node: Node) -> str:
        return self.data[node.start_byte:node.end_byte].decode()

    def line(self, node: Node) -> int:
        return node.start_point[0] + 1

    def errors(self) -> list[int]:
        """The lines where the parser found no valid C++ (empty for a source it reads whole)."""
        return sorted({self.line(n) for n in walk(self.root) if n.type == "ERROR" or n.is_missing})


_CACHE: dict[str, CSource] = {}


def parse(source: str) -> CSource:
    """The parse of `source` (the last few kept: every recipe reads the same source in turn)."""
    hit = _CACHE.get(source)
    if hit is None:
        data = source.encode()
        hit = CSource(data, _parser().parse(data).root_node)
        if len(_CACHE) > 16:
            _CACHE.clear()
        _CACHE[source] = hit
    return hit


def walk(node: Node) -> Iterator[Node]:
    """`node` and every node under it, in source order."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def child(node: Node, kind: str) -> Node | None:
    return next((c for c in node.children if c.type == kind), None)


# ----------------------------------------------------------------------------------------- functions


@dataclass(frozen=True)
class Function:
    """A function definition: its name, its node, and whether it is a kernel (`__global__`) or device code."""

    name: str
    node: Node
    space: str  # "global", "device" or "host"

    @property
    def body(self) -> Node:
        return self.node.child_by_field_name("body")

    @property
    def declarator(self) -> Node:
        return _function_declarator(self.node)

    @property
    def params(self) -> Node:
        return self.declarator.child_by_field_name("parameters")


def _function_declarator(fn: Node) -> Node | None:
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    return decl


def functions(cs: CSource) -> dict[str, Function]:
    """Every function defined in the source (templates and `extern "C"` blocks included), by name."""
    out: dict[str, Function] = {}
    for node in walk(cs.root):
        if node.type != "function_definition":
            continue
        decl = _function_declarator(node)
        name = decl.child_by_field_name("declarator") if decl is not None else None
        if name is None:
            continue
        kinds = {c.type for c in node.children}
        space = "global" if "__global__" in kinds else "device" if "__device__" in kinds and "__host__" not in kinds \
            else "host"
        out.setdefault(cs.text(name), Function(cs.text(name), node, space))
    return out


def kernels(cs: CSource) -> dict[str, Function]:
    return {name: f for name, f in functions(cs).items() if f.space == "global"}


def called(cs: CSource, node: Node) -> list[str]:
    """The names of the functions `node` calls, in order (`wmma::mma_sync` -> mma_sync, `k<4>(...)` -> k)."""
    out = []
    for n in walk(node):
        if n.type == "call_expression":
            fn = n.child_by_field_name("function")
            if fn is not None and fn.type == "template_function":
                fn = fn.child_by_field_name("name")
            if fn is not None and fn.type == "qualified_identifier":
                fn = next((c for c in reversed(fn.children) if c.type == "identifier"), fn)
            if fn is not None and fn.type == "identifier":
                out.append(cs.text(fn))
    return out


# ------------------------------------------------------------------------------------------ launches


@dataclass(frozen=True)
class Launch:
    """`kernel<<<grid, block[, shared[, stream]]>>>(args)` in host function `host`."""

    kernel: str
    host: str
    call: Node
    config: tuple[Node, ...]  # grid, block, shared memory, stream (as many as given)
    args: tuple[Node, ...]

    @property
    def grid(self) -> Node:
        return self.config[0]

    @property
    def block(self) -> Node:
        return self.config[1]


def launches(cs: CSource, host: Function) -> list[Launch]:
    """The kernel launches in `host`'s body, in source order."""
    out = []
    for n in walk(host.body):
        syntax = child(n, "kernel_call_syntax") if n.type == "call_expression" else None
        if syntax is None:
            continue
        fn = n.child_by_field_name("function")
        if fn.type == "template_function":
            fn = fn.child_by_field_name("name")
        config = tuple(c for c in syntax.children if c.is_named and c.type != "comment")
        args = tuple(c for c in n.child_by_field_name("arguments").children if c.is_named and c.type != "comment")
        if len(config) >= 2:
            out.append(Launch(cs.text(fn), host.name, n, config, args))
    return out


@dataclass(frozen=True)
class Reach:
    """What the entry point runs: its host functions (itself first) and the kernels they launch."""

    hosts: tuple[str, ...]
    kernels: frozenset[str]
    launches: tuple[Launch, ...]


def reach(cs: CSource, entry: str = ENTRY) -> Reach:
    """The host functions `entry` calls (transitively) and the launches in them; nothing when the
    source defines no `entry`."""
    fns = functions(cs)
    if entry not in fns:
        return Reach((), frozenset(), ())
    order, todo = [], [entry]
    while todo:
        name = todo.pop(0)
        if name in order or name not in fns or fns[name].space != "host":
            continue
        order.append(name)
        todo.extend(called(cs, fns[name].body))
    found = [launch for name in order for launch in launches(cs, fns[name])]
    return Reach(tuple(order), frozenset(launch.kernel for launch in found), tuple(found))


def device_reach(cs: CSource, kernel_names: set[str] | frozenset[str]) -> list[Function]:
    """The kernels named and the `__device__` functions they call (transitively)."""
    fns = functions(cs)
    out: list[Function] = []
    todo = [n for n in kernel_names if n in fns]
    while todo:
        name = todo.pop(0)
        if any(f.name == name for f in out):
            continue
        out.append(fns[name])
        todo.extend(n for n in called(cs, fns[name].body) if n in fns and fns[n].space == "device")
    return out


# ----------------------------------------------------------------------------------------- constants


@dataclass(frozen=True)
class Constant:
    """An integer constant of the file: `#define NAME 256` or `constexpr int NAME = 256;` (the value's
    node is what an edit rewrites)."""

    name: str
    value: int
    node: Node


_INT = re.compile(r"\(?\s*(\d+)[uUlL]*\s*\)?")


def int_value(cs: CSource, node: Node, constants: dict[str, Constant] | None = None) -> int | None:
    """The value of an integer literal, or of a name of `constants`; None for anything else."""
    if node.type == "number_literal":
        m = re.fullmatch(r"(\d+)[uUlL]*", cs.text(node))
        return int(m.group(1)) if m else None
    if node.type == "parenthesized_expression" and node.named_child_count == 1:
        return int_value(cs, node.named_children[0], constants)
    if node.type == "identifier" and constants is not None and cs.text(node) in constants:
        return constants[cs.text(node)].value
    return None


def constants(cs: CSource) -> dict[str, Constant]:
    """The file-level integer constants, by name."""
    out: dict[str, Constant] = {}
    for node in cs.root.children:
        if node.type == "preproc_def":
            name, arg = node.child_by_field_name("name"), node.child_by_field_name("value")
            m = _INT.fullmatch(cs.text(arg).strip()) if arg is not None else None
            if name is not None and m:
                out[cs.text(name)] = Constant(cs.text(name), int(m.group(1)), arg)
        elif node.type == "declaration" and {"const", "constexpr"} & {cs.text(q) for q in node.children
                                                                     if q.type == "type_qualifier"}:
            for init in (c for c in node.children if c.type == "init_declarator"):
                name, value = init.child_by_field_name("declarator"), init.child_by_field_name("value")
                number = int_value(cs, value) if value is not None else None
                if name is not None and name.type == "identifier" and number is not None:
                    out[cs.text(name)] = Constant(cs.text(name), number, value)
    return out


# --------------------------------------------------------------------------------------------- edits


@dataclass(frozen=True)
class Edit:
    """Replace bytes [start, end) of the source with `text` (an insertion where start == end)."""

    start: int
    end: int
    text: str


def apply(cs: CSource, edits: list[Edit]) -> str:
    """The source with `edits` made (they must not overlap); every other byte as it was."""
    out, at = [], 0
    for e in sorted(edits, key=lambda e: (e.start, e.end)):
        if e.start < at:
            raise ValueError(f"overlapping edits at byte {e.start}")
        out += [cs.data[at:e.start], e.text.encode()]
        at = e.end
    out.append(cs.data[at:])
    return b"".join(out).decode()


def line_start(cs: CSource, node: Node) -> int:
    """The byte offset where `node`'s line begins."""
    return cs.data.rfind(b"\n", 0, node.start_byte) + 1


def indent(cs: CSource, node: Node) -> str:
    """The whitespace before `node` on its line."""
    start = line_start(cs, node)
    head = cs.data[start:node.start_byte].decode()
    return head[:len(head) - len(head.lstrip())]
