"""Recipe `cuda-launch-bounds`: `__launch_bounds__(T)` on a kernel whose launches all use T threads
per block, then (a second step, once it is there) the minimum of resident blocks per SM that fills
the SM, `__launch_bounds__(T, 2048 / T)`.

The first tells ptxas the block size, so it budgets registers for T threads rather than for the
1024 it must otherwise allow; the second asks it to fit 2048 threads per SM, capping registers at
32 per thread. T is written as the launch writes it: the `#define` or `constexpr` name where the
launch names one (so a later change of threads per block keeps the bound), else the number.
"""

from __future__ import annotations

from loop.common import cuda_tree as ct
from playbook.analysis import Analysis
from playbook.cuda.sites import Target, block_site, read
from playbook.recipe import Candidate, PatternRecipe, proposed, register

THREADS_PER_SM = 2048  # sm_80, sm_90 and sm_100: the most resident threads an SM holds


def _block(t: Target, kernel: str) -> tuple[str, int] | str:
    """(text, value) of the one block size every launch of `kernel` uses, or why there is none."""
    sites = [block_site(t, launch) for launch in t.launches_of(kernel)]
    if not sites or any(s is None for s in sites):
        return f"{kernel}'s block size is computed (or a dim3): no bound can be written"
    if len({s.value for s in sites}) > 1:
        return f"{kernel} is launched with several block sizes ({', '.join(str(s.value) for s in sites)})"
    site = sites[0]
    return (site.name if site.how in ("define", "constexpr") else str(site.value)), site.value


@register
class LaunchBounds(PatternRecipe):
    id = "cuda-launch-bounds"
    title = "__launch_bounds__ on a kernel: its block size, then the blocks per SM that fill the SM"
    languages = ("cuda",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        t = read(source, analysis)
        out, reasons = [], []
        for name, fn in t.kernels.items():
            found = _block(t, name)
            if isinstance(found, str):
                reasons.append(found)
                continue
            text, value = found
            bounds = ct.child(fn.node, "launch_bounds")
            if bounds is None:
                at = fn.declarator.start_byte
                code = ct.apply(t.cs, [ct.Edit(at, at, f"__launch_bounds__({text}) ")])
                out.append(Candidate(
                    self.id, "launch-bounds", f"{self.id}:{name}={value}", f"{name}: __launch_bounds__({text})",
                    f"{name}: ptxas told the block has {value} threads, so it may give each thread up to "
                    f"{min(255, 65536 // value)} registers without risking a failed launch; expect 0-5%, more "
                    "where registers spilled", code))
            elif len(bounds.named_children) == 1 and \
                    (limit := ct.int_value(t.cs, bounds.named_children[0], t.constants) or 0) and \
                    limit <= THREADS_PER_SM // 2:
                value, blocks = limit, THREADS_PER_SM // limit
                at = bounds.named_children[0].end_byte
                code = ct.apply(t.cs, [ct.Edit(at, at, f", {blocks}")])
                out.append(Candidate(
                    self.id, "launch-bounds", f"{self.id}:{name}={value},{blocks}",
                    f"{name}: __launch_bounds__ minimum blocks per SM -> {blocks}",
                    f"{name}: {blocks} blocks of {value} threads resident per SM asked of ptxas, capping registers "
                    f"at {65536 // THREADS_PER_SM} per thread: more warps to hide memory latency; expect a gain on a "
                    "latency-bound kernel, a loss where the cap makes registers spill", code, tier=1))
            elif len(bounds.named_children) == 1:
                reasons.append(f"{name}'s __launch_bounds__ maximum is not a number this recipe reads, or leaves no "
                               "room for a second resident block")
            else:
                reasons.append(f"{name} already has __launch_bounds__ with its minimum blocks per SM")
        return proposed(out, reasons, "no kernel on solve's path")
