"""Recipe `triton-tensor-descriptor`: tiled pointer-block loads/stores -> tensor descriptors (TMA).

A 2-D pointer block `p = base + rows[:, None] * s0 + cols[None, :] * s1` (each offset vector
`start + tl.arange(0, BLOCK)`), loaded or stored under a mask that bounds each dimension
(`rows < M`, `(k0 + cols) < K`, `cols < K - k0`) and advanced in a `for v in range(...)` loop by
`p += STEP * s_d`, is what a tensor descriptor expresses directly:

    desc = tl.make_tensor_descriptor(base, shape=[M, K], strides=[s0, 1], block_shape=[BM, BK])
    desc.load([first_row, first_col + v])       # out-of-bounds elements read as zero
    desc.store([first_row, first_col], value)   # out-of-bounds elements are not written

On Hopper and Blackwell each access becomes one TMA bulk copy instead of a tensor of addresses
and a mask in registers. The descriptor is built on the device (`tl.make_tensor_descriptor`)
rather than on the host (`triton.tools.tensor_descriptor.TensorDescriptor`): its block shape is
the kernel's own BLOCK constexprs, so an `@triton.autotune` on the kernel keeps working without a
pre-hook (and keeps Triton's autotuning disk cache, which pre-hooks disable), and the launch
arguments stay the same. The price is a global scratch buffer for the descriptors (128 bytes
each, per program) that Triton requests at launch from the allocator set by `triton.set_allocator`.

A descriptor needs a 16-byte aligned base, 16-byte aligned leading strides and a contiguous last
dimension, which odd shapes (K = 65 in fp16) and transposed views do not have. So the rewrite adds
a twin kernel `<kernel>_tma` and the wrapper launches it only when every descriptor's tensor and
strides qualify, checked on the very arguments of the launch; otherwise it launches the original
kernel, unchanged. Masks and `other=0` go: descriptor bounds give the same zeros and the same
clipped stores. Accesses the recipe does not recognise (playbook/triton/pointer_blocks.py says
which it does) stay pointer accesses in the twin; with none recognised it proposes nothing and
says why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases, is_call
from playbook.cst.edits import replace, shift_aligned
from playbook.cst.imports import import_alias
from playbook.cst.kernels import module_functions, params
from playbook.cst.launches import Launch, only_launch, read_triton
from playbook.cst.names import assign_of
from playbook.cst.source import Skip, checked, walk
from playbook.hazards import scan
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register
from playbook.triton.index_expressions import code, free_names, norm
from playbook.triton.pointer_blocks import ONE_D, Block, KernelBlocks

SUFFIX = "_tma"
READY = "_tma_ready"
SCRATCH = "_tma_scratch"
# Calls whose result may be dropped when the rewrite leaves it unread.
PURE_TL = {"arange", "program_id", "num_programs", "cdiv", "minimum", "maximum", "zeros", "full", "where",
           "load", "multiple_of", "max_contiguous", "max_constancy"}

HELPERS = '''
def {ready}(t, *strides):
    """Whether a tensor descriptor (TMA) can address `t` with these strides (the kernel's, in
    elements): a 16-byte aligned base, 16-byte aligned leading strides, a contiguous last one."""
    size = t.element_size()
    return (t.numel() > 0 and t.data_ptr() % 16 == 0 and strides[-1] == 1
            and all(s * size % 16 == 0 for s in strides[:-1]))


def {scratch}(size, alignment, stream):
    """Global memory for the descriptors the kernel builds on the device (Triton asks at launch)."""
    return {torch}.empty(size, dtype={torch}.int8, device="cuda")
'''

HYPOTHESIS = ("{kernel}: {what} through tensor descriptors (TMA bulk copies, no address tensors or masks in "
              "registers): expect 5-15% on large GEMMs on Hopper/Blackwell, ~0 on small ones; layouts a "
              "descriptor cannot address (strides not 16-byte aligned, e.g. K=65 in fp16) keep the pointer kernel")


# ----------------------------------------------------------------------------------- rewrite


class _Replace(cst.CSTTransformer):
    """Replace original nodes (by identity); cst.RemoveFromParent() removes a statement, a _Prepend
    puts statements before one."""

    def __init__(self, mapping: dict):
        self.mapping = mapping

    def on_leave(self, original, updated):
        new = self.mapping.get(original, updated)
        return new(updated) if isinstance(new, _Prepend) else new


@dataclass(frozen=True)
class _Prepend:
    statements: list

    def __call__(self, updated: cst.BaseStatement) -> cst.FlattenSentinel:
        first = self.statements[0].with_changes(leading_lines=updated.leading_lines)
        return cst.FlattenSentinel([first, *self.statements[1:], updated.with_changes(leading_lines=[])])


class _Strip(cst.CSTTransformer):
    """Drop the `name = value` statements of the given names."""

    def __init__(self, names: set[str]):
        self.names = names

    def leave_SimpleStatementLine(self, original, updated):
        a = assign_of(updated)
        return cst.RemoveFromParent() if a and a[0] in self.names else updated

    def leave_IndentedBlock(self, original, updated):
        return updated if updated.body else updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])


def _reads(fn: cst.FunctionDef) -> Counter:
    """Names the kernel body reads."""
    return Counter(free_names(fn.body)) - Counter(
        t.target.value for n in walk(fn.body) if isinstance(n, cst.Assign) for t in n.targets
        if isinstance(t.target, cst.Name))


def _drop_dead(fn: cst.FunctionDef, before: Counter, tl: str) -> cst.FunctionDef:
    """Remove pure assignments the rewrite left unread (read before, unread now), until none is left."""
    while True:
        now = _reads(fn)
        dead = {a[0] for node in walk(fn.body) if (a := assign_of(node)) and before[a[0]] and not now[a[0]]
                and all(is_call(n, tl, *PURE_TL) for n in walk(a[1]) if isinstance(n, cst.Call))}
        if not dead:
            return fn
        fn = fn.visit(_Strip(dead))


def _desc_name(block: str, taken: set[str]) -> str:
    stem = block
    for suffix in ("_ptrs", "_ptr"):
        if stem.endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
            break
    name = f"{stem}_desc"
    while name in taken:
        name = f"{name}_"
    return name


def _add_import_torch(module: cst.Module) -> cst.Module:
    """`import torch` just before the first `import triton...` line."""
    body = list(module.body)
    at = next(i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
              and any(isinstance(x, cst.Import) and any(code(n.name).split(".")[0] == "triton" for n in x.names)
                      for x in s.body))
    stmt = cst.parse_statement("import torch\n").with_changes(leading_lines=body[at].leading_lines)
    body[at] = body[at].with_changes(leading_lines=[])
    body.insert(at, stmt)
    return module.with_changes(body=body)


@register
class TritonTensorDescriptor(PatternRecipe):
    id = "triton-tensor-descriptor"
    title = "Tiled pointer-block loads/stores -> tensor descriptors (TMA), pointer kernel kept as fallback"
    languages = ("triton",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module, al, kernels, launches = read_triton(source)
        defined = {f.name.value for f in module_functions(module)}

        def attempt(name: str, fn: cst.FunctionDef) -> Candidate:
            if any(is_call(n, al.tl, "make_tensor_descriptor") for n in walk(fn.body)):
                raise Skip(f"{name} already builds tensor descriptors")
            if f"{name}{SUFFIX}" in defined:
                raise Skip(f"{name} already has a tensor-descriptor twin")
            return self._rewrite(module, al, fn, only_launch(name, launches))

        return proposed(*per_kernel(kernels, attempt, analysis), "no @triton.jit kernel")

    def _rewrite(self, module: cst.Module, al: Aliases, fn: cst.FunctionDef, launch: Launch) -> Candidate:
        name, tl = fn.name.value, al.tl
        if any(h.code == "aliasing" for h in scan(module.code_for_node(fn), "triton")):
            raise Skip(f"{name} loads and stores the same buffer: descriptor stores are not ordered with "
                       f"pointer loads of it")
        kernel = KernelBlocks(fn, al)
        by_name: dict[str, list[cst.Call]] = {}
        blocks: list[Block] = []
        reasons: list[str] = []
        for call in (n for n in walk(fn.body) if is_call(n, tl, "load", "store")):
            ptr = call.args[0].value if call.args and call.args[0].keyword is None else None
            if isinstance(ptr, cst.Name):
                by_name.setdefault(ptr.value, []).append(call)
                continue
            try:  # a block built in the access itself: its descriptor goes before the statement holding it
                if ptr is None:
                    raise Skip(f"a {tl}.{call.func.attr.value} passes its pointer by keyword")
                blk = kernel.block(ptr, f"`{code(ptr)}`")
                blk.anchor = kernel.statement_in(call, fn.body)
                blk.accesses[call], blk.extents = kernel.access(blk, call)
                blocks.append(blk)
            except Skip as exc:
                reasons.append(str(exc))
        for pname, calls in by_name.items():
            try:
                blk = kernel.named_block(pname)
                uses = [n for n in free_names(fn.body) if n == pname]
                if len(uses) != len(calls) + (blk.increment is not None) + 1:
                    raise Skip(f"`{pname}` is used other than by loads, stores and `+=`")
                for call in calls:
                    access, extents = kernel.access(blk, call)
                    if blk.extents is not None and [norm(e) for e in extents] != [norm(e) for e in blk.extents]:
                        raise Skip(f"the accesses to `{pname}` bound it differently")
                    blk.extents, blk.accesses[call] = extents, access
                blocks.append(blk)
            except Skip as exc:
                reasons.append(str(exc))
        if not blocks:
            rest = list(dict.fromkeys(reasons))
            if rest and all(r.endswith(ONE_D) for r in rest):  # a row kernel: one clause for its 1-D accesses
                shown = ", ".join(r[:-len(ONE_D)].strip() for r in rest[:3]) + (", ..." if len(rest) > 3 else "")
                rest = [f"each of its {len(rest)} accesses is a 1-D access ({shown}), and the recipe rewrites 2-D tiles"]
            raise Skip(f"{name}: no load or store it can rewrite: " + "; ".join(rest))

        taken = {n.value for n in walk(fn) if isinstance(n, cst.Name)}
        mapping: dict[cst.CSTNode, object] = {}
        before: dict[cst.CSTNode, list[cst.BaseStatement]] = {}  # anchor statement -> descriptors to build first
        for blk in blocks:
            desc = _desc_name(blk.name if blk.statement is not None else blk.base, taken)
            taken.add(desc)
            make = cst.parse_statement(
                f"{desc} = {tl}.make_tensor_descriptor({blk.base}, shape=[{', '.join(blk.extents)}], "
                f"strides=[{blk.dims[0].stride}, 1], block_shape=[{', '.join(d.block for d in blk.dims)}])\n")
            if blk.statement is not None:
                mapping[blk.statement] = make.with_changes(leading_lines=blk.statement.leading_lines)
            else:
                before.setdefault(blk.anchor, []).append(make)
            if blk.increment is not None:
                mapping[blk.increment] = cst.RemoveFromParent()
            for call, access in blk.accesses.items():
                mapping[call] = cst.parse_expression(access.format(desc=desc))
        for anchor, makes in before.items():
            mapping[anchor] = _Prepend(makes)
        twin = fn.visit(_Replace(mapping))
        twin = _drop_dead(twin, _reads(fn), tl)
        note = cst.EmptyLine(comment=cst.Comment(
            f"# {name} through tensor descriptors (TMA): the same tiles; the descriptors handle the bounds"))
        twin = twin.with_changes(name=cst.Name(f"{name}{SUFFIX}"),
                                 params=shift_aligned(twin.params, fn.whitespace_before_params, len(SUFFIX)),
                                 leading_lines=[cst.EmptyLine(), cst.EmptyLine(), note])
        new_source = checked(self._wire(module, al, fn, twin, launch, blocks).code)

        loads = [b.base for b in blocks if any(".load(" in a for a in b.accesses.values())]
        stores = [b.base for b in blocks if any(".store(" in a for a in b.accesses.values())]
        what = "; ".join(x for x in (f"loads of {', '.join(loads)}" if loads else "",
                                     f"stores to {', '.join(stores)}" if stores else "") if x)
        return Candidate(self.id, "tma", f"{self.id}:{name}",
                         f"{name}: tensor descriptors (TMA) for {', '.join(dict.fromkeys(b.base for b in blocks))}",
                         HYPOTHESIS.format(kernel=name, what=what), new_source)

    def _wire(self, module: cst.Module, al: Aliases, fn: cst.FunctionDef, twin: cst.FunctionDef, launch: Launch,
              blocks: list[Block]) -> cst.Module:
        """The twin after `fn`, the helpers before the wrapper, and the dispatch around the launch."""
        pnames = [p.name.value for p in params(fn)]
        bound: dict[str, cst.BaseExpression] = {}
        for i, arg in enumerate(launch.call.args):
            if arg.keyword is None:
                if arg.star or i >= len(pnames):
                    break  # parameter positions past a *args are unknown
                bound[pnames[i]] = arg.value
            elif arg.keyword.value in pnames:
                bound[arg.keyword.value] = arg.value
        checks = []
        for blk in blocks:
            needed = [blk.base, *(d.stride for d in blk.dims)]
            missing = [p for p in needed if p not in bound]
            if missing:
                raise Skip(f"the launch of {fn.name.value} does not show the arguments for {', '.join(missing)}")
            checks.append(f"{READY}({', '.join(code(bound[p]) for p in needed)})")
        checks = list(dict.fromkeys(checks))

        stmt = next((s for s in walk(launch.wrapper.body) if isinstance(s, cst.SimpleStatementLine)
                     and any(n is launch.call for n in walk(s))), None)
        if stmt is None or len(stmt.body) != 1:
            raise Skip(f"the launch of {fn.name.value} is not a statement of its own")
        cond = checks[0] if len(checks) == 1 else "(" + "\n            and ".join(checks) + ")"
        shell = cst.parse_module(
            "def _f():\n"
            "    # tensor descriptors need 16-byte aligned bases and leading strides and a contiguous last\n"
            "    # dimension; other layouts (odd sizes, transposed views) take the pointer kernel\n"
            f"    if {cond}:\n"
            f"        {al.triton}.set_allocator({SCRATCH})  # global memory for the descriptors\n"
            "        pass\n"
            "    else:\n"
            "        pass\n").body[0].body.body[0]
        twin_launch = stmt.visit(_Replace({launch.call.func.value: cst.Name(twin.name.value)}))
        twin_launch = shift_aligned(twin_launch, launch.call.whitespace_before_args,
                                    len(twin.name.value) - len(fn.name.value))
        dispatch = shell.with_changes(
            leading_lines=[*stmt.leading_lines, *shell.leading_lines],
            body=shell.body.with_changes(body=[shell.body.body[0], twin_launch.with_changes(leading_lines=[])]),
            orelse=shell.orelse.with_changes(body=shell.orelse.body.with_changes(
                body=[stmt.with_changes(leading_lines=[])])))
        new = replace(module, {stmt: dispatch})

        body = list(new.body)
        at = next(i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == fn.name.value)
        body.insert(at + 1, twin)
        defined = {s.name.value for s in body if isinstance(s, cst.FunctionDef)}
        torch = import_alias(module, "torch")
        if not {READY, SCRATCH} <= defined:
            if {READY, SCRATCH} & defined:
                raise Skip(f"the module defines one of {READY} and {SCRATCH} but not the other")
            helpers = cst.parse_module(HELPERS.format(ready=READY, scratch=SCRATCH, torch=torch or "torch")).body
            w = next(i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef)
                     and s.name.value == launch.wrapper.name.value)
            body[w:w] = [h.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) for h in helpers]
        new = new.with_changes(body=body)
        return new if torch is not None else _add_import_torch(new)
