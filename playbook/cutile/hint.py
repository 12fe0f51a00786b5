"""Recipe `cutile-hint`: one cuTile compiler hint or tile-size constant, one step up.

* `occupancy` on `@ct.kernel` (expected CTAs per SM, 1..32; cuTile leaves it to the compiler,
  which tends to pick 1 for one-row-per-block kernels and leaves most of the chip idle): x2.
* UPPERCASE power-of-two module constants passed to `ct.launch(...)` as kernel arguments
  (tile sizes, used by the grid too): x2.

Each step carries a sweep (`playbook.recipe.Sweep`) that the loop times in one experiment: occupancy
over every other allowed value (1..32, the step up first), a tile size over x2, x4, x8, x16 (up to
MAX_TILE).

Knobs that an autotune space of the target owns (`cutile-autotune`: its `_TUNE_SPACES` configs)
are left to the tuner: a hand step on them would be overridden by, or fight, the tuned choice.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases, aliases
from playbook.cst.constants import SetConstant, module_int_constants
from playbook.cst.kernels import is_ct_kernel
from playbook.cst.launches import cutile_launch_argument, imports_of, is_cutile_launch
from playbook.cutile.tune_space import owned_knobs
from playbook.recipe import Candidate, register, with_sweep

MAX_OCCUPANCY = 32
MAX_TILE = 4096
SWEEP_DOUBLINGS = 4  # tile sizes a sweep times: x2 .. x16


def _occupancy(dec: cst.Decorator) -> int | None:
    """Current occupancy hint: an int, 0 when absent (the compiler's choice), None if not a literal."""
    if not isinstance(dec.decorator, cst.Call):
        return 0
    for arg in dec.decorator.args:
        if arg.keyword is not None and arg.keyword.value == "occupancy":
            return int(arg.value.evaluated_value) if isinstance(arg.value, cst.Integer) else None
    return 0


class _SetOccupancy(cst.CSTTransformer):
    def __init__(self, kernel: str, value: int, al: Aliases):
        self.kernel, self.value, self.al = kernel, value, al

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if updated.name.value != self.kernel:
            return updated
        decs = []
        for dec in updated.decorators:
            if is_ct_kernel(dec, self.al):
                new_arg = cst.Arg(keyword=cst.Name("occupancy"), value=cst.Integer(str(self.value)),
                                  equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                        whitespace_after=cst.SimpleWhitespace("")))
                if isinstance(dec.decorator, cst.Call):
                    args = [a for a in dec.decorator.args if not (a.keyword is not None and a.keyword.value == "occupancy")]
                    if args:
                        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    dec = dec.with_changes(decorator=dec.decorator.with_changes(args=[*args, new_arg]))
                else:
                    dec = dec.with_changes(decorator=cst.Call(func=dec.decorator, args=[new_arg]))
            decs.append(dec)
        return updated.with_changes(decorators=decs)


class _LaunchConstants(cst.CSTVisitor):
    """UPPERCASE module constants passed as kernel arguments in ct.launch(stream, grid, kernel, (args))."""

    def __init__(self, constants: dict[str, int], al: Aliases):
        self.constants, self.found, self.imports = constants, {}, imports_of(al)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.constants or not is_cutile_launch(node, self.imports):
            return
        args = cutile_launch_argument(node, "args")
        if isinstance(args, (cst.Tuple, cst.List)):
            for el in args.elements:
                if isinstance(el.value, cst.Name) and el.value.value in self.constants:
                    name, value = el.value.value, self.constants[el.value.value]
                    if name.isupper() and value >= 16 and value & (value - 1) == 0:
                        self.found[name] = value


