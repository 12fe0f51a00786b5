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
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import aliases
from playbook.cst.constants import SetConstant, module_int_constants
from playbook.cst.edits import add_kwarg, has_kwarg, replace
from playbook.cst.kernels import has_loop, triton_kernels
from playbook.cst.launches import triton_launches
from playbook.cst.source import walk
from playbook.recipe import Candidate, register

LIMITS = {"num_warps": 16, "num_stages": 5, "block": 16384}
DEFAULT_NUM_STAGES = 3  # Triton 3.6: CUDAOptions.num_stages, and TileIROptions.num_stages in nvtriton
ADDED_NUM_STAGES = DEFAULT_NUM_STAGES + 1


@dataclass(frozen=True)
class Site:
    kw: str
    kind: str
    value: int
    constant: str | None  # module-level name holding the value, or None for a literal


def _kind(kw: str, value: int) -> str | None:
    if kw in ("num_warps", "num_stages"):
        return kw
    if kw.isupper() and value >= 16 and value & (value - 1) == 0:
        return "block"
    return None


class _Collect(cst.CSTVisitor):
    def __init__(self, constants: dict[str, int]):
        self.constants = constants
        self.sites: dict[str, Site] = {}

    def visit_Call(self, node: cst.Call) -> None:
        if not isinstance(node.func, cst.Subscript):  # kernel[grid](...)
            return
        for arg in node.args:
            if arg.keyword is None:
                continue
            kw = arg.keyword.value
            if isinstance(arg.value, cst.Integer):
                value, const = int(arg.value.evaluated_value), None
            elif isinstance(arg.value, cst.Name) and arg.value.value in self.constants:
                const = arg.value.value
                value = self.constants[const]
            else:
                continue
            kind = _kind(kw, value)
            if kind and kw not in self.sites:
                self.sites[kw] = Site(kw, kind, value, const)


class _SetLiteral(cst.CSTTransformer):
    """Rewrite the literal keyword of the first launch that has it (the site `_Collect` found):
    one candidate changes one launch, never every launch that happens to use the same name."""

    def __init__(self, kw: str, value: int):
        self.kw, self.value, self.first = kw, value, None

    def _matches(self, node: cst.Call) -> bool:
        return isinstance(node.func, cst.Subscript) and any(
            a.keyword is not None and a.keyword.value == self.kw and isinstance(a.value, cst.Integer) for a in node.args)

    def visit_Call(self, node: cst.Call) -> bool:
        if self.first is None and self._matches(node):
            self.first = node
        return True

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if original is not self.first:
            return updated
        args = [a.with_changes(value=cst.Integer(str(self.value)))
                if a.keyword is not None and a.keyword.value == self.kw and isinstance(a.value, cst.Integer) else a
                for a in updated.args]
        return updated.with_changes(args=args)


HYPOTHESES = {
    "block": "{old} -> {new} elements per program: more bytes in flight and fewer programs; expect lower latency while the "
             "kernel is latency- or launch-bound (5-40%), a regression once registers spill",
    "num_warps": "{old} -> {new} warps: more threads to issue loads and hide memory latency; expect 5-30% on "
                 "memory-bound shapes, none once bandwidth is saturated",
    "num_stages": "{old} -> {new} pipeline stages: deeper software pipelining of loads in loops; expect a small gain "
                  "(2-10%) on looped loads, a regression if shared memory runs out",
}


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


def _prev_value(site: Site) -> int | None:
    """One step down: after climbing, the best point may lie between; never below the floors."""
    new = site.value - 1 if site.kind == "num_stages" else site.value // 2
    return new if new >= FLOORS[site.kind] else None


FLOORS = {"num_warps": 1, "num_stages": 1, "block": 16}


@register
class LaunchParam:
    id = "launch-param"
    title = "One launch parameter or block-size constexpr, one step up"
    languages = ("triton",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language == "triton"

    def sites(self, source: str) -> list[Site]:
        module = cst.parse_module(source)
        collector = _Collect(module_int_constants(module))
        module.visit(collector)
        return list(collector.sites.values())

    def candidates(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = cst.parse_module(source)
        out = []
        steps = [(site, _next_value(site), 0) for site in self.sites(source)]
        steps += [(site, _prev_value(site), 1) for site in self.sites(source)]  # step-downs: after every step-up
        steps += [(site, v, 2) for site in self.sites(source) for v in _jumps(site)]  # wider moves: last
        for site, new, tier in steps:
            if new is None:
                continue
            transformer = SetConstant(site.constant, new) if site.constant else _SetLiteral(site.kw, new)
            rewritten = module.visit(transformer).code
            if rewritten == source:
                continue
            cst.parse_module(rewritten)  # the rewrite must parse
            label = site.constant or site.kw
            out.append(Candidate(self.id, site.kind, f"{self.id}:{site.kw}={new}", f"{label} {site.value} -> {new}",
                                 HYPOTHESES[site.kind].format(old=site.value, new=new)
                                 + (" (a two-step move, tried after every one-step move)" if tier == 2 else ""), rewritten, tier))
        if not any(c.kind == "num_stages" for c in out):
            out.extend(self.added_stages(source, module))
        return out

    def current_keys(self, source: str) -> list[str]:
        """Keys of the values the source already has: a kept version's values are never proposed again."""
        return [f"{self.id}:{site.kw}={site.value}" for site in self.sites(source)]

    def added_stages(self, source: str, module: cst.Module) -> list[Candidate]:
        """`num_stages=4` added to the first launch that sets num_warps but not num_stages, of a
        kernel with a loop (software pipelining needs a loop to pipeline)."""
        kernels = triton_kernels(module, aliases(module))
        for launch in triton_launches(module, kernels):
            call = launch.call
            if has_kwarg(call, "num_warps") and not has_kwarg(call, "num_stages") and has_loop(kernels[launch.kernel]):
                new = ADDED_NUM_STAGES
                code = replace(module, {call: lambda upd: add_kwarg(upd, "num_stages", cst.Integer(str(new)))}).code
                cst.parse_module(code)
                hypothesis = HYPOTHESES["num_stages"].format(old=f"{DEFAULT_NUM_STAGES} (default)", new=new)
                if not any(n.attr.value == "dot" for n in walk(kernels[launch.kernel].body)
                           if isinstance(n, cst.Attribute)):
                    hypothesis = (f"{DEFAULT_NUM_STAGES} (default) -> {new} stages on a loop without tl.dot: Triton 3.6's "
                                  f"PTX backend does not pipeline such loops (identical code, ~0 expected there); the "
                                  f"Tile IR backend takes num_stages as a cost hint: expect 0-5% there")
                return [Candidate(self.id, "num_stages", f"{self.id}:num_stages={new}",
                                  f"{launch.kernel}: num_stages (default {DEFAULT_NUM_STAGES}) -> {new}", hypothesis, code)]
        return []
