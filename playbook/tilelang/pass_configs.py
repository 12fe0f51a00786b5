"""Recipe `tilelang-pass-configs`: one pass config of `@tilelang.jit(pass_configs={...})` that can matter.

TileLang lowers a kernel for sm_90 and later with two passes that usually win and sometimes lose: TMA
lowering (a `T.copy` of a global tile into shared memory becomes one bulk tensor-memory-accelerator copy)
and warp specialisation (a `T.Pipelined` loop is split into producer warps that copy and consumer warps
that compute). Each candidate switches one of them off (`tl.disable_tma_lower`,
`tl.disable_warp_specialized`, TileLang's PassConfigKey values): a bare `@tilelang.jit` becomes
`@tilelang.jit(pass_configs={...: True})`, an existing dict literal gains the key. A config already set
is not proposed again; a kernel without the copies or the loop a pass rewrites is left alone, and so
is a run on an architecture older than sm_90, where neither pass runs.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.edits import add_kwarg, kwarg_value, replace
from playbook.cst.source import Skip, checked, code_of
from playbook.recipe import Candidate, PatternRecipe, per_kernel, proposed, register
from playbook.tilelang.program import Kernel, Program, dotted, pipelined, read, tl_calls

HOPPER = 90
# kind -> (the pass config's key, what the kernel must have for the pass to touch it, the hypothesis)
CONFIGS = {
    "tma": ("tl.disable_tma_lower", "T.copy into T.alloc_shared memory",
            "TMA lowering off: tile copies into shared memory go through cp.async issued by every thread instead of "
            "one bulk TMA copy; expect a gain (2-10%) on small tiles, where a TMA descriptor's setup and its "
            "barrier outweigh the copy, a loss (5-20%) on large ones"),
    "warp-specialization": ("tl.disable_warp_specialized", "T.Pipelined loop",
                            "warp specialisation off: every warp both copies and computes, in the software "
                            "pipeline num_stages sets, instead of producer and consumer warps; expect a gain "
                            "where the producer warps' registers limited the tile or residency, a loss (5-20%) "
                            "where the split overlapped copies with the MMA"),
}


def _touches(kind: str, kernel: Kernel, program: Program) -> bool:
    if kind == "tma":
        return bool(tl_calls(kernel.fn, program.imports, "copy")) and bool(
            tl_calls(kernel.fn, program.imports, "alloc_shared"))
    return pipelined(kernel, program) is not None


def _jit(kernel: Kernel, program: Program) -> cst.Decorator:
    return next(d for d in kernel.fn.decorators
                if dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator, program.imports)
                in ("tilelang.jit", "tilelang.jit.jit"))


def _with_config(decorator: cst.Decorator, key: str) -> cst.Decorator | None:
    """The decorator with `key: True` in its pass_configs; None when the key is already there."""
    entry = cst.DictElement(cst.SimpleString(f'"{key}"'), cst.Name("True"))
    if not isinstance(decorator.decorator, cst.Call):
        call = cst.Call(decorator.decorator, [])
        return decorator.with_changes(decorator=add_kwarg(call, "pass_configs", cst.Dict([entry])))
    configs = kwarg_value(decorator.decorator, "pass_configs")
    if configs is None:
        return decorator.with_changes(decorator=add_kwarg(decorator.decorator, "pass_configs", cst.Dict([entry])))
    if not isinstance(configs, cst.Dict):
        raise Skip(f"pass_configs is {code_of(configs)}, not a dict literal the recipe can extend")
    if any(isinstance(e, cst.DictElement) and _key_text(e.key) == key for e in configs.elements):
        return None
    elements = list(configs.elements)
    if elements and not isinstance(elements[-1].comma, cst.Comma):
        elements[-1] = elements[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    wider = configs.with_changes(elements=[*elements, entry])
    return decorator.with_changes(decorator=replace(decorator.decorator, {configs: wider}))


def _key_text(node: cst.BaseExpression) -> str:
    """A pass config's key as TileLang reads it: a string, or `PassConfigKey.TL_...` by its value."""
    if isinstance(node, cst.SimpleString):
        return str(node.evaluated_value)
    name = node.attr.value if isinstance(node, cst.Attribute) else ""
    return {"TL_DISABLE_TMA_LOWER": CONFIGS["tma"][0],
            "TL_DISABLE_WARP_SPECIALIZED": CONFIGS["warp-specialization"][0]}.get(name, name)


@register
class PassConfigs(PatternRecipe):
    id = "tilelang-pass-configs"
    title = "One pass config that matters: TMA lowering or warp specialisation switched off"
    languages = ("tilelang",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language in self.languages and (analysis.capability is None or analysis.capability >= HOPPER)

    def inapplicable(self, analysis: Analysis) -> str:
        if analysis.language in self.languages:
            return f"TMA lowering and warp specialisation run on sm_90 and later only, not on {analysis.arch}"
        return ""

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        program = read(source, analysis)
        out, reasons = per_kernel(program.kernels, lambda name, k: self._kernel(program, k), analysis)
        return proposed([c for cands in out for c in cands], reasons)

    def _kernel(self, program: Program, kernel: Kernel) -> list[Candidate]:
        out, missing = [], []
        jit = _jit(kernel, program)
        for kind, (key, needs, hyp) in CONFIGS.items():
            if not _touches(kind, kernel, program):
                missing.append(f"no {needs} for {key} to change")
                continue
            new = _with_config(jit, key)
            if new is None:
                missing.append(f"{key} is already set")
                continue
            code = checked(replace(program.module, {jit: new}).code)
            out.append(Candidate(self.id, kind, f"{self.id}:{kernel.name}:{key}=True",
                                 f"{kernel.name} pass_configs {key} -> True", hyp, code))
        if not out:
            raise Skip(f"{kernel.name}: " + "; ".join(missing))
        return out
