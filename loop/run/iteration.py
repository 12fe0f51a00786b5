"""One iteration of an agent's or the playbook's change: integrity (the target is the only file
changed) -> commit -> verify + measure -> decide -> record -> keep|revert. `state.inflight` names
the stage at every step, so `resume` can finish or record an interrupted iteration exactly once."""

from __future__ import annotations

import datetime as dt
import json
import time

from loop import decide
from loop.common.errors import IntegrityError, UserError
from loop.common.files import atomic_write_text
from loop.measure.evaluate import guard_failures
from loop.records import gitops, history
from loop.records.results import NOT_CHECKED, BackendResult, Record
from loop.run.core import now, with_changes
from loop.run.measuring import Measuring, unchecked
from loop.run.recording import Recording
from loop.target.change import describe
from loop.target.contract import imported_files
from loop.target.coverage import unexercised


class Iteration(Measuring, Recording):
    def check_integrity(self) -> None:
        """Only the target may change. A changed tracked file, or a new file that the target (or the
        spec) imports, is refused before it runs, set aside under sandbox/<run>/refused/<time>/ (a
        patch, copies of the new files) and restored; a changed .git/config is restored from the run's
        snapshot. Other new files (notes, an editor's swap file, `step --json > step.json`) are the
        user's: left where they are, and named in the log."""
        others, new = self.integrity_violations()
        snap = self.dir / "git-config.snapshot"
        git_config = gitops.config_path(self.root)
        config_changed = snap.exists() and git_config.read_bytes() != snap.read_bytes()
        if not (others or new or config_changed):
            return
        where = self.dir / "refused" / dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        gitops.set_aside(self.root, others, new, where)
        if config_changed:
            where.mkdir(parents=True, exist_ok=True)
            (where / "git-config").write_bytes(git_config.read_bytes())
            git_config.write_bytes(snap.read_bytes())
        listed = ", ".join((others + new + ([".git/config"] if config_changed else []))[:8])
        raise IntegrityError(f"refused: the change touches files other than the target {self.state.target}: {listed}; "
                             f"they were restored, the refused change is saved in {where.relative_to(self.root)}",
                             hint="an iteration may change the target file only")

    def integrity_violations(self) -> tuple[list[str], list[str]]:
        """(changed tracked files other than the target, new files the target or spec imports)."""
        others, new = gitops.integrity_violations(self.root, self.state.target, set(self.state.untracked_at_start))
        imported = imported_files(self.root, self.state.target, self.state.spec or None, new)
        if len(imported) < len(new):
            self.log(f"left alone (new files the target does not import): {', '.join(p for p in new if p not in imported)[:300]}")
        return others, imported

    def changed_while_measured(self, cand_src: str) -> str | None:
        """Kernel code runs as the user: a candidate could write to the repository while it is measured
        (the spec, the records' inputs, the target itself). Anything tracked that differs from the
        experiment's commit, or a new file the target imports, voids the measurement: restored, set
        aside under sandbox/<run>/refused/, and the reason returned."""
        others, new = self.integrity_violations()
        target = self.state.target
        if (self.root / target).read_text() != cand_src:
            others.append(target)
        if not (others or new):
            return None
        where = self.dir / "refused" / dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        gitops.set_aside(self.root, others, new, where)
        return (f"the candidate changed {', '.join((others + new)[:8])} while it was measured: the measurement is void "
                f"(restored; the change is saved in {where.relative_to(self.root)})")

    def evaluate(self, optimization: str, hypothesis: str = "", recipe: str | None = None, key: str | None = None,
                 allow_unchanged: bool = False, rationale: str = "", expected: str = "",
                 kind: str = "agent") -> tuple[Record, decide.StopState]:
        """Commit and evaluate the working-tree version of the target (integrity checked first)."""
        self._check_position()
        self.check_integrity()
        cand_src = (self.root / self.state.target).read_text()
        inc_src = gitops.show_file(self.root, self.state.best_commit, self.state.target)
        if cand_src == inc_src and not allow_unchanged:
            raise UserError(f"the target {self.state.target} is unchanged since the best commit",
                            hint="edit the target first (or pass --allow-unchanged for an A/A check)")
        n = self.state.last_iteration + 1
        started, t0 = now(), time.monotonic()
        optimization = " ".join(optimization.split()) or "unnamed change"
        ahead = self.judge_ahead(n)  # it gets ready while the candidate is read, committed (and compiled)
        try:
            change = describe(inc_src, cand_src, kind)
            can = decide.measurability(change, self.timing_mode)  # before timing: can this change show in it?
            self.state.inflight = {"iteration": n, "stage": "commit", "optimization": optimization, "hypothesis": hypothesis,
                                   "recipe": recipe, "key": key, "started": started, "kind": kind}
            self.stage("commit")
            pending = self._record(n, optimization, hypothesis, recipe, "crash", NOT_CHECKED, None, {}, None, {}, {}, None,
                                   cand_src, started, 0.0)
            sha = gitops.commit(self.root, history.commit_message(pending, pending=True), [self.state.target],
                                allow_empty=cand_src == inc_src)
            self.state.inflight["commit"] = sha
            self.save()
            if not can.measurable:
                self.log(f"#{n} unmeasured: {can.reason}; correctness is checked, the timing is not decided on")
            # a HarnessFailure is not the candidate's fault: state keeps the in-flight iteration for `resume`
            results, raw, gate = self._measure(n, inc_src, cand_src, ahead)
        finally:
            if ahead is not None:
                ahead.cancel()  # not used (the compile gate failed, or anything raised): ended
        self.stage("decide")
        tampered = self.changed_while_measured(cand_src)
        unmeasurable = "" if can.measurable else can.reason
        decision, remeasured = self._decide(results, raw, (inc_src, cand_src), unmeasurable=unmeasurable), False
        if decision.action == "remeasure" and not tampered:
            self.log(f"#{n} {decision.reason}")
            results, raw, gate = self._measure(n, inc_src, cand_src)
            tampered = self.changed_while_measured(cand_src)
            decision, remeasured = self._decide(results, raw, (inc_src, cand_src), remeasured=True), True
        if tampered:
            decision = decide.Decision("revert", "incorrect", tampered)
        status = {"keep": "keep", "revert": "revert", "crash": "crash", "unmeasured": "unmeasured"}[decision.action]
        if status == "unmeasured":  # its timing measured nothing: the record carries none
            results = {name: b.unmeasured(f"not timed for the decision: {can.reason}") for name, b in results.items()}
        target = results[self.state.target_backend]
        failure = None if target.status in ("ok", "unmeasured") else {"status": target.status, "message": target.reason}
        correctness = "PASS" if target.correctness == "PASS" and decision.verdict not in ("incorrect", "guard_failed") else "FAIL"
        self._update_counters(decision, status, target)
        stop = self.stop_state()
        record = self._record(n, optimization, hypothesis, recipe, status, correctness, target.latency_ms, results,
                              decision.speedup, {**decision.to_json(), "remeasured": remeasured}, stop.to_json(), failure,
                              cand_src, started, time.monotonic() - t0, parent=self.state.best_commit, key=key)
        record = with_changes(record, compile=gate, rationale=rationale, expected=expected, kind=kind,
                              change={**change.to_json(), "measurable": can.measurable, "reason": can.reason},
                              unchecked=unchecked(raw, self.state.target_backend))
        atomic_write_text(self.iter_dir(n) / "record.json", json.dumps(record.to_json(), indent=1, default=str))
        self.stage("record")
        return self._finish(record), stop  # the record as written: with its commit

    def _decide(self, results: dict[str, BackendResult], raw: dict, sources: tuple[str, str],
                remeasured: bool = False, unmeasurable: str = "") -> decide.Decision:
        tb = self.state.target_backend
        target = results[tb]
        if target.status == "fallback":
            return decide.Decision("revert", "guard_failed", target.reason)
        if target.status != "ok":
            return decide.decide(self.policy, failure=target.status, failure_message=target.reason)
        seen = raw[tb].get("correctness", {})
        launched, called = seen.get("launched", {}).get("candidate"), seen.get("called", {}).get("candidate")
        missed = unexercised(*sources, launched, called) if launched is not None else []
        if unmeasurable:  # correct (and exercised): its timing is not looked at
            return decide.decide(self.policy, guard_failures=guard_failures(results, tb), unexercised=missed,
                                 unmeasurable=unmeasurable)
        return decide.decide(self.policy, shapes=decide.comparisons(raw[tb], self.policy),
                             guard_failures=guard_failures(results, tb), remeasured=remeasured, unexercised=missed)
