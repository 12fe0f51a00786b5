"""The record and finish stages: one record per experiment, built once when its fields are known;
the experiment's commit (made pending, its message amended with the record's trailers), a rejected
commit moved to refs/tileloop/<run>/<n> and the branch reset to the best, the counters the stop rules
read, and the experience entry. `finish` is idempotent, so `resume` can finish an iteration."""

from __future__ import annotations

from dataclasses import replace

from loop.common.errors import UserError
from loop.records import experience, gitops, history
from loop.records.results import Record, append_record, cumulative
from loop.run import state as st
from loop.run.core import Run, now, portable_env
from loop.target.contract import source_hash
from playbook.analysis import analyze
from playbook.base import current_keys


def new_record(run: Run, n: int, *, optimization: str, status: str, source: str, started: str, wall_s: float,
               speedup: float | None = None, **fields) -> Record:
    """The record of iteration n, with what the run knows of it (its id, backend, timing mode,
    environment, harness); its cumulative speedup is the earlier kept ones' times its own, if kept.
    `fields`: the rest of the record's fields, by name."""
    earlier = cumulative([r for r in run.records() if r.iteration < n])
    fields.setdefault("parent", run.state.best_commit)
    return Record(run=run.state.run_id, iteration=n, optimization=optimization, status=status,
                  target_backend=run.state.target_backend, commit=None, speedup=speedup,
                  cumulative_speedup=earlier * speedup if status == "keep" and speedup is not None else earlier,
                  timing=run.timing_mode, env=portable_env(run.state.env), source_hash=source_hash(source),
                  started=started, finished=now(), wall_s=round(wall_s, 3), harness=run.state.harness, **fields)


def pending_message(run: Run, n: int, optimization: str, hypothesis: str = "") -> str:
    """The message of an experiment's commit before it is decided: what it is and the trailers that
    name it (run, iteration, status pending); `finish` replaces it with its record's."""
    trailers = {"Tileloop-Run": run.state.run_id, "Tileloop-Iteration": str(n), "Tileloop-Optimization": optimization,
                "Tileloop-Status": "pending", "Tileloop-Target-Backend": run.state.target_backend,
                "Tileloop-Timing": run.timing_mode}
    return gitops.format_message(f"tileloop #{n}: {optimization}", f"Hypothesis: {hypothesis}" if hypothesis else "",
                                 trailers)


def finish(run: Run, record: Record) -> Record:
    """Amend the message, move the rejected commit to its ref, append the record. Idempotent."""
    n = record.iteration
    ref = f"{history.ref_prefix(run.state.run_id)}{n}"
    tip = gitops.head_sha(run.root)
    t = gitops.parse_trailers(gitops.commit_message(run.root, tip))
    if tip != run.state.best_commit and t.get("Tileloop-Run") == run.state.run_id and t.get("Tileloop-Iteration") == str(n):
        sha = tip  # the experiment commit is still the tip
        if t.get("Tileloop-Status") == "pending":
            sha = gitops.amend_message(run.root, history.commit_message(record))
            run.stage("record", commit=sha)
        if record.status != "keep":
            gitops.update_ref(run.root, ref, sha)
            gitops.reset_hard(run.root, run.state.best_commit)
    else:  # already moved aside by an earlier, interrupted finish
        sha = gitops.ref_sha(run.root, ref) if record.status != "keep" else tip
        if sha is None:
            raise UserError(f"iteration {n}: its commit is neither the branch tip nor under {ref}")
    record = replace(record, commit=sha)
    recs = run.records()  # read once: what the file holds, with this record once it is appended
    if not any(r.iteration == n for r in recs):
        append_record(run.results_path, record)
        recs = [*recs, record]
    if record.status == "keep":
        run.progress_view.update(best=record.latency_ms)
        mark_seen(run, gitops.show_file(run.root, sha, run.state.target))
    st.recount(run.state, recs)  # the best commit, the last iteration, the counters: as the records say
    run.state.inflight = None
    run.save()
    run.render()
    if n >= 1 and experience.learned_from(record.verdict):
        remember(run, record)
    run.log(f"#{n} {record.optimization}: {record.status} ({record.verdict}) "
            f"{record.decision.reason if record.decision else ''}")
    return record


def count(run: Run, record: Record) -> Record:
    """The record (built without its stop state) counted in memory before it is written, as the records
    will count it once it is (`state.counted`: outcome, verdict, crash cause, the key tried or, void or
    interrupted, tried again once, a sweep's values tried, a kind kept at low gain demoted); returned
    with the stop state the rules then give."""
    st.settle(run.state, st.counted(st.tally_of(run.state), record))
    return replace(record, stop=run.stop_state())


def remember(run: Run, record: Record) -> None:
    """One experience entry per finished experiment (never fatal: experience is advisory)."""
    try:
        cls = analyze(gitops.show_file(run.root, run.state.best_commit, run.state.target), entry=run.entry()).kernel_class
        experience.append(experience.Entry(
            op=run.state.op, kernel_class=cls, language=run.state.language, backend=run.state.target_backend,
            arch=run.arch, kind=record.kind or "agent", key=record.recipe or record.optimization,
            optimization=record.optimization, outcome=record.status, verdict=str(record.verdict),
            speedup=record.speedup, run=run.state.run_id, date=record.finished, timing=record.timing_mode,
            device=run.state.env.get("gpu") or "CPU"))
    except OSError as exc:
        run.log(f"experience not recorded: {exc}")


def mark_seen(run: Run, source: str) -> None:
    """A kept version's own values count as tried: a step down never returns to where we were. No record
    names them: the state keeps them (`seen`)."""
    run.state.seen.extend(k for k in dict.fromkeys(current_keys(source)) if k not in run.state.seen)
    run.state.tried.extend(k for k in run.state.seen if k not in run.state.tried)
