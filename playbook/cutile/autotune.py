"""Recipe `cutile-autotune` (TileGym playbook C): the launch wrapper of a cuTile kernel picks, per
input key, the best config of a search space with `ct.tune.exhaustive_search` and launches with it.

Pattern: one `ct.launch(stream, grid, kernel, (args...))` statement in a module-level wrapper,
preceded only by assignments (launch arguments computed from the inputs) and followed by at most
`return <its parameters>`. The rewrite

* moves the wrapper's body into `_launch_plan(cfg, <wrapper params>) -> (grid, kernel, args,
  hints)`, where the tuned tile constants are read from `cfg` (so the grid follows them);
* adds `_TUNE_SPACES` (one list of configs per architecture family, at most `MAX_CONFIGS`, the
  current config first), `_TUNED` (input key -> config and kernel with the config's hints) and
  the helpers that tune on the first call for a key and launch from the cache after;
* deletes the module constants that nothing reads any more.

The space (see `space`): tile constants x occupancy, and on Blackwell x num_ctas for MMA kernels.
A tile constant is an UPPERCASE power-of-two module int passed to `ct.launch` for a
`ct.Constant` parameter and read nowhere but in the wrapper. One that the kernel uses as the
shape of a load at tile index 0 along that axis (it reads the first tile only, so the tile must
cover the whole axis) is not a free knob and stays fixed; a whole-row tile computed at runtime
(`next_power_of_2(cols)`) is not a constant and is never varied either.

Tuning runs the kernel many times: arguments the kernel writes are tuned on scratch copies of
the wrapper's arguments they come from (`_TUNE_WRITES`), so the caller's data is never touched,
whatever aliasing the caller sets up (an `out` that is also an input is a runtime property that a
static check of the wrapper cannot see; which arguments the kernel writes is static).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases, aliases, calls, is_attr
from playbook.cst.constants import drop_constants, module_int_constants
from playbook.cst.edits import kwarg_value
from playbook.cst.imports import imports
from playbook.cst.kernels import cutile_kernels, has_loop, is_ct_kernel, params
from playbook.cst.names import assignments, global_references, names_in
from playbook.cst.source import Skip, checked, parse, walk
from playbook.cutile.kernels import MMA_OPS
from playbook.recipe import Candidate, PatternRecipe, register
from playbook.tiles import gemm_tiles

MAX_CONFIGS = 30  # TileGym: more than 30 configs pushes compile times past 5 minutes
SPACE_NAME = "_TUNE_SPACES"
HINTS = ("occupancy", "num_ctas")  # the compiler hints a config may carry
WRITE_OPS = ("store", "scatter")  # plus every ct.atomic_*


@dataclass(frozen=True)
class Arch:
    """The search space of one architecture family (field survey, TileGym playbook C)."""
    tiles: tuple[int, int]  # smallest and largest tile per dimension
    occupancy: tuple[int, ...]  # with tile knobs
    occupancy_only: tuple[int, ...]  # without tile knobs: every step the budget allows
    num_ctas: tuple[int, ...]  # for MMA kernels; () = not tuned


# MMA kernels: occupancy 1 and 2 only. Their accumulator tiles fill the register file: compiled
# for sm_90, the reference matmul at occupancy 4 and 8 is capped at 128 and 64 registers and
# spills, so those configs would only cost compile and tuning time.
MMA_OCCUPANCY = (1, 2)
ARCHS = {
    "sm_90": Arch((64, 512), (1, 2, 4, 8), (1, 2, 3, 4, 5, 6, 7, 8), ()),
    "sm_100": Arch((128, 1024), (1, 2, 4, 8, 16), (1, 2, 3, 4, 6, 8, 12, 16), (2, 4)),
}
BLACKWELL_MAJOR = 10  # sm_100 / sm_103 use the "sm_100" space; sm_120 (no 2-CTA clusters) and older the "sm_90" one
# One tile constant that a loop inside the kernel walks (a row in chunks: row_sum, the chunked
# norms): the tile sets the bytes each block has in flight per trip, and the first versions' 128
# is far below what a memory-bound row loop needs, so the space reaches up to this many elements.
ROW_LOOP_TILE_MAX = 4096


def arch_for(arch: Arch, row_loop: bool) -> Arch:
    """The architecture's space, with the tile range widened for a row loop (ROW_LOOP_TILE_MAX)."""
    if not row_loop:
        return arch
    return Arch((arch.tiles[0], max(arch.tiles[1], ROW_LOOP_TILE_MAX)), arch.occupancy, arch.occupancy_only,
                arch.num_ctas)


