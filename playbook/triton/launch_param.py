"""Recipe `launch-param`: change one launch parameter or block-size constexpr by one step.

It finds Triton launches `kernel[grid](..., NAME=value)` and, for `num_warps`, `num_stages`
and power-of-two UPPERCASE constexprs (block sizes), proposes the next step up; one step down comes after every step up (tier 1), and two-step moves
up and down after those (tier 2: reached in overnight runs, where the early-stop rules are off). A value given
as a module-level constant (`BLOCK = 128`, used by both grid and launch) is changed at its
definition, so the grid stays consistent; a literal is changed in place. Rewrites use libcst,
so formatting and comments are preserved.

A launch that sets `num_warps` but not `num_stages`, of a kernel that has a loop, runs with the
backend's default number of stages (3 for both the PTX and the Tile IR backend of Triton 3.6);
for it the recipe proposes adding `num_stages=4`, the step up from that default. (Adding the
default itself, `num_stages=3`, would compile the same kernel and measure only noise.)

Only launches of kernels on the forward path of the entry point count (playbook/cst/program.py).
Values the wrapper states as literals count wherever the launch gets them: as `kw=128`, as a
module constant, or as a local assigned once (`BLOCK_ROW = 16`, passed as `BLOCK_ROW=BLOCK_ROW` or
through `**kernel_args`); the step rewrites that literal. A `num_warps` the wrapper computes
(`BLOCK_SIZE, num_warps = calculate_settings(n_cols)`) is scaled at the launch instead:
`num_warps=min(num_warps * 2, 32)` one step up, `max(num_warps // 2, 1)` one step down (tier 1),
and from a scaled launch the next factor (x4, x1/4, down to x1/8 and up to x8).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import aliases
from playbook.cst.constants import SetConstant, module_int_constants
from playbook.cst.edits import add_kwarg, has_kwarg, replace
from playbook.cst.kernels import has_loop, triton_kernels
from playbook.cst.launch_values import COMPUTED, CONSTANT, LOCAL, UNKNOWN, LaunchValue, launch_values, value_of
from playbook.cst.launches import Launch, triton_launches
from playbook.cst.source import Skip, code_of, parse, walk
from playbook.recipe import Candidate, PatternRecipe, off_path, off_path_reason, register, with_sweep

LIMITS = {"num_warps": 16, "num_stages": 5, "block": 16384}
FLOORS = {"num_warps": 1, "num_stages": 1, "block": 16}
DEFAULT_NUM_STAGES = 3  # Triton 3.6: CUDAOptions.num_stages, and TileIROptions.num_stages in nvtriton
ADDED_NUM_STAGES = DEFAULT_NUM_STAGES + 1
MAX_WARPS = 32  # Triton's limit on num_warps: a scaled computed value is clamped to it
FACTORS = (Fraction(1, 8), Fraction(8))  # how far a computed num_warps is scaled, down and up
SWEEP_DOUBLINGS, SWEEP_HALVINGS = 4, 2  # block sizes a sweep times up (x2 .. x16) and, as a second thought, down


@dataclass(frozen=True)
class Site:
    kw: str
    kind: str
    value: int
    constant: str | None  # module-level name holding the value, or None for a literal
    literal: cst.Integer | None = None  # the literal to rewrite (at the launch, or a wrapper local's assignment)
    local: str | None = None  # the wrapper local that holds it (`BLOCK_ROW = 16`)


def _kind(kw: str, value: int) -> str | None:
    if kw in ("num_warps", "num_stages"):
        return kw
    if kw.isupper() and value >= 16 and value & (value - 1) == 0:
        return "block"
    return None


def forward_launches(module: cst.Module, analysis: Analysis | None) -> tuple[list[Launch], list[str]]:
    """The launches of kernels on the entry point's forward path, and the kernels left out."""
    kernels = triton_kernels(module, aliases(module))
    left = off_path(kernels, analysis)
    return [launch for launch in triton_launches(module, kernels) if launch.kernel not in left], left


