"""Iteration 0: the target as given, measured and recorded as the run's first best version."""

from __future__ import annotations

import time
from dataclasses import replace

from loop.common.errors import UserError
from loop.common.messages import Decision, Inflight
from loop.measure.evaluate import guard_failures
from loop.records import gitops, history
from loop.records.results import Record, append_record
from loop.run import measuring
from loop.run import state as st
from loop.run.core import GIT_SNAPSHOT, Run, now, portable_env
from loop.run.recording import mark_seen
from loop.target.contract import source_hash


def resume_baseline(run: Run) -> Record:
    """Iteration 0 interrupted (a kill during init): finished from its record if that was written,
    else measured again from the base commit. A baseline commit without its record is dropped
    and made again; the run branch is made if the kill came before it."""
    done = [r for r in run.records() if r.iteration == 0]
    if done:
        rec = done[0]
        mark_seen(run, gitops.show_file(run.root, rec.commit, run.state.target))  # a kill may have come before it
        st.recount(run.state, run.records())
        run.state.inflight = None
        run.save()
        run.render()
        return rec
    if not gitops.branch_exists(run.root, run.state.branch):
        gitops.require_clean(run.root)
        gitops.checkout(run.root, run.state.base_commit)
        gitops.create_branch(run.root, run.state.branch)
    elif gitops.current_branch(run.root) != run.state.branch:
        raise UserError(f"the repository is on {gitops.current_branch(run.root)!r}, not the run's branch "
                        f"{run.state.branch!r}", hint=f"git checkout {run.state.branch}")
    tip = gitops.head_sha(run.root)
    if tip != run.state.base_commit:
        trailers = gitops.parse_trailers(gitops.commit_message(run.root, tip))
        if (trailers.get("Tileloop-Run"), trailers.get("Tileloop-Iteration")) != (run.state.run_id, "0"):
            raise UserError(f"branch tip {tip[:10]} is neither the run's base commit nor its baseline",
                            hint="inspect the branch by hand; tileloop will not move commits it did not make")
        gitops.reset_hard(run.root, run.state.base_commit)
    if not (run.dir / GIT_SNAPSHOT).exists():
        run.snapshot_git_dir()
    return baseline(run)


def baseline(run: Run) -> Record:
    """The target measured as iteration 0 (verify, measure), committed with its record, the run's best."""
    started, t0 = now(), time.monotonic()
    src = (run.root / run.state.target).read_text()
    run.state.inflight = Inflight(0, "measure", "baseline")
    run.save()
    results, raw, gate = measuring.measure_version(run, 0, None, src)
    target = results[run.state.target_backend]
    if target.status != "ok":
        raise UserError(f"the baseline does not pass: {run.state.target_backend}: {target.status}: {target.reason}",
                        hint=f"logs under {target.worker_dir}")
    bad = guard_failures(results, run.state.target_backend)
    if bad:
        raise UserError(f"the baseline fails on a guard backend: {'; '.join(bad)}")
    record = Record(run=run.state.run_id, iteration=0, optimization="baseline", status="keep", correctness="PASS",
                    latency_ms=target.latency_ms, target_backend=run.state.target_backend, backends=results,
                    commit=None, parent=run.state.base_commit, hypothesis="", env=portable_env(run.state.env),
                    source_hash=source_hash(src), started=started, finished=now(), wall_s=round(time.monotonic() - t0, 3),
                    decision=Decision(None, "baseline", "iteration 0: the code as given"), compile=gate,
                    harness=run.state.harness, cumulative_speedup=1.0, timing=run.timing_mode,
                    unchecked=measuring.unchecked(raw, run.state.target_backend))
    sha = gitops.commit(run.root, history.commit_message(record), [], allow_empty=True)
    record = replace(record, commit=sha)  # the commit that carries its message
    append_record(run.results_path, record)
    mark_seen(run, src)
    st.recount(run.state, run.records())  # the best commit, the last iteration: as the records say
    run.state.inflight = None
    run.save()
    run.render()
    return record
