"""`tileloop resume`: an interrupted iteration finished or recorded exactly once (as `crash
(interrupted)`), and a resume on other hardware or another toolchain refused."""

from __future__ import annotations

import json

from loop import decide
from loop.common.errors import EnvironmentMismatch, IntegrityError, UserError
from loop.common.messages import Failure, Inflight
from loop.common.processes import end_leftovers
from loop.measure import external
from loop.measure.evaluate import not_run
from loop.records import gitops
from loop.records.results import NOT_CHECKED, Record
from loop.run import state as st
from loop.run.baseline import resume_baseline
from loop.run.core import Run, now
from loop.run.integrity import violations
from loop.run.recording import count, finish, new_record, pending_message


def end_leftover_workers(run: Run) -> None:
    """A worker of this run still alive (its tileloop was killed before it could end it) holds the GPU
    and would skew the next timing: end it before anything else runs; a lock file of git killed with
    the run is removed (every later commit would fail on it)."""
    ended = end_leftovers(run.dir / "logs")
    if ended:
        run.log(f"ended {len(ended)} worker(s) of this run still alive: pid {', '.join(map(str, ended))}")
    for lock in gitops.clear_stale_locks(run.root):  # a git command killed with the run (mid-commit)
        run.log(f"removed the stale {lock} a git command killed with this run left")


def repair(run: Run) -> Record | None:
    """Finish or record an interrupted iteration exactly once; return its record if one was written."""
    inflight = run.state.inflight
    if not inflight:
        return None
    n = inflight.iteration
    if n == 0:
        return resume_baseline(run)
    done = [r for r in run.records() if r.iteration == n]
    if done:
        finish(run, done[0])
        return done[0]
    if inflight.stage == "record" and (run.iter_dir(n) / "record.json").exists():
        return finish(run, Record.from_json(json.loads((run.iter_dir(n) / "record.json").read_text())))
    tip = gitops.head_sha(run.root)
    tip_trailers = gitops.parse_trailers(gitops.commit_message(run.root, tip))
    is_experiment = tip != run.state.best_commit and tip_trailers.get("Tileloop-Run") == run.state.run_id \
        and tip_trailers.get("Tileloop-Iteration") == str(n)
    optimization = inflight.optimization or inflight.key or "interrupted change"
    interrupted_at = inflight.stage  # before the record stage is entered below
    if is_experiment:
        run.stage("record", commit=tip)
    elif not _commit_applied(run, inflight, optimization):
        return None  # interrupted before anything was applied
    return finish(run, _interrupted(run, inflight, optimization, interrupted_at))


def _commit_applied(run: Run, inflight: Inflight, optimization: str) -> bool:
    """An iteration cut off before its commit: the change applied to the target committed now (True),
    or, with nothing applied, the in-flight marker dropped (False; a sweep's key is tried again once)."""
    n, tip = inflight.iteration, gitops.head_sha(run.root)
    if tip != run.state.best_commit:
        raise UserError(f"branch tip {tip[:10]} is neither the best commit nor the interrupted experiment",
                        hint="inspect the branch by hand; tileloop will not move commits it did not make")
    target_path = run.root / run.state.target
    if target_path.read_text() == gitops.show_file(run.root, run.state.best_commit, run.state.target):
        if inflight.stage == "sweep" and inflight.key:  # a sweep counts no iteration and writes no record:
            run.state.cut.append(inflight.key)  # the state keeps the kill (tried again once)
            st.recount(run.state, run.records())
            run.log(f"#{n} the sweep {inflight.optimization} was interrupted before it chose: "
                    "no iteration recorded, the tree is at the best version")
        run.state.inflight = None
        run.save()
        return False
    others, new = violations(run)
    if others or new:
        raise IntegrityError(f"the change touches files other than the target {run.state.target}: "
                             f"{', '.join((others + new)[:8])}",
                             hint="an iteration may change the target file only; revert the other files")
    sha = gitops.commit(run.root, pending_message(run, n, optimization, inflight.hypothesis or ""),
                        [run.state.target])
    run.stage("record", commit=sha)
    return True


def _interrupted(run: Run, inflight: Inflight, optimization: str, interrupted_at: str) -> Record:
    """The record of the interrupted iteration: a crash (interrupted), counted as one, its key tried again once."""
    results = (external.not_run_results("interrupted") if run.state.harness else
               {name: not_run(name, run.state.availability, "interrupted") for name in run.state.backends})
    decision = decide.Decision("crash", "interrupted", f"the run was interrupted at stage {interrupted_at}")
    # a kill says nothing about the candidate: its key is tried again once (`state.counted`), then counts as tried
    return count(run, new_record(
        run, inflight.iteration, optimization=f"{optimization} (interrupted)", status="crash",
        source=(run.root / run.state.target).read_text(), started=inflight.started if inflight.started is not None else now(),
        wall_s=0.0, hypothesis=inflight.hypothesis or "", recipe=inflight.key or inflight.recipe,
        correctness=NOT_CHECKED, latency_ms=None, backends=results, decision=decision, stop=None,
        failure=Failure("interrupted", decision.reason), sweep=inflight.sweep))


def check_environment(run: Run, probe: dict) -> None:
    """A resume on another machine or toolchain is refused: its timings would not compare."""
    found = {k: probe.get(k) for k in st.fingerprint_keys(run.state.language)}
    diff = [f"{k}: {v!r} -> {found[k]!r}" for k, v in run.state.fingerprint().items() if found[k] != v]
    if diff:
        raise EnvironmentMismatch(f"this run was measured on a different machine or toolchain ({'; '.join(diff)})",
                                  hint="start a new run with tileloop init; results from two setups are not comparable")
