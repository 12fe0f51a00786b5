"""2-D pointer blocks of a Triton kernel, recognised structurally (libcst), for rewrites that move
tile accesses to another addressing scheme (tensor descriptors).

A block is `base + rows[:, None] * s0 + cols[None, :] * s1` over a pointer argument, with offset
vectors `start + tl.arange(0, BLOCK)` bound once at the top of the kernel, either named
(`p = ...`, optionally advanced by `p += STEP * s_d` in a `for v in range(...)` loop) or built in
the access itself. For each `tl.load`/`tl.store` of a block, `KernelBlocks.access` gives the
element offsets of the tile at that access and the tensor extents its mask implies, or raises
`Skip` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from playbook.cst.aliases import Aliases, is_call
from playbook.cst.kernels import is_constexpr, params
from playbook.cst.names import assign_of
from playbook.cst.source import Skip, walk
from playbook.triton.index_expressions import (bcast, bindings, code, conjuncts, free_names, multiple_of, norm,
                                               summands)

ONE_D = " is a 1-D access (the recipe rewrites 2-D tiles)"  # the Skip of an access that is not a tile


# ----------------------------------------------------------------------------------- pattern


@dataclass(frozen=True)
class Dim:
    index: str  # the 1-D offset vector (`offs_m`)
    start: str  # code of its first element (`pid_m * BLOCK_M`, or "0")
    block: str  # its length, a constexpr (`BLOCK_M`)
    stride: str  # the kernel parameter it is scaled by (`stride_am`)
    moves: bool = False  # whether the loop advances the block along this dimension
    aligned: bool = True  # whether `start` is a multiple of `block` (so descriptor offsets stay 16-byte aligned)


@dataclass
class Block:
    name: str  # the pointer-block variable (`a_ptrs`)
    base: str  # the pointer parameter it starts from (`a_ptr`)
    dims: tuple[Dim, Dim]
    statement: cst.SimpleStatementLine | None  # its definition, a statement of the kernel body (None: inline)
    increment: cst.SimpleStatementLine | None = None  # `p += STEP * s_d`, a statement of `loop`'s body
    loop: cst.For | None = None
    moved: str | None = None  # code of the offset the loop has added, at an access before the increment (`k0`)
    extents: tuple[str, str] | None = None
    accesses: dict = field(default_factory=dict)  # original tl.load/tl.store call -> its descriptor access
    anchor: cst.CSTNode | None = None  # inline block: the statement of the kernel body holding its access


class KernelBlocks:
    """Pattern matching over one kernel: pointer blocks, their advances, masks and extents."""

    def __init__(self, fn: cst.FunctionDef, al: Aliases):
        self.fn, self.tl = fn, al.tl
        ps = params(fn)
        self.params = {p.name.value for p in ps}
        self.constexprs = {p.name.value for p in ps if is_constexpr(p, al)}
        self.bound = bindings(fn)
        self.values: dict[str, cst.BaseExpression] = {}  # names bound exactly once, by `name = value`
        for node in walk(fn.body):
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                if self.bound[node.targets[0].target.value] == 1:
                    self.values[node.targets[0].target.value] = node.value
        self.top = {a[0]: s for s in fn.body.body if (a := assign_of(s))}  # `name = value` statements of the body
        self.parent: dict[cst.CSTNode, cst.CSTNode] = {}
        for node in walk(fn):
            for child in node.children:
                self.parent[child] = node

    def fixed(self, node: cst.BaseExpression) -> bool:
        """Literals, kernel arguments and module constants only, no calls: the same value anywhere in the kernel."""
        return (not any(isinstance(n, cst.Call) for n in walk(node))
                and all(self.bound[n] == 0 for n in free_names(node)))

    def settled(self, node: cst.BaseExpression) -> bool:
        """Like `fixed`, but names bound once (`pid_m = ...`) and program ids are allowed too."""
        return (all(is_call(n, self.tl, "program_id", "num_programs", "cdiv") for n in walk(node)
                    if isinstance(n, cst.Call))
                and all(self.bound[n] == 0 or (self.bound[n] == 1 and n not in self.params) for n in free_names(node)))

    def statement_in(self, node: cst.CSTNode, suite: cst.BaseSuite) -> cst.CSTNode | None:
        """The statement directly in `suite` that contains `node`, if any."""
        cur = node
        while cur in self.parent:
            if self.parent[cur] is suite:
                return cur
            cur = self.parent[cur]
        return None

    # ------------------------------------------------------------------ pointer blocks

    def offset_vector(self, index: cst.BaseExpression, stride: cst.BaseExpression, block: str) -> Dim:
        """`index` is `start + tl.arange(0, BLOCK)` bound once in the body; `stride` a kernel argument."""
        if not isinstance(index, cst.Name) or not isinstance(stride, cst.Name):
            raise Skip(f"{block}: its offsets are not `name[:, None] * stride_name`")
        if stride.value not in self.params or stride.value in self.constexprs or self.bound[stride.value]:
            raise Skip(f"{block}: `{stride.value}` is not a stride argument of the kernel")
        stmt = self.top.get(index.value)
        if stmt is None or self.bound[index.value] != 1:
            raise Skip(f"{block}: `{index.value}` is not assigned once at the top of the kernel (it moves in a loop?)")
        terms = summands(assign_of(stmt)[1])
        ranges = [t for t in terms if is_call(t, self.tl, "arange")]
        if len(ranges) != 1 or len(ranges[0].args) != 2 or norm(ranges[0].args[0].value) != "0":
            raise Skip(f"{block}: `{index.value}` is not `start + {self.tl}.arange(0, BLOCK)`")
        size = ranges[0].args[1].value
        if not (isinstance(size, cst.Integer) or isinstance(size, cst.Name) and size.value in self.constexprs):
            raise Skip(f"{block}: the length of `{index.value}` is not a constexpr")
        rest = [t for t in terms if t is not ranges[0]]
        if not all(self.settled(t) for t in rest):
            raise Skip(f"{block}: the start of `{index.value}` is not fixed for the program")
        return Dim(index.value, " + ".join(code(t) for t in rest) or "0", code(size), stride.value,
                   aligned=all(multiple_of(t, code(size)) for t in rest))

    def named_block(self, name: str) -> Block:
        """The block `name = base + ...` (a statement of the kernel body), with its loop advance if any."""
        stmt = self.top.get(name)
        incs = [n for n in walk(self.fn.body) if isinstance(n, cst.AugAssign) and isinstance(n.target, cst.Name)
                and n.target.value == name]
        if stmt is None or self.bound[name] != 1 + len(incs):
            raise Skip(f"`{name}` is not assigned once in the kernel body")
        blk = self.block(assign_of(stmt)[1], f"`{name}`")
        blk.name, blk.statement = name, stmt
        if incs:
            self.advance(blk, incs)
        return blk

    def block(self, expr: cst.BaseExpression, label: str) -> Block:
        """`base + rows[:, None] * s0 + cols[None, :] * s1`, base a pointer argument, s0/s1 stride arguments."""
        if not any(bcast(n) for n in walk(expr)):
            raise Skip(f"{label}{ONE_D}")
        terms = summands(expr)
        base = [t for t in terms if isinstance(t, cst.Name)]
        scaled = [t for t in terms if isinstance(t, cst.BinaryOperation) and isinstance(t.operator, cst.Multiply)]
        if len(base) != 1 or len(scaled) != 2 or len(terms) != 3:
            raise Skip(f"{label} is not a 2-D pointer block `base + rows[:, None] * s0 + cols[None, :] * s1`")
        if base[0].value not in self.params or base[0].value in self.constexprs or self.bound[base[0].value]:
            raise Skip(f"{label} starts from `{base[0].value}`, not from a pointer argument of the kernel "
                       f"(the launch could not check its alignment)")
        dims: dict[int, Dim] = {}
        for t in scaled:
            found = next(((b, s) for i, s in ((t.left, t.right), (t.right, t.left)) if (b := bcast(i))), None)
            if found is None:
                raise Skip(f"{label}: `{code(t)}` is not `offs[:, None] * stride` or `offs[None, :] * stride`")
            (index, d), stride = found
            if d in dims:
                raise Skip(f"{label} has two offsets along dimension {d}")
            dims[d] = self.offset_vector(index, stride, label)
        if not dims[1].aligned:
            raise Skip(f"{label}: the column start `{dims[1].start}` is not a multiple of `{dims[1].block}` "
                       f"(descriptor offsets along the last dimension must stay 16-byte aligned)")
        return Block(code(expr), base[0].value, (dims[0], dims[1]), None)

    def advance(self, blk: Block, incs: list[cst.AugAssign]) -> None:
        """Fold `p += STEP * s_d` in a `for v in range(...)` loop into an element offset along d."""
        if len(incs) != 1 or not isinstance(incs[0].operator, cst.AddAssign):
            raise Skip(f"`{blk.name}` is moved more than once, or other than by `+=`")
        inc = incs[0]
        line = self.parent[inc]
        loop = self.parent.get(self.parent.get(line))  # line -> IndentedBlock -> For
        if not isinstance(loop, cst.For) or line not in loop.body.body:
            raise Skip(f"`{blk.name} += ...` is not a statement of a `for` loop body")
        if self.statement_in(loop, self.fn.body) is not loop:
            raise Skip(f"the loop advancing `{blk.name}` is nested in another statement")
        value = inc.value
        if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply)):
            raise Skip(f"`{blk.name}` is not advanced by `STEP * stride`")
        moves = [(d, step) for d, dim in enumerate(blk.dims)
                 for step, s in ((value.left, value.right), (value.right, value.left))
                 if isinstance(s, cst.Name) and s.value == dim.stride]
        if len(moves) != 1 or not self.fixed(moves[0][1]):
            raise Skip(f"`{blk.name}` is not advanced by `STEP * stride` along one of its dimensions")
        d, step = moves[0]
        if d == 1 and not multiple_of(step, blk.dims[1].block):
            raise Skip(f"`{blk.name}` moves along its last dimension by `{code(step)}`, not a multiple of "
                       f"`{blk.dims[1].block}` (descriptor offsets there must stay 16-byte aligned)")
        it = loop.iter
        if not (isinstance(loop.target, cst.Name) and isinstance(it, cst.Call)
                and (isinstance(it.func, cst.Name) and it.func.value in ("range", "static_range")
                     or is_call(it, self.tl, "range", "static_range"))):
            raise Skip(f"the loop advancing `{blk.name}` is not `for v in range(...)`")
        v = loop.target.value
        args = [a.value for a in it.args]
        if self.bound[v] != 1 or any(a.keyword is not None or a.star for a in it.args) or not 1 <= len(args) <= 3:
            raise Skip(f"the loop advancing `{blk.name}` is not `for v in range(lo, hi, step)` with `v` left alone")
        lo = args[0] if len(args) >= 2 else None
        if lo is not None and norm(lo) != "0" and not self.fixed(lo):
            raise Skip(f"the loop advancing `{blk.name}` starts at a value that changes")
        count = v if lo is None or norm(lo) == "0" else f"({v} - {code(lo)})"
        if len(args) == 3 and norm(args[2]) == norm(step):
            moved = count
        elif len(args) < 3 or norm(args[2]) == "1":
            moved = f"{count} * {code(step)}"
        else:
            raise Skip(f"the loop steps by `{code(args[2])}` while `{blk.name}` moves by `{code(step)}`")
        if any(isinstance(n, (cst.Continue, cst.Break)) for n in walk(loop.body)):
            raise Skip(f"the loop advancing `{blk.name}` has `continue` or `break`")
        blk.increment, blk.loop, blk.moved = line, loop, moved
        blk.dims = tuple(Dim(x.index, x.start, x.block, x.stride, i == d, x.aligned) for i, x in enumerate(blk.dims))

    def offsets(self, blk: Block, call: cst.Call) -> tuple[list[str], bool]:
        """The element offsets [row, col] of the block at this access, and whether the loop has moved it."""
        moved = False
        if blk.loop is not None:
            stmt = self.statement_in(call, blk.loop.body)
            if stmt is not None:
                order = list(blk.loop.body.body)
                if order.index(stmt) > order.index(blk.increment):
                    raise Skip(f"`{blk.name}` is accessed after `{blk.name} += ...` in the loop")
                moved = True
            else:
                body = list(self.fn.body.body)
                outer = self.statement_in(call, self.fn.body)
                if outer is None or body.index(outer) > body.index(blk.loop):
                    raise Skip(f"`{blk.name}` is accessed after the loop that advances it")
        out = []
        for dim in blk.dims:
            parts = ([dim.start] if dim.start != "0" else []) + ([blk.moved] if dim.moves and moved else [])
            out.append(" + ".join(parts) or "0")
        return out, moved

    # ------------------------------------------------------------------ masks

    def extents(self, blk: Block, mask: cst.BaseExpression | None, moved: bool) -> tuple[str, str]:
        """The tensor extent along each dimension, from a mask `rows < M & cols < K`. A dimension the
        mask leaves alone must be `tl.arange(0, BLOCK)` itself: the kernel reads all of it."""
        found: dict[int, str] = {}
        for term in (self._expand(mask) if mask is not None else []):
            d, bound = self._bound(blk, term, moved)
            if d in found and norm(found[d]) != norm(bound):
                raise Skip(f"the mask of `{blk.name}` bounds `{blk.dims[d].index}` twice")
            found[d] = bound
        out = []
        for d, dim in enumerate(blk.dims):
            if d in found:
                out.append(found[d])
            elif dim.start == "0" and not dim.moves:
                out.append(dim.block)
            else:
                raise Skip(f"an access to `{blk.name}` does not bound `{dim.index}` by its mask: the extent is unknown")
        return out[0], out[1]

    def _expand(self, node: cst.BaseExpression) -> list[cst.BaseExpression]:
        """The conjuncts of a mask, through names bound once (`mask = a & b`)."""
        out = []
        for term in conjuncts(node):
            if isinstance(term, cst.Name) and term.value in self.values:
                out.extend(self._expand(self.values[term.value]))
            else:
                out.append(term)
        return out

    def _bound(self, blk: Block, term: cst.BaseExpression, moved: bool) -> tuple[int, str]:
        """(dim, extent) for a mask term `offs[:, None] < M`, `ok[None, :]` with `ok = (v + offs) < K`,
        or `offs[None, :] < K - v` (v: what the loop has added to the offsets)."""
        why = Skip(f"mask term `{code(term)}` of `{blk.name}` is not a bound `offsets < size`")
        outer = bcast(term)
        if outer is not None:
            cmp_, d = outer
            if isinstance(cmp_, cst.Name) and cmp_.value in self.values:
                cmp_ = self.values[cmp_.value]
            if not isinstance(cmp_, cst.Comparison):
                raise why
            left = cmp_.left
        elif isinstance(term, cst.Comparison):
            cmp_ = term
            inner = bcast(cmp_.left)
            if inner is None:
                raise why
            left, d = inner
        else:
            raise why
        if len(cmp_.comparisons) != 1 or not isinstance(cmp_.comparisons[0].operator, cst.LessThan):
            raise why
        right = cmp_.comparisons[0].comparator
        dim = blk.dims[d]
        lterms = [norm(t) for t in summands(left)]
        if dim.index not in lterms:
            raise why
        lterms.remove(dim.index)
        shift = norm(blk.moved) if dim.moves and moved else None
        if not lterms and shift is None:
            bound = right
        elif shift is not None and lterms == [shift]:
            bound = right
        elif (shift is not None and not lterms and isinstance(right, cst.BinaryOperation)
              and isinstance(right.operator, cst.Subtract) and norm(right.right) == shift):
            bound = right.left
        else:
            raise why
        if not self.fixed(bound):
            raise Skip(f"the bound `{code(bound)}` of `{blk.name}` is not a kernel argument or constant")
        return d, code(bound)

    # ------------------------------------------------------------------ accesses

    def access(self, blk: Block, call: cst.Call) -> tuple[str, tuple[str, str]]:
        """(the descriptor access's code with `{desc}` for the descriptor name, the extents) of a tl.load/tl.store."""
        is_store = call.func.attr.value == "store"
        slots = ["pointer", "value", "mask"] if is_store else ["pointer", "mask", "other"]
        got: dict[str, cst.BaseExpression] = {}
        for i, arg in enumerate(call.args):
            if arg.star or (arg.keyword is None and i >= len(slots)):
                raise Skip(f"an access to `{blk.name}` passes options by position")
            got[arg.keyword.value if arg.keyword is not None else slots[i]] = arg.value
        extra = sorted(set(got) - set(slots))
        if extra:
            raise Skip(f"an access to `{blk.name}` sets {', '.join(extra)}, which descriptor accesses "
                       f"(Triton 3.6) do not take")
        other = got.get("other")
        if other is not None and not (isinstance(other, (cst.Integer, cst.Float)) and other.evaluated_value == 0):
            raise Skip(f"a load of `{blk.name}` fills masked elements with `{code(other)}`; a descriptor fills zeros")
        offsets, moved = self.offsets(blk, call)
        extents = self.extents(blk, got.get("mask"), moved)
        where = ", ".join(offsets)
        if is_store:
            return f"{{desc}}.store([{where}], {code(got['value'])})", extents
        return f"{{desc}}.load([{where}])", extents
