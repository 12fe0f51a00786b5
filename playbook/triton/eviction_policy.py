"""Recipe `eviction-policy`: `eviction_policy="evict_first"` on loads of streaming data.

Data that a program reads once and no other program reads again gains nothing from staying in
L2; marking it evict-first leaves L2 to data that is reused. Which loads qualify:

* element-wise kernels: every `tl.load` (each element is read once, by one program);
* reductions and norm-like kernels: loads of a buffer that the kernel reads at one site only,
  at an address that depends on the program id (a row read in one pass). Buffers read by every
  program (a weight vector) or read again in a later pass (softmax, layernorm) are left alone;
* dot kernels: none (their tiles are re-read by other programs).

Loads that already carry an eviction policy are left alone, and so are loads with a
`cache_modifier` (ptxas refuses a cache operator and an eviction priority on one load), and kernels that the entry
point's forward path does not launch (a backward kernel). A load's buffer is the kernel parameter
its address is computed from, through local assignments, `ptr += ...` and block pointers
(playbook/cst/memory.py).
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import aliases, calls, is_call
from playbook.cst.edits import add_kwarg, has_kwarg, replace
from playbook.cst.kernels import params, triton_kernels
from playbook.cst.memory import bindings, pointer_base
from playbook.cst.names import assignments, depends_on
from playbook.cst.source import Skip, checked, parse, walk
from playbook.recipe import Candidate, PatternRecipe, off_path, off_path_reason, register

POLICY = "evict_first"


@register
class EvictionPolicy(PatternRecipe):
    id = "eviction-policy"
    title = 'eviction_policy="evict_first" on loads of data read once (streaming)'
    languages = ("triton",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language == "triton" and analysis.kernel_class != "dot"

    def streaming_loads(self, module: cst.Module, analysis: Analysis) -> list[cst.Call]:
        al = aliases(module)
        if not al.tl:
            raise Skip("needs `import triton.language as tl`")
        kernels = triton_kernels(module, al)
        if not kernels:
            raise Skip("no @triton.jit kernel")
        left = off_path(kernels, analysis)
        if len(left) == len(kernels):
            raise Skip(off_path_reason(left, analysis))
        out: list[cst.Call] = []
        for fn in (f for name, f in kernels.items() if name not in left):
            loads = [c for c in calls(fn.body, al.tl, "load") if c.args and c.args[0].keyword is None]
            if analysis.kernel_class == "element-wise":
                out.extend(loads)
                continue
            assigned = assignments(fn)
            bound = bindings(fn)
            pointers = {p.name.value for p in params(fn)}
            pid = {name for name, values in assigned.items()
                   if any(is_call(n, al.tl, "program_id") for v in values for n in walk(v))}
            bases = [pointer_base(c.args[0].value, bound, pointers, al.tl) for c in loads]
            for call, base in zip(loads, bases):
                if base is not None and bases.count(base) == 1 and depends_on(call.args[0].value, assigned, pid):
                    out.append(call)
        return out

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        if analysis.kernel_class == "dot":
            raise Skip("dot kernels re-read their tiles from other programs: not streaming")
        module = parse(source)
        streaming = [c for c in self.streaming_loads(module, analysis) if not has_kwarg(c, "eviction_policy")]
        # PTX has no load with both a cache operator (.ca, .cg, .cs, ...) and an eviction priority:
        # ptxas rejects `ld.global.ca.L1::evict_first` ("cannot be combined")
        loads = [c for c in streaming if not has_kwarg(c, "cache_modifier")]
        if not loads:
            raise Skip("no streaming tl.load without an eviction policy" + (
                f" ({len(streaming)} carry a cache_modifier, which PTX cannot combine with an eviction policy)"
                if streaming else ""))
        mapping = {c: (lambda upd: add_kwarg(upd, "eviction_policy", cst.SimpleString(f'"{POLICY}"'))) for c in loads}
        code = checked(replace(module, mapping).code)
        return [Candidate(self.id, "eviction", f"{self.id}:{POLICY}",
                          f'eviction_policy="{POLICY}" on {len(loads)} streaming load(s)',
                          f"{len(loads)} load(s) of data read once marked evict-first: L2 keeps reused data instead; "
                          f"expect 0-5% on memory-bound shapes larger than L2, ~0 on small ones", code)]