def _pow2(v: int) -> bool:
    return v >= 16 and v & (v - 1) == 0


def _dedupe(values) -> list:
    return list(dict.fromkeys(values))


# ----------------------------------------------------------------------------------- space


@dataclass(frozen=True)
class Space:
    knobs: tuple[str, ...]
    tiles: tuple[tuple[int, ...], ...]  # current first
    occupancy: tuple[int | None, ...]  # current first (None: the compiler's choice)
    num_ctas: tuple[int | None, ...]  # () = not tuned

    def __len__(self) -> int:
        return len(self.tiles) * len(self.occupancy) * max(len(self.num_ctas), 1)


def tile_options(current: tuple[int, ...], lo: int, hi: int) -> list[tuple[int, ...]]:
    """One tile constant: the current value, then every power of two in [lo, hi]. Several: the
    current tile, each dimension doubled alone, all doubled (a dimension at `hi` is not doubled)."""
    if not current:
        return [()]
    if len(current) == 1:
        return _dedupe([current] + [(v,) for v in (1 << k for k in range(4, 16)) if lo <= v <= hi])
    out = [current]
    for dims in [(d,) for d in range(len(current))] + [tuple(range(len(current)))]:
        new = tuple(v * 2 if d in dims and v * 2 <= hi else v for d, v in enumerate(current))
        out.append(new)
    return _dedupe(out)


def space(arch: Arch, knobs: dict[str, int], occupancy: int | None, num_ctas: int | None, mma: bool) -> Space:
    """The configs of one architecture, at most MAX_CONFIGS. Over budget, occupancy steps go first
    (from the top, down to two values), then num_ctas steps, then tiles from the end; the current
    value of each axis always stays, first. The M, N, K tiles of an MMA kernel also get the large
    GEMM tiles (playbook.tiles.GEMM_TILES) up to the architecture's largest tile, ahead of the
    doubled ones, so a trimmed space keeps them."""
    tiles = tile_options(tuple(knobs.values()), *arch.tiles)
    large = [t for t in gemm_tiles(list(knobs)) if max(t) <= arch.tiles[1]] if mma else []
    tiles = _dedupe([tiles[0], *large, *tiles[1:]])
    occ = _dedupe([occupancy, *(MMA_OCCUPANCY if mma else arch.occupancy if knobs else arch.occupancy_only)])
    ctas = _dedupe([num_ctas, *arch.num_ctas]) if mma and arch.num_ctas else []
    while len(tiles) * len(occ) * max(len(ctas), 1) > MAX_CONFIGS:
        if len(occ) > 2:
            occ.pop()
        elif len(ctas) > 2:
            ctas.pop()
        elif len(tiles) > 1:
            tiles.pop()
        else:  # unreachable: one tile x two occupancies x two cluster sizes fits
            break
    return Space(tuple(knobs), tuple(tiles), tuple(occ), tuple(ctas))


def _literal(v) -> str:
    return "None" if v is None else str(v)


def _tuple_code(items) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def space_code(s: Space, indent: str) -> str:
    """`[{...} for ... in ...]`: a list comprehension (a Sequence, never a generator)."""
    names = [k.lower() for k in s.knobs]
    entries = [f'"{k}": {n}' for k, n in zip(s.knobs, names)] + ['"occupancy": occupancy']
    loops = []
    if len(names) == 1:
        loops.append(f"for {names[0]} in {_tuple_code([str(t[0]) for t in s.tiles])}")
    elif names:
        loops.append(f"for {', '.join(names)} in {_tuple_code([_tuple_code([str(v) for v in t]) for t in s.tiles])}")
    loops.append(f"for occupancy in {_tuple_code([_literal(v) for v in s.occupancy])}")
    if s.num_ctas:
        entries.append('"num_ctas": num_ctas')
        loops.append(f"for num_ctas in {_tuple_code([_literal(v) for v in s.num_ctas])}")
    pad = indent + " "
    return "[{" + ", ".join(entries) + "}\n" + "\n".join(f"{pad}{loop}" for loop in loops) + "]"


