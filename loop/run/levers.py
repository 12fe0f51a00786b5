"""Big levers first: what the playbook's order reads from a run before it proposes anything.

The best version's distance to its roofline (its fraction of the same-run clone bandwidth at the
largest benchmark shape, a dot kernel's of the device's matmul rate, measured by the judge beside
it) and the experience of the run's timing lane make the `Analysis` that `playbook.ranked` orders
candidates by (`playbook/analysis.py`: levers by the share of the gap they are expected to close,
hints by a few percent, each per expected second of its experiment). Nothing here measures: it reads
the records the run already has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from loop.records import experience, gitops
from loop.records.results import Record
from playbook import Candidate
from playbook.analysis import Analysis, Experiment, Learned, analyze
from playbook.base import ranked_experiments


@dataclass(frozen=True)
class Roofline:
    """Where a measured version stands: its fraction of the roofline, and at which shape and against what."""

    fraction: float
    basis: str  # e.g. "0.61 of the same-run clone bandwidth (2912 GB/s) at [16384, 16384] bfloat16"

    def to_json(self) -> dict:
        return {"fraction": round(self.fraction, 4), "basis": self.basis}


def roofline(record: Record | None, backend: str, compute: bool = False) -> Roofline | None:
    """The record's fraction of the same-run clone bandwidth at its largest benchmark shape (by bytes
    moved), None where it has none: a CPU run (no clone), an external harness, a failed measurement.
    `compute` (a dot kernel): its fraction of the device's matmul rate at its largest compute-bound
    shape (by flops), measured by the judge in the same run (`timing.device_matmul_rate`)."""
    if record is None or backend not in record.backends:
        return None
    result = record.backends[backend]
    label = "baseline" if record.iteration == 0 else "candidate"
    if compute:
        return _compute_roofline(result.shapes, label)
    shapes = [s for s in result.shapes if isinstance(s.get(label), dict) and s[label].get("frac_clone_bw")]
    if not shapes:
        return None
    largest = max(shapes, key=lambda s: (s.get("bytes") or 0, shapes.index(s)))
    frac = float(largest[label]["frac_clone_bw"])
    if not math.isfinite(frac) or frac <= 0:
        return None
    clone = largest.get("clone_gbps")
    basis = (f"{frac:.2f} of the same-run clone bandwidth" + (f" ({clone:.0f} GB/s)" if clone else "")
             + f" at {largest['shape']} {largest.get('dtype', '')}".rstrip())
    if frac > 1.0:
        basis += " (above 1: the clone under-measured the copy rate; read as at the roofline)"
    return Roofline(min(frac, 1.0), basis)


def _compute_roofline(shapes: list[dict], label: str) -> Roofline | None:
    """A dot kernel's fraction of the device's matmul rate at its largest compute-bound shape, by flops."""
    shapes = [s for s in shapes if isinstance(s.get(label), dict) and s[label].get("frac_matmul") and s.get("matmul")]
    if not shapes:
        return None
    largest = max(shapes, key=lambda s: (s.get("flops") or 0, shapes.index(s)))
    frac, rate = float(largest[label]["frac_matmul"]), largest["matmul"]
    if not math.isfinite(frac) or frac <= 0:
        return None
    basis = (f"{frac:.2f} of the device's matmul rate ({rate['tflops']:.0f} TFLOP/s, torch.matmul {rate['n']}^3 "
             f"{rate['dtype']}, same run) at {largest['shape']} {largest.get('dtype', '')}".rstrip())
    if frac > 1.0:
        basis += " (above 1: faster than that matmul, e.g. a cheaper precision; read as at the roofline)"
    return Roofline(min(frac, 1.0), basis)


def learned(kernel_class: str, backend: str, arch: str | None) -> tuple[Learned, ...]:
    """The lane's experience per change kind (`tileloop experience recommend`'s rows)."""
    rows = experience.recommend(experience.load(), kernel_class, backend, arch).rows
    out = []
    for row in rows:
        gm = row.get("geomean_speedup_kept")
        out.append(Learned(row["kind"], int(row["tries"]), int(row["kept"]),
                           row["kept"] * math.log(gm) if gm else 0.0))
    return tuple(out)


def with_levers(analysis: Analysis, where: Roofline | None, backend: str, arch: str | None) -> Analysis:
    """`analysis` with the measured headroom and the lane's experience, where the headroom is measured."""
    if where is None:
        return analysis
    return replace(analysis, headroom=where.fraction, learned=learned(analysis.kernel_class, backend, arch))


def order_payload(pool: Sequence[tuple[Candidate, Experiment]], analysis: Analysis, where: Roofline | None,
                  limit: int = 8) -> dict:
    """The order `next_candidate` will offer (the first `limit` candidates of `pool`, each with the
    experiment its place was ranked by: `playbook.base.ranked_experiments`) and why, with each one's
    expected seconds: for `init`'s output and `playbook plan --json`."""
    if where is None:
        why = (f"static order of the playbook for a {analysis.language} {analysis.kernel_class} kernel: no measured "
               "distance to the roofline (a CPU run, a dot kernel, or no run yet)")
    else:
        why = (f"by expected gain per expected second: the best version is at {where.basis}; levers (tile or block "
               "size, programs, warps, occupancy) are expected to close a share of that gap, hints a few percent; "
               "each divided by the seconds its experiment is expected to take (its configs or sweep values, each "
               "compiled and timed at every key)")
    order = [{"rank": i + 1, "recipe": c.recipe, "kind": c.kind, "key": c.key, "optimization": c.title,
              "lever": analysis.is_lever(c.kind), "reason": analysis.order_reason(c.kind, cost)}
             for i, (c, cost) in enumerate(pool[:limit])]
    return {"roofline": where.to_json() if where else None, "why": why, "order": order}


def order_text(payload: dict) -> list[str]:
    lines = [f"order: {payload['why']}"]
    lines += [f"  {o['rank']}. {o['optimization']} [{o['recipe']}]: {o['reason']}" for o in payload["order"]]
    return lines


def best_record(run) -> Record | None:
    """The record that measured the run's best version (its keep, or the baseline)."""
    return next((r for r in reversed(run.records()) if r.commit == run.state.best_commit and r.status == "keep"), None)


def analysis_of(run, src: str) -> tuple[Analysis, Roofline | None]:
    """The playbook's analysis of `src` in `run` (a `loop.run.core.Run`): entry point, backend and architecture of
    the run, and the best version's measured distance to its roofline with the lane's experience."""
    arch = None if run.arch == "cpu" else run.arch
    an = analyze(src, backend=run.state.target_backend, arch=arch, entry=run.entry())
    where = None if run.state.harness else roofline(best_record(run), run.state.target_backend, not memory_bound(an))
    return with_levers(an, where, run.state.target_backend, arch), where


def memory_bound(an: Analysis) -> bool:
    """Whether the clone bandwidth is the kernel's roofline: not for a dot kernel (matmul, attention),
    whose roofline is the device's matmul rate, which the judge measures beside its compute-bound
    shapes; where a run has none (a CPU run, an older record), a dot kernel keeps the playbook's static
    order rather than a headroom read off the wrong roofline."""
    return an.kernel_class != "dot"


def run_order(run, limit: int = 8) -> dict:
    """The order the run's next candidates come in, and why (`init`, `status`)."""
    src = gitops.show_file(run.root, run.state.best_commit, run.state.target)
    an, where = analysis_of(run, src)
    pool = ranked_experiments(src, an, run.state.tried, run.state.demoted, run.state.skip_recipes)
    return order_payload(pool, an, where, limit)
