"""`tileloop resume`: an interrupted iteration finished or recorded exactly once (as `crash
(interrupted)`), and a resume on other hardware or another toolchain refused."""

from __future__ import annotations

import json

from loop import decide
from loop.common.errors import EnvironmentMismatch, IntegrityError, UserError
from loop.common.processes import end_leftovers
from loop.measure import external
from loop.measure.evaluate import not_run
from loop.records import gitops, history
from loop.records.results import NOT_CHECKED, Record
from loop.run import state as st
from loop.run.baseline import Baseline
from loop.run.core import now, with_changes
from loop.run.iteration import Iteration


class Resume(Iteration, Baseline):
    def end_leftover_workers(self) -> None:
        """A worker of this run still alive (its tileloop was killed before it could end it) holds the GPU
        and would skew the next timing: end it before anything else runs."""
        ended = end_leftovers(self.dir / "logs")
        if ended:
            self.log(f"ended {len(ended)} worker(s) of this run still alive: pid {', '.join(map(str, ended))}")

    def repair(self) -> Record | None:
        """Finish or record an interrupted iteration exactly once; return its record if one was written."""
        inflight = self.state.inflight
        if not inflight:
            return None
        n = inflight["iteration"]
        interrupted_at = inflight.get("stage")
        if n == 0:
            return self.resume_baseline()
        workdir = self.iter_dir(n)
        done = [r for r in self.records() if r.iteration == n]
        if done:
            self._finish(done[0])
            return done[0]
        if inflight.get("stage") == "record" and (workdir / "record.json").exists():
            record = Record.from_json(json.loads((workdir / "record.json").read_text()))
            return self._finish(record)
        tip = gitops.head_sha(self.root)
        tip_trailers = gitops.parse_trailers(gitops.commit_message(self.root, tip))
        is_experiment = tip != self.state.best_commit and tip_trailers.get("Tileloop-Run") == self.state.run_id \
            and tip_trailers.get("Tileloop-Iteration") == str(n)
        target_path = self.root / self.state.target
        best_src = gitops.show_file(self.root, self.state.best_commit, self.state.target)
        if not is_experiment:
            if tip != self.state.best_commit:
                raise UserError(f"branch tip {tip[:10]} is neither the best commit nor the interrupted experiment",
                                hint="inspect the branch by hand; tileloop will not move commits it did not make")
            if target_path.read_text() == best_src:  # interrupted before anything was applied
                if interrupted_at == "sweep" and inflight.get("key"):  # a sweep counts no iteration; tried again once
                    key = inflight["key"]
                    (self.state.tried if key in self.state.interrupted else self.state.interrupted).append(key)
                    self.log(f"#{n} the sweep {inflight.get('optimization', key)} was interrupted before it chose: "
                             "no iteration recorded, the tree is at the best version")
                self.state.inflight = None
                self.save()
                return None
            others, new = self.integrity_violations()
            if others or new:
                raise IntegrityError(f"the change touches files other than the target {self.state.target}: "
                                     f"{', '.join((others + new)[:8])}",
                                     hint="an iteration may change the target file only; revert the other files")
            pending = self._record(n, inflight.get("optimization") or inflight.get("key") or "interrupted change",
                                   inflight.get("hypothesis", ""), inflight.get("recipe"), "crash", NOT_CHECKED, None, {},
                                   None, {}, {}, None, target_path.read_text(), inflight.get("started", now()), 0.0)
            sha = gitops.commit(self.root, history.commit_message(pending, pending=True), [self.state.target])
            self.stage("record", commit=sha)
        else:
            self.stage("record", commit=tip)
        src = target_path.read_text()
        results = (external.not_run_results("interrupted") if self.state.harness else
                   {name: not_run(name, self.state.availability, "interrupted") for name in self.state.backends})
        decision = decide.Decision("crash", "interrupted", f"the run was interrupted at stage {interrupted_at}")
        self.state.outcomes.append("crash")
        self.state.verdicts.append("interrupted")
        self.state.crash_causes.append("interrupted")
        key = inflight.get("key")
        if key:  # a kill says nothing about the candidate: it is tried again once, then counts as tried
            (self.state.tried if key in self.state.interrupted else self.state.interrupted).append(key)
        record = self._record(n, inflight.get("optimization") or inflight.get("key") or "interrupted change",
                              inflight.get("hypothesis", ""), inflight.get("recipe"), "crash", NOT_CHECKED, None, results, None,
                              decision.to_json(), self.stop_state().to_json(),
                              {"status": "interrupted", "message": decision.reason}, src,
                              inflight.get("started", now()), 0.0, key=inflight.get("key"))
        record = with_changes(record, optimization=f"{record.optimization} (interrupted)", sweep=inflight.get("sweep"))
        return self._finish(record)

    def check_environment(self, probe: dict) -> None:
        now = {k: probe.get(k) for k in st.FINGERPRINT_KEYS}
        diff = [f"{k}: {v!r} -> {now[k]!r}" for k, v in self.state.fingerprint().items() if now[k] != v]
        if diff:
            raise EnvironmentMismatch(f"this run was measured on a different machine or toolchain ({'; '.join(diff)})",
                                      hint="start a new run with tileloop init; results from two setups are not comparable")
