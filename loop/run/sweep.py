"""The sweep stage: a candidate's values timed in one judged measurement, before it is proposed.

A recipe that changes one numeric variable (a block or tile size, num_warps, num_stages, occupancy)
offers its step with a sweep (`playbook.recipe.Sweep`): several values of that variable. The sweep
stage times them all in one judged measurement beside the incumbent (labels `sweep-<value>`), every
value checked for correctness first; a value that fails is recorded as failed with its reason, dropped,
and the measurement repeated without it (at most MAX_MEASUREMENTS measurements). `loop.decide.sweep`
gives each value's paired result against the incumbent and picks the best. Then the best value's
source is the iteration's proposal, and the ordinary iteration runs on it (`loop.run.iteration`:
apply -> commit -> verify -> measure -> decide -> record -> finish), so the keep or revert is decided
on a fresh paired measurement of that value alone, never on the sweep's best-of-k estimate (which
favours whichever value had the luckiest noise).

The tree is not touched before the sweep has chosen: a kill during the sweep stage leaves the branch
and the target at the best version, and `resume` counts no iteration for it (`loop.run.resume`).
A sweep whose variable cannot show in the run's timing mode (num_warps under the interpreter) is not
timed: no value is picked, and the step's own value is evaluated, which the unmeasured rule reverts.
"""

from __future__ import annotations

from loop import decide
from loop.common.messages import Inflight, Timing
from loop.decide import sweep as sweeps
from loop.records import gitops
from loop.records.results import BackendResult
from loop.run import measuring
from loop.run.core import Run
from loop.target.change import describe
from playbook.recipe import Candidate, Sweep, SweepValue

MAX_MEASUREMENTS = 3  # judged measurements one sweep may take (each failing one drops the value charged)


def sweep_stage(run: Run, n: int, cand: Candidate, sweep: Sweep, hypothesis: str) -> tuple[dict, SweepValue | None]:
    """Every value of `sweep` timed beside the incumbent (the tree left at the best version); returns
    the record's `sweep` summary and the value to measure again alone (None: none was timed)."""
    run.progress_view.update(iteration=n, change=sweep.title)
    run.log(f"#{n} sweep {sweep.title} [{cand.recipe}]")
    run.state.inflight = Inflight(n, "sweep", sweep.title, key=sweep.key, hypothesis=hypothesis, recipe=cand.recipe,
                                  kind=cand.kind)
    run.save()
    run.stage("sweep")
    incumbent = gitops.show_file(run.root, run.state.best_commit, run.state.target)
    can = decide.measurability(describe(incumbent, sweep.values[0].source, cand.kind), run.timing_mode)
    if not can.measurable:
        run.log(f"#{n} sweep not timed: {can.reason}")
        results = [sweeps.failed(v.value, v.key, sweeps.NOT_TIMED, can.reason) for v in sweep.values]
        return summary(sweep, results, None, 0, can.reason), None
    found: dict[str, sweeps.ValueResult] = {}
    left, measured = list(sweep.values), 0
    while left and measured < MAX_MEASUREMENTS:
        measured += 1
        result, timing, raw = measure_values(run, n, measured, incumbent, left)
        if result.status == "ok":
            found.update({v.key: sweeps.value_result(v.value, v.key, v.label, timing, run.policy) for v in left})
            left = []
            break
        who = sweeps.charged(result.status, raw.get("failed_impl"), raw.get("message") or result.reason,
                             [v.label for v in left])
        if who is None:  # nobody's among the values (the incumbent's, the judge's): none of them was timed
            found.update({v.key: sweeps.failed(v.value, v.key, sweeps.NOT_MEASURED, f"{result.status}: {result.reason}")
                          for v in left})
            left = []
            break
        value = next(v for v in left if v.label == who)
        run.log(f"#{n} sweep: {value.value} dropped ({result.status}): {result.reason[:200]}")
        found[value.key] = sweeps.failed(value.value, value.key, result.status, result.reason)
        left.remove(value)
    found.update({v.key: sweeps.failed(v.value, v.key, sweeps.NOT_MEASURED,
                                       f"{MAX_MEASUREMENTS} sweep measurements failed before it was timed")
                  for v in left})
    results = [found[v.key] for v in sweep.values]
    best = sweeps.choose(results)
    chosen = next((v for v in sweep.values if best is not None and v.key == best.key), None)
    why = (f"{chosen.value} had the highest paired speedup of the sweep ({best.speedup:.4f}x); it is measured "
           "again alone, and that measurement decides" if chosen else "no value was timed")
    run.log(f"#{n} sweep: {' '.join(_cell(r) for r in results)}; {why}")
    return summary(sweep, results, chosen, measured, why), chosen


def measure_values(run: Run, n: int, attempt: int, incumbent: str, values: list[SweepValue]
                   ) -> tuple[BackendResult, Timing | None, dict]:
    """One judged measurement of the incumbent and `values` on the target backend (the guard
    backends measure the chosen value in its iteration); every value checked for correctness.
    Returns the target backend's result, its judge's timing result (None: nothing was timed) and the
    judge's result (a failure's `failed_impl` and message)."""
    workdir = run.iter_dir(n) / f"sweep-{attempt}"
    workdir.mkdir(parents=True, exist_ok=True)
    impls = measuring.implementations(run, workdir, {"incumbent": incumbent, **{v.label: v.source for v in values}})
    tb = run.state.target_backend
    m = measuring.judged(run, n, workdir, impls, [v.label for v in values], [tb], lambda what: run.log(f"#{n} sweep {what}"))
    return m.results[tb], m.timings.get(tb), m.raw.get(tb) or {}


def summary(sweep: Sweep, results: list[sweeps.ValueResult], chosen: SweepValue | None, measured: int,
            reason: str) -> dict:
    """The record's `sweep` field: every value's result, the one chosen, and how many measurements."""
    return {"variable": sweep.variable, "from": sweep.current, "key": sweep.key,
            "timed": measured > 0, "measurements": measured, "chosen": chosen.value if chosen else None,
            "reason": reason, "values": [r.to_json() for r in results]}


def _cell(r: sweeps.ValueResult) -> str:
    return f"{r.value}={r.speedup:.4f}x" if r.status == "ok" else f"{r.value}={r.status}"
