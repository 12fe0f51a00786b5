"""The record stage and keep|revert: one record per experiment, the commit message amended with its
trailers, a rejected commit moved to refs/tileloop/<run>/<n> and the branch reset to the best, the
counters the stop rules read, and the experience entry. Idempotent, so `resume` can finish it."""

from __future__ import annotations

from loop import decide
from loop.common.errors import UserError
from loop.records import experience, gitops, history
from loop.records.results import BackendResult, Record, append_record, cumulative
from loop.run.core import RunCore, now, portable_env, with_changes
from loop.target.contract import source_hash
from playbook.analysis import analyze
from playbook.base import current_keys


class Recording(RunCore):
    def _record(self, n, optimization, hypothesis, recipe, status, correctness, latency, results, speedup, decision,
                stop, failure, src, started, wall, parent=None, key=None) -> Record:
        """A record of iteration n; its cumulative speedup is the earlier kept ones' times its own, if kept."""
        earlier = cumulative([r for r in self.records() if r.iteration < n])
        return Record(run=self.state.run_id, iteration=n, optimization=optimization, status=status, correctness=correctness,
                      latency_ms=latency, target_backend=self.state.target_backend, backends=results, commit=None,
                      parent=parent or self.state.best_commit, hypothesis=hypothesis, recipe=key or recipe, speedup=speedup,
                      cumulative_speedup=earlier * speedup if status == "keep" and speedup is not None else earlier,
                      timing=self.timing_mode, decision=decision, stop=stop, failure=failure, env=portable_env(self.state.env),
                      source_hash=source_hash(src), started=started, finished=now(), wall_s=round(wall, 3),
                      harness=self.state.harness)

    def _finish(self, record: Record) -> Record:
        """Amend the message, move the rejected commit to its ref, append the record. Idempotent."""
        n = record.iteration
        ref = f"{history.ref_prefix(self.state.run_id)}{n}"
        tip = gitops.head_sha(self.root)
        t = gitops.parse_trailers(gitops.commit_message(self.root, tip))
        if tip != self.state.best_commit and t.get("Tileloop-Run") == self.state.run_id and t.get("Tileloop-Iteration") == str(n):
            sha = tip  # the experiment commit is still the tip
            if t.get("Tileloop-Status") == "pending":
                sha = gitops.amend_message(self.root, history.commit_message(record))
                self.stage("record", commit=sha)
            if record.status != "keep":
                gitops.update_ref(self.root, ref, sha)
                gitops.reset_hard(self.root, self.state.best_commit)
        else:  # already moved aside by an earlier, interrupted _finish
            sha = gitops.ref_sha(self.root, ref) if record.status != "keep" else tip
            if sha is None:
                raise UserError(f"iteration {n}: its commit is neither the branch tip nor under {ref}")
        record = with_changes(record, commit=sha)
        if not any(r.iteration == n for r in self.records()):
            append_record(self.results_path, record)
        if record.status == "keep":
            self.state.best_commit, self.state.best_latency_ms = sha, record.latency_ms
            self.progress_view.update(best=record.latency_ms)
            self._mark_seen(gitops.show_file(self.root, sha, self.state.target))
        self.state.last_iteration = n
        self.state.active_s += record.wall_s
        self.state.inflight = None
        self.save()
        self.render()
        if n >= 1 and experience.learned_from(record.decision.get("verdict")):
            self.remember(record)
        self.log(f"#{n} {record.optimization}: {record.status} ({record.decision.get('verdict')}) "
                 f"{record.decision.get('reason', '')}")
        return record

    def _update_counters(self, decision: decide.Decision, status: str, target: BackendResult) -> None:
        self.state.outcomes.append(status)
        self.state.verdicts.append(decision.verdict)
        if status == "crash":
            self.state.crash_causes.append(decision.verdict)
        inflight = self.state.inflight or {}
        key = inflight.get("key")
        if key and decision.verdict == decide.VOID:  # a void measurement says nothing: tried again once, as a kill is
            (self.state.tried if key in self.state.interrupted else self.state.interrupted).append(key)
        elif key:
            self.state.tried.append(key)
        if status == "keep" and decision.priority == "low" and inflight.get("key"):
            self.state.demoted.append(inflight["key"].split("=")[0])

    def remember(self, record: Record) -> None:
        """One experience entry per finished experiment (never fatal: experience is advisory)."""
        try:
            cls = analyze(gitops.show_file(self.root, self.state.best_commit, self.state.target), entry=self.entry()).kernel_class
            experience.append(experience.Entry(
                op=self.state.op, kernel_class=cls, language=self.state.language, backend=self.state.target_backend,
                arch=self.arch, kind=record.kind or "agent", key=record.recipe or record.optimization,
                optimization=record.optimization, outcome=record.status, verdict=str(record.decision.get("verdict")),
                speedup=record.speedup, run=self.state.run_id, date=record.finished, timing=record.timing_mode,
                device=self.state.env.get("gpu") or "CPU"))
        except OSError as exc:
            self.log(f"experience not recorded: {exc}")

    def _mark_seen(self, source: str) -> None:
        """A kept version's own values count as tried: a step down never returns to where we were."""
        self.state.tried.extend(k for k in current_keys(source) if k not in self.state.tried)