@register
class CuTileHint:
    id = "cutile-hint"
    title = "One cuTile hint (occupancy) or tile-size constant, one step up"
    languages = ("cutile",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language == "cutile"

    def candidates(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = cst.parse_module(source)
        al, owned = aliases(module), owned_knobs(module)
        out = []
        for stmt in module.body:
            if not isinstance(stmt, cst.FunctionDef):
                continue
            if not analysis.on_path(stmt.name.value):
                continue  # a kernel the entry point's forward path never launches
            for dec in stmt.decorators:
                if not is_ct_kernel(dec, al):
                    continue
                occ = _occupancy(dec)
                if occ is None or max(occ * 2, 2) > MAX_OCCUPANCY or "occupancy" in owned:
                    continue
                new, old = max(occ * 2, 2), str(occ) if occ else "auto"
                kernel = stmt.name.value
                code = module.visit(_SetOccupancy(kernel, new, al)).code
                cand = Candidate(self.id, "occupancy", f"{self.id}:{kernel}.occupancy={new}",
                                 f"{kernel} occupancy {old} -> {new}",
                                 f"occupancy {old} -> {new}: more CTAs resident per SM to hide memory latency; expect "
                                 f"large gains while blocks are latency-bound (one block per SM leaves bandwidth "
                                 f"unused), none once bandwidth saturates or registers run out", code)
                values = occupancy_sweep(occ)
                out.append(with_sweep(cand, f"{kernel} occupancy", old, f"{self.id}:{kernel}.occupancy",
                                      [(v, f"{self.id}:{kernel}.occupancy={v}",
                                        module.visit(_SetOccupancy(kernel, v, al)).code) for v in values],
                                      f"occupancy {old} -> each of {{{','.join(map(str, values))}}}: the CTAs per SM "
                                      f"that hide memory latency best without running out of registers"))
        consts = _LaunchConstants(module_int_constants(module), al)
        module.visit(consts)
        for name, value in consts.found.items():
            if value * 2 > MAX_TILE or name in owned:
                continue
            code = module.visit(SetConstant(name, value * 2)).code
            cand = Candidate(self.id, "block", f"{self.id}:{name}={value * 2}", f"{name} {value} -> {value * 2}",
                             f"tile {value} -> {value * 2}: more data per block, fewer blocks; expect 5-40% while "
                             f"the kernel is latency-bound", code)
            values = tile_sweep(value)
            out.append(with_sweep(cand, name, value, f"{self.id}:{name}",
                                  [(v, f"{self.id}:{name}={v}", module.visit(SetConstant(name, v)).code)
                                   for v in values],
                                  f"tile {value} -> each of {{{','.join(map(str, values))}}}: more data per block, fewer "
                                  f"blocks; expect 5-40% while the kernel is latency-bound, up to the size where "
                                  f"registers spill"))
        for c in out:
            for s in [c.source] + [v.source for v in (c.sweep.values if c.sweep else ())]:
                cst.parse_module(s)
        return out

    def current_keys(self, source: str) -> list[str]:
        """Keys of the values the source already has (occupancy stated on a kernel, tile constants at
        the launch): a kept version's values are never proposed again, by a step or a sweep."""
        module = cst.parse_module(source)
        al, keys = aliases(module), []
        for stmt in module.body:
            if isinstance(stmt, cst.FunctionDef):
                for dec in stmt.decorators:
                    if is_ct_kernel(dec, al) and (occ := _occupancy(dec)):
                        keys.append(f"{self.id}:{stmt.name.value}.occupancy={occ}")
        consts = _LaunchConstants(module_int_constants(module), al)
        module.visit(consts)
        return keys + [f"{self.id}:{name}={value}" for name, value in consts.found.items()]


def occupancy_sweep(occ: int) -> list[int]:
    """Occupancies a sweep times from `occ` (0: the compiler's choice): the step up first, then every
    other allowed power of two, up before down."""
    allowed = [1 << i for i in range(MAX_OCCUPANCY.bit_length())]
    first = max(occ * 2, 2)
    up = [v for v in allowed if v > max(occ, 1) and v != first]
    down = [v for v in reversed(allowed) if v < occ or (occ == 0 and v == 1)]  # from auto, 1 comes last
    return [first] + up + down


def tile_sweep(value: int) -> list[int]:
    """Tile sizes a sweep times from `value`: x2, x4, x8, x16 within MAX_TILE (smaller tiles are not swept:
    the recipe only steps up)."""
    return [value << i for i in range(1, SWEEP_DOUBLINGS + 1) if value << i <= MAX_TILE]
