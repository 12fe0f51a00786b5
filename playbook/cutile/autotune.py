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

The space (see `tune_space.space`): tile constants x occupancy, and on Blackwell x num_ctas for
MMA kernels. A tile constant is an UPPERCASE power-of-two module int passed to `ct.launch` for a
`ct.Constant` parameter and read nowhere but in the wrapper. One that the kernel uses as the
shape of a load at tile index 0 along that axis (it reads the first tile only, so the tile must
cover the whole axis) is not a free knob and stays fixed; a whole-row tile computed at runtime
(`next_power_of_2(cols)`) is not a constant and is never varied either.

Tuning runs the kernel many times: arguments the kernel writes are tuned on scratch copies of
the wrapper's arguments they come from (`_TUNE_WRITES`), so the caller's data is never touched,
whatever aliasing the caller sets up (an `out` that is also an input is a runtime property that a
static check of the wrapper cannot see; which arguments the kernel writes is static).

This module recognises the pattern; tune_space.py holds the space, tuned_launch.py the code the
rewrite writes.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases, aliases, calls, is_attr
from playbook.cst.constants import module_int_constants
from playbook.cst.edits import kwarg_value
from playbook.cst.imports import imports
from playbook.cst.kernels import cutile_kernels, has_loop, is_ct_kernel, params
from playbook.cst.launches import imports_of, is_cutile_launch
from playbook.cst.names import assignments, global_references, names_in
from playbook.cst.source import Skip, parse, walk
from playbook.cutile.kernels import MMA_OPS
from playbook.cutile.tune_space import ARCHS, BLACKWELL_MAJOR, arch_for, space
# the limits and knobs of the space, read together with the recipe that tunes over it
from playbook.cutile.tune_space import HINTS, MAX_CONFIGS, ROW_LOOP_TILE_MAX, owned_knobs  # noqa: F401
from playbook.cutile.tuned_launch import HELPER_NAMES, RUN_LOCALS, Pattern, rewrite
from playbook.recipe import Candidate, PatternRecipe, on_path, register

WRITE_OPS = ("store", "scatter")  # plus every ct.atomic_*


def _pow2(v: int) -> bool:
    return v >= 16 and v & (v - 1) == 0


# ----------------------------------------------------------------------------------- pattern


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


def _module_checks(module: cst.Module) -> tuple[Aliases, dict[str, cst.FunctionDef]]:
    """The aliases and @ct.kernel functions of a module the tuned launch can be written into."""
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
    return al, kernels


def _launch_statement(module: cst.Module, al: Aliases, kernels: dict[str, cst.FunctionDef]
                      ) -> tuple[cst.Call, cst.FunctionDef, list[cst.BaseStatement], int]:
    """The one ct.launch, the module-level wrapper holding it, the wrapper's body and the index of
    the launch statement in it."""
    imported = imports_of(al)
    launches = [n for n in walk(module) if is_cutile_launch(n, imported)]
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
    return launch, wrapper, body, index


def _wrapper_checks(module: cst.Module, wrapper: cst.FunctionDef, body: list[cst.BaseStatement], index: int
                    ) -> tuple[list[str], dict[str, list[cst.BaseExpression]], set[str]]:
    """The wrapper's parameters, its assignments and its locals, after checking that it only
    computes launch arguments before the launch (it runs once per tuned config) and at most
    returns its arguments after it."""
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
    return wparams, assigned, locals_


def _tile_knobs(module: cst.Module, al: Aliases, wrapper: cst.FunctionDef, kernel: cst.FunctionDef,
                args: cst.BaseExpression) -> tuple[dict[str, int], dict[str, str]]:
    """The tile constants the space varies (name -> current value, in launch order), and the
    tile-like constants it leaves fixed (name -> why)."""
    constants = module_int_constants(module)
    refs = global_references(module)
    in_wrapper = set(walk(wrapper))
    knobs: dict[str, int] = {}
    fixed: dict[str, str] = {}
    for el, kp in zip(args.elements, params(kernel)):
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
    return knobs, fixed


def recognise(module: cst.Module) -> Pattern:
    al, kernels = _module_checks(module)
    launch, wrapper, body, index = _launch_statement(module, al, kernels)
    wparams, assigned, locals_ = _wrapper_checks(module, wrapper, body, index)
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
    knobs, fixed = _tile_knobs(module, al, wrapper, kernel, args)

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
        on_path({pat.kernel.name.value: pat.kernel}, analysis)
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
                          HYPOTHESIS.format(what=what, n=sizes, note=note), code, configs=_configs(spaces, analysis))]


def _configs(spaces: dict, analysis: Analysis) -> int:
    """The configs the search times on the run's architecture (the largest space where it is not known)."""
    if analysis.capability is None:
        return max(len(s) for s in spaces.values())
    return len(spaces["sm_100" if analysis.capability // 10 == BLACKWELL_MAJOR else "sm_90"])
