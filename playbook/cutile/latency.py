"""Recipe `cutile-latency` (TileGym playbook E): `latency=N` on `ct.load` of streaming inputs
(the load's index depends on the block id); one candidate per N in 2, 4, 8 that is not already
in place."""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import calls, is_call
from playbook.cst.edits import add_kwarg, kwarg_value, replace
from playbook.cst.kernels import ct_kernels
from playbook.cst.names import assignments, depends_on
from playbook.cst.source import Skip, checked, parse, walk
from playbook.cutile.kernels import array_name
from playbook.recipe import Candidate, PatternRecipe, on_path, register

LATENCIES = (2, 4, 8)


def bid_names(fn: cst.FunctionDef, ct: str) -> set[str]:
    assigned = assignments(fn)
    return {name for name, values in assigned.items() if any(is_call(n, ct, "bid") for v in values for n in walk(v))}


def _index(call: cst.Call) -> cst.BaseExpression | None:
    value = kwarg_value(call, "index")
    if value is None and len(call.args) > 1 and call.args[1].keyword is None:
        value = call.args[1].value
    return value


@register
class CuTileLatency(PatternRecipe):
    id = "cutile-latency"
    title = "latency=N hints (2, 4, 8) on ct.load of streaming inputs"
    languages = ("cutile",)

    def streaming_loads(self, module: cst.Module, analysis: Analysis | None = None) -> list[cst.Call]:
        al, kernels = ct_kernels(module)
        kernels = on_path(kernels, analysis)
        out = []
        for fn in kernels.values():
            roots = bid_names(fn, al.ct)
            assigned = assignments(fn)
            for call in calls(fn.body, al.ct, "load"):
                index = _index(call)
                if index is not None and (any(is_call(n, al.ct, "bid") for n in walk(index))
                                          or depends_on(index, assigned, roots)):
                    out.append(call)
        return out

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        loads = self.streaming_loads(module, analysis)
        if not loads:
            raise Skip("no ct.load whose index depends on the block id")
        current = set()
        for call in loads:
            value = kwarg_value(call, "latency")
            if value is not None and not isinstance(value, cst.Integer):
                raise Skip("a streaming load has a non-literal latency")
            current.add(int(value.evaluated_value) if value is not None else None)
        arrays = ", ".join(dict.fromkeys(array_name(c) for c in loads))
        out = []
        for n in LATENCIES:
            if current == {n}:
                continue
            code = checked(replace(module, {c: (lambda upd, n=n: add_kwarg(upd, "latency", cst.Integer(str(n))))
                                            for c in loads}).code)
            now = "/".join(sorted("none" if v is None else str(v) for v in current))
            out.append(Candidate(self.id, "latency", f"{self.id}:latency={n}",
                                 f"ct.load latency {now} -> {n} on {len(loads)} streaming load(s) ({arrays})",
                                 f"latency hint {n} on the loads of {arrays}: tells the scheduler how far ahead to issue "
                                 f"them; expect -5..+6% (H200: layernorm +6% at 4-8), a large regression on loads inside "
                                 f"a loop (row_sum 0.3-0.9x)", code))
        if not out:
            raise Skip("every latency value is already in place")
        return out