def _sites(module: cst.Module, launches: list[Launch]) -> tuple[list[Site], list[tuple[Launch, LaunchValue]]]:
    """The stepped values (the first launch that states each keyword), and the launches whose
    num_warps the wrapper computes."""
    constants = module_int_constants(module)
    sites: dict[str, Site] = {}
    computed: list[tuple[Launch, LaunchValue]] = []
    for launch in launches:
        values, _ = launch_values(launch, constants)
        for kw, v in values.items():
            if v.kind == COMPUTED:
                if kw == "num_warps" and v.via is None:
                    computed.append((launch, v))
                continue
            if v.kind == UNKNOWN:
                continue
            kind = _kind(kw, v.value)
            if kind and kw not in sites:
                sites[kw] = Site(kw, kind, v.value, v.name if v.kind == CONSTANT else None, v.literal,
                                 v.name if v.kind == LOCAL else None)
    return list(sites.values()), computed


HYPOTHESES = {  # kind -> (a step up, a step down)
    "block": ("{old} -> {new} elements per program: more bytes in flight and fewer programs; expect lower latency "
              "while the kernel is latency- or launch-bound (5-40%), a regression once registers spill",
              "{old} -> {new} elements per program: fewer registers per program and more programs; expect a gain "
              "where registers spilled or too few programs filled the GPU, a loss where bytes in flight were the "
              "limit"),
    "num_warps": ("{old} -> {new} warps: more threads to issue loads and hide memory latency; expect 5-30% on "
                  "memory-bound shapes, none once bandwidth is saturated",
                  "{old} -> {new} warps: fewer threads per program, more registers each and more programs resident; "
                  "expect a gain where warps sat idle (narrow rows), a loss where memory latency was hidden by them"),
    "num_stages": ("{old} -> {new} pipeline stages: deeper software pipelining of loads in loops; expect a small gain "
                   "(2-10%) on looped loads, a regression if shared memory runs out",
                   "{old} -> {new} pipeline stages: shallower software pipelining, less shared memory; expect a gain "
                   "where shared memory limited residency, a small loss on looped loads otherwise"),
}


def hypothesis(kind: str, old: object, new: object, up: bool) -> str:
    """The hypothesis of a step, in its direction (a step down has fewer warps, not more)."""
    return HYPOTHESES[kind][0 if up else 1].format(old=old, new=new)


def _next_value(site: Site) -> int | None:
    new = site.value + 1 if site.kind == "num_stages" else site.value * 2
    return new if new <= LIMITS[site.kind] else None


