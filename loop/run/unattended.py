"""The unattended loop (`tileloop run`): its proposer takes the playbook's first candidate for the
current best version that the run's screen lets through (`loop.run.suggest.Screen`, as an agent's
step does), and the iteration runs it (`loop.run.iteration`: its sweep first, where it carries one),
until a stop rule fires."""

from __future__ import annotations

from pathlib import Path

from loop import decide
from loop.run import iteration
from loop.run.core import Run
from loop.run.levers import analysis_of
from loop.run.suggest import screen
from playbook import Candidate
from playbook.analysis import Analysis
from playbook.base import ranked_experiments, why_nothing


def run_loop(run: Run, max_iters: int | None = None) -> decide.Stop:
    """The loop under a judge host (`Run.hosting`)."""
    with run.hosting():
        return loop(run, max_iters)


def loop(run: Run, max_iters: int | None) -> decide.Stop:
    """Propose, evaluate, until a stop rule (or `max_iters` experiments here) stops it; the stop is saved."""
    run.state.mode = "run"
    run.save()
    done_here, why = 0, None
    while True:
        stop = run.stop_state()
        if stop.state != "continue":
            break
        if max_iters is not None and done_here >= max_iters:
            stop = decide.stopping("stop", f"reached --max-iters {max_iters}", run.timing_mode)
            break
        if run.state.device == "cuda" and (bad := run.gpu_health()):
            stop = decide.stopping("escalate", f"GPU health check failed: {bad}", run.timing_mode)
            break
        src = (run.root / run.state.target).read_text()
        an, _ = analysis_of(run, src)  # with the best version's distance to its roofline: by expected gain per expected second
        cand = _injected(run, run.state.last_iteration + 1)
        if cand is None:
            cand, short = propose(run, src, an)
            if cand is None and short is not None:  # candidates are left, none fits in the time budget
                stop = decide.stopping("stop", short, run.timing_mode)
                break
        if cand is None:
            stop = run.stop_state(exhausted=True)
            if stop.state == "stop" and stop.reason.startswith("playbook exhausted"):
                why = why_nothing(src, an, run.state.tried, run.state.skip_recipes)
            break
        run.progress_view.update(iteration=run.state.last_iteration + 1, change=cand.title)
        iteration.evaluate(run, iteration.candidate(run, cand, announce=True))
        done_here += 1
    # an exhausted playbook says, per recipe, why it has nothing left: where a new recipe or an edit would go
    run.state.stopped = {**stop.to_json(), **({"recipes": why} if why else {})}
    run.save()
    run.log(f"stopped: {stop.state}: {stop.reason}; best {run.progress_view.latency_text(run.state.best_latency_ms)} "
            f"at {run.state.best_commit[:10]}")
    for rid, reason in (why or {}).items():
        run.log(f"  {rid}: {reason}")
    run.progress_view.close()
    return stop


def propose(run: Run, src: str, an: Analysis) -> tuple[Candidate | None, str | None]:
    """The playbook's first candidate in priority order that the run's screen lets through and whose
    experiment is expected to end within the run's time budget (`--time-budget`; a suite's
    `--per-run` sets one), or None; with None, why, when candidates were left that did not fit (an
    experiment cut off by a limit has cost its seconds and decided nothing)."""
    seen = screen(run, src)
    pool = [(c, e) for c, e in ranked_experiments(src, an, run.state.tried, run.state.demoted, run.state.skip_recipes)
            if seen.why_not(c) is None]
    budget = run.policy.time_budget_s
    if budget is None or not pool:
        return (pool[0][0] if pool else None), None
    left = budget - run.state.active_s
    need = [(c, an.expected_seconds(c.kind, e)) for c, e in pool]
    fits = next(((c, s) for c, s in need if s <= left), None)
    if fits is None:
        return None, (f"time budget: the shortest experiment left (~{min(s for _, s in need):.0f} s, {len(need)} "
                      f"candidates) does not fit in the {left:.0f} s left of {budget:.0f}s")
    (first, first_s), (chosen, chosen_s) = need[0], fits
    if chosen is not first:
        run.log(f"next: {first.title} (~{first_s:.0f} s) does not fit in the {left:.0f} s left of the time budget; "
                f"{chosen.title} (~{chosen_s:.0f} s) does")
    return chosen, None


def _injected(run: Run, n: int) -> Candidate | None:
    """A fault planted by TILELOOP_TEST_INJECT for iteration n (tests of unattended runs), once: it is
    run as planted, never screened."""
    for it, path in run.settings.test_inject:
        key = f"fault-injection:{it}"
        if it == n and key not in run.state.tried:
            return Candidate("fault-injection", "fault", key, f"injected fault: {Path(path).stem}",
                             "a planted fault: it must be classified and reverted, and the run must go on",
                             Path(path).read_text())
    return None