def owned_knobs(module: cst.Module) -> frozenset[str]:
    """The knobs (config keys) of the module's tune space, empty when it has none: recipes that
    step one of these by hand (cutile-hint) leave them to the tuner."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if (isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == SPACE_NAME
                                                      for t in small.targets)):
                outer = small.value
                inner = [e.value for e in outer.elements] if isinstance(outer, cst.Dict) else [outer]
                keys = {el.key.evaluated_value for v in inner for d in walk(v) if isinstance(d, cst.Dict)
                        for el in d.elements
                        if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString)}
                return frozenset(keys)
    return frozenset()


# ----------------------------------------------------------------------------------- pattern


@dataclass
class Pattern:
    al: Aliases
    kernel: cst.FunctionDef
    wrapper: cst.FunctionDef
    launch_index: int  # of the launch statement in the wrapper body
    stream: cst.BaseExpression
    grid: cst.BaseExpression
    args: cst.BaseExpression  # the tuple / list of kernel arguments
    wrapper_params: list[str]
    knobs: dict[str, int]  # tile constant -> current value, in launch order
    fixed: dict[str, str]  # tile-like constants left alone -> why
    writes: list[int]  # positions of wrapper parameters the kernel writes (through the launch)
    occupancy: int | None
    num_ctas: int | None
    mma: bool


HELPER_NAMES = ("_TUNE_SPACES", "_TUNE_WRITES", "_TUNED", "_tune_space", "_scratch", "_tuned", "_autotune",
                "_launch_plan")
RUN_LOCALS = ("cfg", "kernel", "grid", "args")


def _module_names(module: cst.Module) -> set[str]:
    names: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Assign, cst.AnnAssign)):
                    targets = small.targets if isinstance(small, cst.Assign) else [small]
                    names |= {n.value for t in targets for n in walk(t.target) if isinstance(n, cst.Name)}
                elif isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        node = alias.asname.name if alias.asname is not None else alias.name
                        while isinstance(node, cst.Attribute):
                            node = node.value
                        names.add(node.value)
    return names


def _hint(kernel: cst.FunctionDef, al: Aliases, name: str) -> int | None:
    dec = next(d for d in kernel.decorators if is_ct_kernel(d, al))
    value = kwarg_value(dec.decorator, name) if isinstance(dec.decorator, cst.Call) else None
    if value is None:
        return None
    if not isinstance(value, cst.Integer):
        raise Skip(f"{kernel.name.value}: {name} is not a literal")
    return int(value.evaluated_value)


def _is_constant_param(param: cst.Param, al: Aliases) -> bool:
    ann = param.annotation.annotation if param.annotation is not None else None
    return isinstance(ann, cst.Subscript) and is_attr(ann.value, al.ct, "Constant")


def _written_params(kernel: cst.FunctionDef, al: Aliases) -> set[str]:
    """Kernel parameters the kernel may write: arrays stored, scattered or updated atomically, and
    (conservatively) parameters handed to any call that is not a cuda.tile function."""
    names = {p.name.value for p in params(kernel)}
    out: set[str] = set()
    for node in walk(kernel.body):
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        ct_call = isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == al.ct
        if ct_call:
            op = func.attr.value
            first = node.args[0].value if node.args else None
            if (op in WRITE_OPS or op.startswith("atomic")) and isinstance(first, cst.Name) and first.value in names:
                out.add(first.value)
            continue
        if isinstance(func, cst.Attribute):  # x.method(...): a method that stores through an array parameter
            base = func.value
            while isinstance(base, (cst.Attribute, cst.Call, cst.Subscript)):
                base = base.func if isinstance(base, cst.Call) else base.value
            if (isinstance(base, cst.Name) and base.value in names
                    and (func.attr.value in WRITE_OPS or func.attr.value.startswith("atomic"))):
                out.add(base.value)
        if not (isinstance(func, cst.Name) and func.value in ("range", "min", "max", "len", "int", "float", "bool")):
            out |= {a.value.value for a in node.args if isinstance(a.value, cst.Name) and a.value.value in names}
    return out


VIEW_METHODS = {"view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "flatten", "unflatten",
                "unsqueeze", "squeeze", "expand", "expand_as", "narrow", "select", "as_strided", "detach",
                "contiguous", "movedim", "swapaxes", "chunk", "split", "unbind"}


def _data_params(expr: cst.BaseExpression, assigned: dict[str, list[cst.BaseExpression]], wrapper_params: set[str],
                 seen: set[str]) -> set[str]:
    """Wrapper parameters whose memory `expr` may be (a view of): views follow their base only,
    anything else (conservatively) every name it reads."""
    if isinstance(expr, cst.Name):
        if expr.value in wrapper_params:
            return {expr.value}
        if expr.value in seen:
            return set()
        seen.add(expr.value)
        return set().union(*(_data_params(v, assigned, wrapper_params, seen) for v in assigned.get(expr.value, [])))
    if isinstance(expr, cst.Subscript):
        return _data_params(expr.value, assigned, wrapper_params, seen)
    if isinstance(expr, cst.Attribute) and expr.attr.value in ("T", "mT", "H", "mH", "data"):
        return _data_params(expr.value, assigned, wrapper_params, seen)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in VIEW_METHODS:
        return _data_params(expr.func.value, assigned, wrapper_params, seen)
    out: set[str] = set()
    for name in names_in(expr):
        out |= _data_params(cst.Name(name), assigned, wrapper_params, seen)
    return out


def _whole_axis(kernel: cst.FunctionDef, al: Aliases, param: str) -> bool:
    """Whether the kernel loads a tile of `param` along an axis at the literal tile index 0: it
    reads the first tile only, so the tile must cover that whole axis."""
    for call in calls(kernel.body, al.ct, "load"):
        index = kwarg_value(call, "index")
        if index is None and len(call.args) > 1 and call.args[1].keyword is None:
            index = call.args[1].value
        shape = kwarg_value(call, "shape")
        if not isinstance(index, cst.Tuple) or not isinstance(shape, cst.Tuple):
            continue
        for i, el in zip(index.elements, shape.elements):
            if (isinstance(el.value, cst.Name) and el.value.value == param and isinstance(i.value, cst.Integer)
                    and int(i.value.evaluated_value) == 0):
                return True
    return False


def recognise(module: cst.Module) -> Pattern:
    al = aliases(module)
    if not al.ct:
        raise Skip("needs `import cuda.tile as ct`")
    if not imports(module, "torch"):
        raise Skip("needs `import torch` (the tuning helpers read tensor shapes, strides and streams)")
    if "os" in _module_names(module) and not imports(module, "os"):
        raise Skip("the module binds `os` to something other than the os module")
    kernels = cutile_kernels(module, al)
    if not kernels:
        raise Skip("no @ct.kernel function")
    taken = _module_names(module) & set(HELPER_NAMES)
    tune_calls = [n for n in walk(module) if isinstance(n, cst.Attribute) and n.attr.value == "exhaustive_search"]
    if taken or tune_calls:
        raise Skip("already autotuned (" + ", ".join(sorted(taken) or ["exhaustive_search"]) + ")")
    launches = calls(module, al.ct, "launch")
    if len(launches) != 1:
        raise Skip(f"{len(launches)} ct.launch calls (one launch expected)")
    launch = launches[0]
    wrapper = next((f for f in module.body if isinstance(f, cst.FunctionDef) and launch in set(walk(f.body))), None)
    if wrapper is None or wrapper.name.value in kernels:
        raise Skip("ct.launch is not in a module-level function")
    body = list(wrapper.body.body) if isinstance(wrapper.body, cst.IndentedBlock) else []
    index = next((i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                  and isinstance(s.body[0], cst.Expr) and s.body[0].value is launch), None)
    if index is None:
        raise Skip(f"the ct.launch in {wrapper.name.value} is not a statement of its own at the top of its body")
    p = wrapper.params
    if p.posonly_params or p.kwonly_params or isinstance(p.star_arg, cst.Param) or p.star_kwarg is not None:
        raise Skip(f"{wrapper.name.value} takes positional-only, keyword-only or variadic parameters")
    wparams = [x.name.value for x in p.params]
    assigned = assignments(wrapper)
    clash = sorted(set(wparams) & set(RUN_LOCALS)) + (["cfg"] if "cfg" in assigned else [])
    if clash:  # the new wrapper's locals, and `cfg` in _launch_plan
        raise Skip(f"{wrapper.name.value} has a parameter or local named {clash[0]}, a name the rewrite uses")

    for i, stmt in enumerate(body[:index]):
        ok = isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Assign, cst.AnnAssign, cst.Assert))
            or (i == 0 and isinstance(s, cst.Expr) and isinstance(s.value, cst.SimpleString)) for s in stmt.body)
        if not ok:
            raise Skip(f"{wrapper.name.value} does more than compute launch arguments before the launch "
                       f"(`{module.code_for_node(stmt).strip()}`): it would run once per tuned config")
        in_place = [n.func.attr.value for n in walk(stmt)
                    if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                    and n.func.attr.value.endswith("_") and not n.func.attr.value.startswith("_")]
        if in_place:
            raise Skip(f"{wrapper.name.value} modifies a tensor in place ({in_place[0]}) before the launch")
    locals_ = set(assigned) - set(wparams)
    rest = body[index + 1:]
    ret_ok = not rest or (len(rest) == 1 and isinstance(rest[0], cst.SimpleStatementLine) and len(rest[0].body) == 1
                          and isinstance(rest[0].body[0], cst.Return)
                          and not (names_in(rest[0].body[0]) & locals_))
    if not ret_ok:
        raise Skip(f"{wrapper.name.value} does more after the launch than return its arguments")

    if len(launch.args) != 4 or any(a.keyword is not None or a.star for a in launch.args):
        raise Skip("ct.launch is not called as launch(stream, grid, kernel, (args...))")
    stream, grid, kernel_expr, args = (a.value for a in launch.args)
    if names_in(stream) & (locals_ | set(wparams)):
        raise Skip("the launch stream depends on the wrapper's arguments or locals")
    if not (isinstance(kernel_expr, cst.Name) and kernel_expr.value in kernels):
        raise Skip("the launched kernel is not a @ct.kernel of this module")
    kernel = kernels[kernel_expr.value]
    kparams = params(kernel)
    if not isinstance(args, (cst.Tuple, cst.List)) or any(isinstance(e, cst.StarredElement) for e in args.elements):
        raise Skip("the kernel arguments are not a literal tuple")
    if len(args.elements) != len(kparams):
        raise Skip(f"{len(args.elements)} launch arguments for {len(kparams)} kernel parameters")

    # tile constants
    constants = module_int_constants(module)
    refs = global_references(module)
    in_wrapper = set(walk(wrapper))
    knobs: dict[str, int] = {}
    fixed: dict[str, str] = {}
    for el, kp in zip(args.elements, kparams):
        v = el.value
        if not (isinstance(v, cst.Name) and v.value in constants and v.value.isupper() and _pow2(constants[v.value])):
            continue
        name = v.value
        if v not in refs.get(name, []):
            continue  # a local of the wrapper with the name of a module constant
        if not _is_constant_param(kp, al):
            fixed[name] = f"passed for {kp.name.value}, not a ct.Constant parameter"
        elif any(r not in in_wrapper for r in refs.get(name, [])):
            fixed[name] = f"read outside {wrapper.name.value}"
        elif _whole_axis(kernel, al, kp.name.value):
            fixed[name] = "the kernel loads only tile 0 along its axis (the tile covers the whole axis)"
        else:
            knobs.setdefault(name, constants[name])

    # what the kernel writes, back to the wrapper's parameters
    written = _written_params(kernel, al)
    sources: set[str] = set()
    for el, kp in zip(args.elements, kparams):
        if kp.name.value in written:
            sources |= _data_params(el.value, assigned, set(wparams), set())
    writes = [i for i, name in enumerate(wparams) if name in sources]
    return Pattern(al, kernel, wrapper, index, stream, grid, args, wparams, knobs, fixed, writes,
                   _hint(kernel, al, "occupancy"), _hint(kernel, al, "num_ctas"),
                   bool(calls(kernel.body, al.ct, *MMA_OPS)))


# ----------------------------------------------------------------------------------- rewrite

HELPERS = '''\
def _tune_space():
    major, _ = torch.cuda.get_device_capability()
    return _TUNE_SPACES["sm_100" if major == {blackwell} else "sm_90"]


def _scratch(value):
    """A copy of a tensor in new memory with the same layout (anything else as it is)."""
    if not isinstance(value, torch.Tensor):
        return value
    copy = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
    return copy.copy_(value)


def _tuned(*args):
    """(config, kernel with its hints) for {wrapper}(*args): tuned on the first call with a new input key
    (shapes, dtypes, strides and devices of the tensors, values of the scalars), cached after."""
    key = tuple((tuple(a.shape), a.dtype, a.stride(), a.device) if isinstance(a, torch.Tensor)
                else a if isinstance(a, (bool, int, float, str, type(None))) else type(a).__name__ for a in args)
    if key not in _TUNED:
        _TUNED[key] = _autotune(args)
    return _TUNED[key]


def _autotune(args):
    space = _tune_space()
    if os.environ.get("DISABLE_CUTILE_TUNE") == "1":  # TileGym convention: the first config, no tuning trials
        cfg = space[0]
    else:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("{wrapper}() met a new input key during CUDA-graph capture, where it cannot tune: "
                               "call it once with inputs of these shapes before capturing")
        tune_args = tuple(_scratch(a) if i in _TUNE_WRITES else a for i, a in enumerate(args))

        def part(i):
            return lambda cfg: _launch_plan(cfg, *tune_args)[i]

        result = {ct}.tune.exhaustive_search(space, {stream}, part(0), part(1), part(2),
                                           hints_fn=part(3), quiet=True)
        best = result.best
        # within the timing noise (the two 95% margins, or 2%) a config ties with the best; the
        # earliest tie wins (the kernel as it was first), so the pick does not flip between runs
        ties = [m for m in result.successes
                if m.mean_us - best.mean_us <= max(m.error_margin_us + best.error_margin_us, 0.02 * best.mean_us)]
        cfg = min(ties, key=lambda m: space.index(m.config)).config
    _, kernel, _, hints = _launch_plan(cfg, *args)
    return cfg, kernel.replace_hints(**hints)
'''


def _header(pat: Pattern, spaces: dict[str, Space]) -> str:
    kname = pat.kernel.name.value
    wname = pat.wrapper.name.value
    entries = "\n".join(f'    "{arch}": {space_code(s, " " * (len(arch) + 8))},' for arch, s in spaces.items())
    writes = ", ".join(pat.wrapper_params[i] for i in pat.writes) or "none"
    return (f"# cutile-autotune: {wname}() launches {kname} with the best config of _TUNE_SPACES for its input\n"
            f"# key, found on the first call for the key by ct.tune.exhaustive_search and cached in _TUNED. The\n"
            f"# first config of each space is the kernel as it was. \"sm_100\": sm_100/sm_103; \"sm_90\": other GPUs.\n"
            f"_TUNE_SPACES = {{\n{entries}\n}}\n"
            f"_TUNE_WRITES = {_tuple_code([str(i) for i in pat.writes])}  # {wname}() arguments the kernel writes "
            f"({writes}): tuned on scratch copies\n"
            f"_TUNED = {{}}  # input key -> (config, kernel with the config's hints)\n")


def _statements(code: str) -> list[cst.BaseStatement]:
    """The statements of `code`, comments before the first one kept (as its leading lines)."""
    return list(cst.parse_module("pass\n" + code).body[1:])


def _blank(n: int) -> list[cst.EmptyLine]:
    return [cst.EmptyLine()] * n


def rewrite(module: cst.Module, pat: Pattern, spaces: dict[str, Space]) -> str:
    wrapper = pat.wrapper
    body = list(wrapper.body.body)
    pre = body[:pat.launch_index]
    docstring = []
    if pre and isinstance(pre[0].body[0], cst.Expr):
        docstring, pre = [pre[0]], pre[1:]
    rest = body[pat.launch_index + 1:]
    code = module.code_for_node
    forward = ", ".join(pat.wrapper_params)

    plan_body: list[cst.BaseStatement] = _statements(
        '"""grid, kernel, kernel arguments and compiler hints of the launch under config `cfg`."""\n')
    if pat.knobs:
        names = list(pat.knobs)
        reads = ", ".join(f'cfg["{n}"]' for n in names)
        plan_body += _statements(f"{', '.join(names)} = {reads}\n")
    plan_body += [s.with_changes(leading_lines=()) if i == 0 else s for i, s in enumerate(pre)]
    plan_body += _statements(f"return ({code(pat.grid)}, {pat.kernel.name.value}, {code(pat.args)},\n"
                             f"        {{hint: cfg[hint] for hint in {HINTS!r} if hint in cfg}})\n".replace("'", '"'))
    plan_params = wrapper.params.with_changes(params=[cst.Param(cst.Name("cfg"), comma=cst.Comma(
        whitespace_after=cst.SimpleWhitespace(" "))), *wrapper.params.params])
    plan = wrapper.with_changes(name=cst.Name("_launch_plan"), params=plan_params, decorators=(),
                                body=wrapper.body.with_changes(body=plan_body), leading_lines=_blank(2))

    run_body = docstring + _statements(
        f"cfg, kernel = _tuned({forward})\n"
        f"grid, _, args, _ = _launch_plan(cfg, {forward})\n"
        f"{pat.al.ct}.launch({code(pat.stream)}, grid, kernel, args)\n") + rest
    run = wrapper.with_changes(body=wrapper.body.with_changes(body=run_body), leading_lines=_blank(2))

    header = _statements(_header(pat, spaces))
    header[0] = header[0].with_changes(leading_lines=[*wrapper.leading_lines, *header[0].leading_lines])
    helpers = _statements(HELPERS.format(blackwell=BLACKWELL_MAJOR, wrapper=wrapper.name.value, ct=pat.al.ct,
                                         stream=code(pat.stream)))
    helpers[0] = helpers[0].with_changes(leading_lines=_blank(2))

    new_body: list[cst.CSTNode] = []
    for stmt in module.body:
        if stmt is wrapper:
            new_body += [*header, *helpers, plan, run]
        else:
            new_body.append(stmt)
    new = module.with_changes(body=new_body)
    if not imports(module, "os"):
        new = _add_import_os(new)
    return checked(drop_constants(new, set(pat.knobs)).code)


def _add_import_os(module: cst.Module) -> cst.Module:
    """`import os` just before the first import that is not `from __future__`."""
    body = list(module.body)
    first = next(i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine) and (
        isinstance(s.body[0], cst.Import) or isinstance(s.body[0], cst.ImportFrom) and not (
            isinstance(s.body[0].module, cst.Name) and s.body[0].module.value == "__future__")))
    line = cst.parse_statement("import os\n").with_changes(leading_lines=body[first].leading_lines)
    body[first] = body[first].with_changes(leading_lines=_blank(1))  # the standard library in a group of its own
    return module.with_changes(body=[*body[:first], line, *body[first:]])


# ----------------------------------------------------------------------------------- recipe

HYPOTHESIS = ("per input shape, exhaustive_search picks the best of {what} ({n}) instead of one fixed config; "
              "TileGym playbook C reports +10-50% where the fixed config does not fit the shape; the current config "
              "is in the space and wins ties within noise, so ~0 where it already fits; each new shape pays one "
              "tuning run on its first call{note}")


@register
class CuTileAutotune(PatternRecipe):
    id = "cutile-autotune"
    title = "Autotune the launch with ct.tune.exhaustive_search over tile constants x occupancy (x num_ctas)"
    languages = ("cutile",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        pat = recognise(module)
        row_loop = len(pat.knobs) == 1 and not pat.mma and has_loop(pat.kernel)
        spaces = {arch: space(arch_for(a, row_loop), pat.knobs, pat.occupancy, pat.num_ctas, pat.mma)
                  for arch, a in ARCHS.items()}
        code = rewrite(module, pat, spaces)
        kname = pat.kernel.name.value
        axes = [" x ".join(pat.knobs)] if pat.knobs else []
        axes.append("occupancy")
        what = " x ".join(axes) + (" (x num_ctas on sm_100)" if spaces["sm_100"].num_ctas else "")
        sizes = ", ".join(f"{len(s)}{' configs' if i == 0 else ''} on {arch}"
                          for i, (arch, s) in enumerate(spaces.items()))
        note = ""
        if pat.fixed:
            note = "; fixed: " + ", ".join(f"{k} ({why})" for k, why in pat.fixed.items())
        elif not pat.knobs:
            note = "; no tile constant to vary (a whole-row tile is computed from the shape), occupancy only"
        return [Candidate(self.id, "autotune", f"{self.id}:{kname}",
                          f"{kname}: ct.tune.exhaustive_search over {what} ({sizes})",
                          HYPOTHESIS.format(what=what, n=sizes, note=note), code)]
