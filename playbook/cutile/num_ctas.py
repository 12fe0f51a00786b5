"""Recipe `cutile-num-ctas` (perf-knobs catalog #4): `num_ctas=2` on `@ct.kernel` for kernels that
call `ct.mma` / `ct.matmul`."""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import calls
from playbook.cst.edits import add_kwarg, has_kwarg, kwarg, replace
from playbook.cst.kernels import ct_kernels, is_ct_kernel
from playbook.cst.source import Skip, checked, parse
from playbook.cutile.kernels import MMA_OPS
from playbook.recipe import Candidate, PatternRecipe, on_path, register


@register
class CuTileNumCtas(PatternRecipe):
    id = "cutile-num-ctas"
    title = "num_ctas=2 on @ct.kernel for MMA kernels"
    languages = ("cutile",)

    def applies(self, analysis: Analysis) -> bool:
        return analysis.language == "cutile" and analysis.kernel_class == "dot"

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        module = parse(source)
        al, kernels = ct_kernels(module)
        kernels = on_path(kernels, analysis)
        out = []
        for name, fn in kernels.items():
            if not calls(fn.body, al.ct, *MMA_OPS):
                continue
            dec = next(d for d in fn.decorators if is_ct_kernel(d, al))
            if isinstance(dec.decorator, cst.Call) and has_kwarg(dec.decorator, "num_ctas"):
                continue

            def new_dec(upd: cst.Decorator) -> cst.Decorator:
                two = cst.Integer("2")
                if isinstance(upd.decorator, cst.Call):
                    return upd.with_changes(decorator=add_kwarg(upd.decorator, "num_ctas", two))
                return upd.with_changes(decorator=cst.Call(func=upd.decorator, args=[kwarg("num_ctas", two)]))

            code = checked(replace(module, {dec: new_dec}).code)
            out.append(Candidate(self.id, "num_ctas", f"{self.id}:{name}.num_ctas=2", f"{name}: num_ctas=2",
                                 f"{name} as a 2-CTA cluster: on Blackwell the pair runs one MMA tile together (2-CTA "
                                 f"mode), sharing operand traffic; expect 5-20% on large dot shapes there; on Hopper "
                                 f"expect a large regression (2-28x slower measured on an H200)", code))
        if not out:
            raise Skip("no @ct.kernel with ct.mma/ct.matmul and without num_ctas")
        return out
