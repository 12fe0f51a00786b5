"""Recipe `cuda-threads-per-block`: the threads per block of a kernel's launch, swept over 128, 256,
512 and 1024.

The block size is changed where it is written: a literal in `<<<grid, 256>>>`, a `#define` or
`constexpr` the launch names (the grid and a `__shared__` array sized by it follow), or a host local
assigned a literal once (`int threads = 256;`, which the grid is computed from). A block size the host
computes, or a `dim3`, is left alone. Values above the kernel's own `__launch_bounds__` are left out
(such a launch fails).
"""

from __future__ import annotations

from loop.common import cuda_tree as ct
from loop.common.cuda_c import has_solve
from playbook.analysis import Analysis
from playbook.cst.source import Skip
from playbook.cuda.sites import BlockSite, Target, block_site, read, set_value
from playbook.recipe import Candidate, PatternRecipe, register, with_sweep

VALUES = (128, 256, 512, 1024)


def _bound(t: Target, kernel: str) -> int | None:
    """The kernel's `__launch_bounds__` maximum, where it is a literal or a file constant."""
    bounds = ct.child(t.kernels[kernel].node, "launch_bounds")
    if bounds is None:
        return None
    first = bounds.named_children[0] if bounds.named_children else None
    return ct.int_value(t.cs, first, t.constants) if first is not None else None


def _order(current: int, allowed: list[int]) -> list[int]:
    """The values to try, the step up first, then the rest up, then down (nearest first)."""
    up = [v for v in allowed if v > current]
    down = [v for v in reversed(allowed) if v < current]
    return up + down


def _hypothesis(site: BlockSite, values: str, row: bool) -> str:
    what = ("threads sharing each row: more threads split the row's columns and its reduction, fewer leave "
            "registers and shared memory for more resident blocks" if row else
            "threads per block: larger blocks mean fewer blocks to schedule, smaller ones finer-grained "
            "residency")
    return (f"{site.label} {site.value} -> {values} {what}; expect 0-20% where occupancy or the tail of the grid "
            "limited the kernel, a loss where a larger block leaves SMs with too few blocks")


@register
class ThreadsPerBlock(PatternRecipe):
    id = "cuda-threads-per-block"
    title = "Threads per block of a launch, swept over 128, 256, 512 and 1024"
    languages = ("cuda",)

    def sites(self, t: Target) -> list[tuple[str, BlockSite]]:
        """(kernel, site) of the first launch of each kernel whose block size is written as a number."""
        out, seen = [], set()
        for launch in t.reach.launches:
            if launch.kernel in t.kernels and launch.kernel not in seen:
                site = block_site(t, launch)
                if site is not None:
                    seen.add(launch.kernel)
                    out.append((launch.kernel, site))
        return out

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        t = read(source, analysis)
        sites = self.sites(t)
        if not sites:
            raise Skip("no launch on solve's path has a block size written as a literal, a #define, a constexpr or "
                       "a host local set once to a literal (a computed block size or a dim3 is left alone)")
        out, done = [], set()
        row = analysis.kernel_class in ("norm-like", "reduction")
        for kernel, site in sites:
            if (site.node.start_byte, site.node.end_byte) in done:
                continue  # a constant shared by several launches is swept once
            done.add((site.node.start_byte, site.node.end_byte))
            bound = _bound(t, kernel)
            allowed = [v for v in VALUES if bound is None or v <= bound or site.name and _shares(t, kernel, site)]
            values = _order(site.value, allowed)
            if not values:
                continue
            base = f"{self.id}:{site.label}"
            rewrites = [(v, f"{base}={v}", ct.apply(t.cs, [set_value(t, site, v)])) for v in values]
            for i, (v, key, code) in enumerate(rewrites):
                cand = Candidate(self.id, "block", key, f"{site.label} {site.value} -> {v}",
                                 _hypothesis(site, str(v), row), code, tier=0 if i == 0 else 1)
                if i == 0:
                    cand = with_sweep(cand, site.label, site.value, base, rewrites,
                                      _hypothesis(site, "{" + ",".join(str(v) for v in values) + "}", row))
                out.append(cand)
        if not out:
            raise Skip("every block size is at its kernel's __launch_bounds__ and no other value is allowed")
        return out

    def current_keys(self, source: str) -> list[str]:
        """The keys of the block sizes the source already has (a kept value is never proposed again)."""
        if not has_solve(source):
            return []
        try:
            t = read(source)
        except Skip:
            return []
        return [f"{self.id}:{site.label}={site.value}" for _, site in self.sites(t)]


def _shares(t: Target, kernel: str, site: BlockSite) -> bool:
    """Whether the kernel's `__launch_bounds__` names the same constant as the launch (they move together)."""
    bounds = ct.child(t.kernels[kernel].node, "launch_bounds")
    first = bounds.named_children[0] if bounds is not None and bounds.named_children else None
    return first is not None and t.cs.text(first) == site.name and site.how in ("define", "constexpr")
