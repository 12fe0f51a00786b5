"""Iteration 0: the target as given, measured and recorded as the run's first best version."""

from __future__ import annotations

import time

from loop.common.errors import UserError
from loop.measure.evaluate import guard_failures
from loop.records import gitops, history
from loop.records.results import Record, append_record
from loop.run.core import GIT_SNAPSHOT, now, portable_env, with_changes
from loop.run.measuring import Measuring, unchecked
from loop.run.recording import Recording
from loop.target.contract import source_hash


class Baseline(Measuring, Recording):
    def resume_baseline(self) -> Record:
        """Iteration 0 interrupted (a kill during init): finished from its record if that was written,
        else measured again from the base commit. A baseline commit without its record is dropped
        and made again; the run branch is made if the kill came before it."""
        done = [r for r in self.records() if r.iteration == 0]
        if done:
            rec = done[0]
            self.state.best_commit, self.state.best_latency_ms = rec.commit, rec.latency_ms
            self.state.last_iteration, self.state.inflight = 0, None
            self.save()
            self.render()
            return rec
        if not gitops.branch_exists(self.root, self.state.branch):
            gitops.require_clean(self.root)
            gitops.checkout(self.root, self.state.base_commit)
            gitops.create_branch(self.root, self.state.branch)
        elif gitops.current_branch(self.root) != self.state.branch:
            raise UserError(f"the repository is on {gitops.current_branch(self.root)!r}, not the run's branch "
                            f"{self.state.branch!r}", hint=f"git checkout {self.state.branch}")
        tip = gitops.head_sha(self.root)
        if tip != self.state.base_commit:
            trailers = gitops.parse_trailers(gitops.commit_message(self.root, tip))
            if (trailers.get("Tileloop-Run"), trailers.get("Tileloop-Iteration")) != (self.state.run_id, "0"):
                raise UserError(f"branch tip {tip[:10]} is neither the run's base commit nor its baseline",
                                hint="inspect the branch by hand; tileloop will not move commits it did not make")
            gitops.reset_hard(self.root, self.state.base_commit)
        if not (self.dir / GIT_SNAPSHOT).exists():
            self.snapshot_git_dir()
        return self.baseline()

    def baseline(self) -> Record:
        started, t0 = now(), time.monotonic()
        src = (self.root / self.state.target).read_text()
        self.state.inflight = {"iteration": 0, "stage": "measure", "optimization": "baseline"}
        self.save()
        results, raw, gate = self._measure(0, None, src)
        target = results[self.state.target_backend]
        if target.status != "ok":
            raise UserError(f"the baseline does not pass: {self.state.target_backend}: {target.status}: {target.reason}",
                            hint=f"logs under {target.worker_dir}")
        bad = guard_failures(results, self.state.target_backend)
        if bad:
            raise UserError(f"the baseline fails on a guard backend: {'; '.join(bad)}")
        record = Record(run=self.state.run_id, iteration=0, optimization="baseline", status="keep", correctness="PASS",
                        latency_ms=target.latency_ms, target_backend=self.state.target_backend, backends=results,
                        commit=None, parent=self.state.base_commit, hypothesis="", env=portable_env(self.state.env),
                        source_hash=source_hash(src), started=started, finished=now(), wall_s=round(time.monotonic() - t0, 3),
                        decision={"verdict": "baseline", "reason": "iteration 0: the code as given"}, compile=gate,
                        harness=self.state.harness, cumulative_speedup=1.0, timing=self.timing_mode,
                        unchecked=unchecked(raw, self.state.target_backend))
        sha = gitops.commit(self.root, history.commit_message(record), [], allow_empty=True)
        record = with_changes(record, commit=sha)
        append_record(self.results_path, record)
        self.state.best_commit, self.state.best_latency_ms = sha, target.latency_ms
        self.state.last_iteration, self.state.inflight = 0, None
        self._mark_seen(src)
        self.state.active_s += record.wall_s
        self.save()
        self.render()
        return record