def _jumps(site: Site) -> list[int]:
    """Two steps up and two steps down: wider moves, tried only after every one-step move
    (overnight exploration, when the early-stop rules are off), in case one step sits in a dip."""
    if site.kind == "num_stages":
        values = [site.value + 2, site.value - 2]
    else:
        values = [site.value * 4, site.value // 4]
    return [v for v in values if FLOORS[site.kind] <= v <= LIMITS[site.kind]]


def _sweep_values(site: Site, new: int, tier: int, climbs: bool) -> list[int]:
    """The values a step's sweep times, the step's own first; [] for a step that sweeps nothing.
    Block sizes: the step up and three more doublings, within the limit; the step down (a second
    thought) and one more halving, within the floor. num_warps and num_stages: every other allowed
    value, up first, on the step up (or on the step down of a value at its limit)."""
    if tier == 2 or (tier == 1 and climbs and site.kind != "block"):
        return []
    if site.kind == "block":
        factor = 2 if new > site.value else 0.5
        values = [int(new * factor ** i) for i in range(SWEEP_DOUBLINGS if factor == 2 else SWEEP_HALVINGS)]
        return [v for v in values if FLOORS["block"] <= v <= LIMITS["block"]]
    allowed = ([FLOORS["num_warps"] << i for i in range(LIMITS["num_warps"].bit_length())] if site.kind == "num_warps"
               else list(range(FLOORS["num_stages"], LIMITS["num_stages"] + 1)))
    up = [v for v in allowed if v > site.value]
    down = [v for v in reversed(allowed) if v < site.value]
    return [new] + [v for v in (up + down if new > site.value else down + up) if v != new]


def _rewrite(module: cst.Module, site: Site, new: int) -> str:
    """The target with `site` set to `new` (at the module constant, or the literal itself); it must parse."""
    if site.constant:
        code = module.visit(SetConstant(site.constant, new)).code
    else:
        code = replace(module, {site.literal: cst.Integer(str(new))}).code
    cst.parse_module(code)
    return code


def _prev_value(site: Site) -> int | None:
    """One step down: after climbing, the best point may lie between; never below the floors."""
    new = site.value - 1 if site.kind == "num_stages" else site.value // 2
    return new if new >= FLOORS[site.kind] else None


def _scaled(expr: cst.BaseExpression) -> tuple[cst.BaseExpression, Fraction]:
    """A computed num_warps as (what the wrapper computes, factor): `min(E * k, 32)` -> (E, k),
    `max(E // k, 1)` -> (E, 1/k), anything else -> (itself, 1)."""
    if (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value in ("min", "max")
            and len(expr.args) == 2 and isinstance(expr.args[1].value, cst.Integer)
            and isinstance(expr.args[0].value, cst.BinaryOperation)
            and isinstance(expr.args[0].value.right, cst.Integer)):
        inner, k = expr.args[0].value, int(expr.args[0].value.right.evaluated_value)
        if expr.func.value == "min" and isinstance(inner.operator, cst.Multiply) and k > 1:
            return inner.left, Fraction(k)
        if expr.func.value == "max" and isinstance(inner.operator, cst.FloorDivide) and k > 1:
            return inner.left, Fraction(1, k)
    return expr, Fraction(1)


def _factor_text(f: Fraction) -> str:
    return f"x{f.numerator}" + (f"/{f.denominator}" if f.denominator != 1 else "")


def _scaled_code(base: str, f: Fraction) -> str:
    if f > 1:
        return f"min({base} * {f.numerator}, {MAX_WARPS})"
    if f < 1:
        return f"max({base} // {f.denominator}, 1)"
    return base


@register
class LaunchParam(PatternRecipe):
    id = "launch-param"
    title = "One launch parameter or block-size constexpr, one step up"
    languages = ("triton",)

    def sites(self, source: str, analysis: Analysis | None = None) -> list[Site]:
        module = parse(source)
        return _sites(module, forward_launches(module, analysis)[0])[0]

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        launches, left = forward_launches(module, analysis)
        if not launches:
            raise Skip(off_path_reason(left, analysis) if left else "no launch of a @triton.jit kernel")
        sites, computed = _sites(module, launches)
        out = self._steps(source, module, sites)
        for launch, value in computed:
            out.extend(self._computed_warps(module, launch, value))
        if not any(c.kind == "num_stages" for c in out):
            out.extend(self.added_stages(module, launches))
        if not out:
            raise Skip("no launch on the forward path sets num_warps, num_stages or a power-of-two block constexpr "
                       "that a step can change (each is at its limit, or none is set)")
        return out

    def _steps(self, source: str, module: cst.Module, sites: list[Site]) -> list[Candidate]:
        out = []
        steps = [(site, _next_value(site), 0) for site in sites]
        steps += [(site, _prev_value(site), 1) for site in sites]  # step-downs: after every step-up
        steps += [(site, v, 2) for site in sites for v in _jumps(site)]  # wider moves: last
        for site, new, tier in steps:
            if new is None:
                continue
            rewritten = _rewrite(module, site, new)
            if rewritten == source:
                continue
            label = site.constant or site.local or site.kw
            cand = Candidate(self.id, site.kind, f"{self.id}:{site.kw}={new}", f"{label} {site.value} -> {new}",
                             hypothesis(site.kind, site.value, new, new > site.value)
                             + (" (a two-step move, tried after every one-step move)" if tier == 2 else ""),
                             rewritten, tier)
            values = _sweep_values(site, new, tier, _next_value(site) is not None)
            out.append(with_sweep(cand, label, site.value, f"{self.id}:{site.kw}",
                                  [(v, f"{self.id}:{site.kw}={v}", _rewrite(module, site, v)) for v in values],
                                  hypothesis(site.kind, site.value, "{" + ",".join(map(str, values)) + "}",
                                             new > site.value)))
        return out

    def _computed_warps(self, module: cst.Module, launch: Launch, value: LaunchValue) -> list[Candidate]:
        """num_warps the wrapper computes, scaled at the launch: twice (tier 0), half (tier 1)."""
        base, factor = _scaled(value.expr)
        origin = value_of("num_warps", base, launch.wrapper, module_int_constants(module), None).origin
        base_code = code_of(base) if isinstance(base, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) \
            else f"({code_of(base)})"
        out = []
        for new, tier in ((factor * 2, 0), (factor / 2, 1)):
            if not FACTORS[0] <= new <= FACTORS[1]:
                continue
            arg = next(a for a in launch.call.args if a.keyword is not None and a.keyword.value == "num_warps")
            code = replace(module, {arg.value: cst.parse_expression(_scaled_code(base_code, new))}).code
            cst.parse_module(code)
            up = new > factor
            out.append(Candidate(
                self.id, "num_warps", f"{self.id}:{launch.kernel}:num_warps={_factor_text(new)}",
                f"{launch.kernel}: num_warps {_factor_text(factor)} -> {_factor_text(new)} of what the wrapper "
                f"computes ({origin}), within 1-{MAX_WARPS}",
                hypothesis("num_warps", f"{_factor_text(factor)} of {origin}", _factor_text(new), up), code, tier))
        return out

    def current_keys(self, source: str) -> list[str]:
        """Keys of the values the source already has: a kept version's values are never proposed again."""
        module = parse(source)
        launches = forward_launches(module, None)[0]
        sites, computed = _sites(module, launches)
        return ([f"{self.id}:{site.kw}={site.value}" for site in sites]
                + [f"{self.id}:{launch.kernel}:num_warps={_factor_text(_scaled(v.expr)[1])}" for launch, v in computed])

    def added_stages(self, module: cst.Module, launches: list[Launch]) -> list[Candidate]:
        """`num_stages=4` added to the first launch that sets num_warps but not num_stages, of a
        kernel with a loop (software pipelining needs a loop to pipeline)."""
        kernels = triton_kernels(module, aliases(module))
        for launch in launches:
            call = launch.call
            if has_kwarg(call, "num_warps") and not has_kwarg(call, "num_stages") and has_loop(kernels[launch.kernel]):
                new = ADDED_NUM_STAGES
                code = replace(module, {call: lambda upd: add_kwarg(upd, "num_stages", cst.Integer(str(new)))}).code
                cst.parse_module(code)
                hyp = hypothesis("num_stages", f"{DEFAULT_NUM_STAGES} (default)", new, True)
                if not any(n.attr.value == "dot" for n in walk(kernels[launch.kernel].body)
                           if isinstance(n, cst.Attribute)):
                    hyp = (f"{DEFAULT_NUM_STAGES} (default) -> {new} stages on a loop without tl.dot: Triton 3.6's "
                           f"PTX backend does not pipeline such loops (identical code, ~0 expected there); the "
                           f"Tile IR backend takes num_stages as a cost hint: expect 0-5% there")
                return [Candidate(self.id, "num_stages", f"{self.id}:num_stages={new}",
                                  f"{launch.kernel}: num_stages (default {DEFAULT_NUM_STAGES}) -> {new}", hyp, code)]
        return []
