"""One iteration of an agent's or the playbook's change: integrity (the target is the only file
changed) -> commit -> verify + measure -> decide -> record -> keep|revert. `state.inflight` names
the stage at every step, so `resume` can finish or record an interrupted iteration exactly once."""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import replace

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
        patch, copies of the new files) and restored; .git/hooks, .git/info and .git/config are
        restored from the run's snapshot the same way. Other new files (notes, an editor's swap file,
        `step --json > step.json`) are the user's: left where they are, and named in the log."""
        where = self._refused_dir()
        git_files = self.restore_git_dir(where)  # plain file operations: before git reads a planted file
        others, new = self.integrity_violations()
        if not (others or new or git_files):
            return
        if others or new:
            gitops.set_aside(self.root, others, new, where)
        listed = ", ".join((others + new + git_files)[:8])
        raise IntegrityError(f"refused: the change touches files other than the target {self.state.target}: {listed}; "
                             f"they were restored, the refused change is saved in {where.relative_to(self.root)}",
                             hint="an iteration may change the target file only")

    def _refused_dir(self):
        return self.dir / "refused" / dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")

    def integrity_violations(self) -> tuple[list[str], list[str]]:
        """(changed tracked files other than the target, new files the target or spec imports)."""
        others, new = gitops.integrity_violations(self.root, self.state.target, set(self.state.untracked_at_start))
        imported = imported_files(self.root, self.state.target, self.state.spec or None, new)
        if len(imported) < len(new):
            self.log(f"left alone (new files the target does not import): {', '.join(p for p in new if p not in imported)[:300]}")
        return others, imported

    def changed_while_measured(self, cand_src: str) -> decide.Decision | None:
        """Kernel code runs as the user: it could write to the repository while it is measured (the
        spec, the target, the run's records, its branch, .git's hooks or config). Everything is put
        back (what differed set aside under sandbox/<run>/refused/). The target changed is the
        candidate's doing (revert, incorrect); anything else voids the measurement: nothing says the
        candidate did it (another process may have), so nothing is charged to it."""
        where = self._refused_dir()
        git_files = self.restore_git_dir(where)  # first: before git reads a planted file
        records = self.put_records_back()
        sha = (self.state.inflight or {}).get("commit")
        if sha and gitops.put_branch_back(self.root, self.state.branch, sha):
            records.append(f"branch {self.state.branch}")
        others, new = self.integrity_violations()
        target = self.state.target
        target_changed = (self.root / target).read_text() != cand_src
        if target_changed:
            others.append(target)
        if not (others or new or git_files or records):
            return None
        if others or new:
            gitops.set_aside(self.root, others, new, where)
        listed = ", ".join((others + new + git_files + records)[:8])
        saved = f"; what changed is saved in {where.relative_to(self.root)}" if where.exists() else ""
        if target_changed:
            return decide.Decision("revert", "incorrect", f"the target changed while the candidate was measured ({listed}): "
                                   f"the candidate's doing (restored{saved})")
        return decide.void(f"{listed} changed while the candidate was measured: the measurement is void, "
                           f"nothing is charged to the candidate (restored{saved})")

    def evaluate(self, optimization: str, hypothesis: str = "", recipe: str | None = None, key: str | None = None,
                 allow_unchanged: bool = False, rationale: str = "", expected: str = "",
                 kind: str = "agent", sweep: dict | None = None) -> tuple[Record, decide.StopState]:
        """Commit and evaluate the working-tree version of the target (integrity checked first).
        `sweep`: the sweep that chose this version (`loop.run.sweep`), kept in the record; its values
        count as tried once the iteration is decided."""
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
                                   "recipe": recipe, "key": key, "started": started, "kind": kind,
                                   **({"sweep": sweep} if sweep else {})}
            self.stage("commit")
            pending = self._record(n, optimization, hypothesis, recipe, "crash", NOT_CHECKED, None, {}, None, {}, {}, None,
                                   cand_src, started, 0.0)
            pending = with_changes(pending, sweep=sweep)
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
            decision = tampered
        status = {"keep": "keep", "revert": "revert", "crash": "crash", "unmeasured": "unmeasured"}[decision.action]
        void = decision.verdict == decide.VOID
        if void:  # nothing it measured counts: every backend that ran says why
            results = {name: voided(b, decision.reason) for name, b in results.items()}
        elif status == "unmeasured":  # its timing measured nothing: the record carries none
            results = {name: b.unmeasured(f"not timed for the decision: {can.reason}") for name, b in results.items()}
        target = results[self.state.target_backend]
        failure = None if target.status in ("ok", "unmeasured") else {"status": target.status, "message": target.reason}
        correctness = "PASS" if target.correctness == "PASS" and decision.verdict not in ("incorrect", "guard_failed") else "FAIL"
        if void:
            correctness = NOT_CHECKED  # its checks are void too: neither PASS nor FAIL for the candidate
        self._update_counters(decision, status, target)
        if sweep:  # every value the sweep tried is tried: no later step or sweep measures it again
            self.state.tried.extend(v["key"] for v in sweep["values"] if v["key"] not in self.state.tried)
        stop = self.stop_state()
        record = self._record(n, optimization, hypothesis, recipe, status, correctness, target.latency_ms, results,
                              decision.speedup, {**decision.to_json(), "remeasured": remeasured}, stop.to_json(), failure,
                              cand_src, started, time.monotonic() - t0, parent=self.state.best_commit, key=key)
        record = with_changes(record, compile=gate, rationale=rationale, expected=expected, kind=kind,
                              change={**change.to_json(), "measurable": can.measurable, "reason": can.reason},
                              unchecked=unchecked(raw, self.state.target_backend), sweep=sweep)
        atomic_write_text(self.iter_dir(n) / "record.json", json.dumps(record.to_json(), indent=1, default=str))
        self.stage("record")
        return self._finish(record), stop  # the record as written: with its commit

    def _decide(self, results: dict[str, BackendResult], raw: dict, sources: tuple[str, str],
                remeasured: bool = False, unmeasurable: str = "") -> decide.Decision:
        tb = self.state.target_backend
        target = results[tb]
        # the incumbent's failure on any backend says nothing about the candidate
        failed = next(((name, r) for name, r in raw.items() if r.get("failed_impl") == "incumbent" and r.get("status") != "ok"),
                      None)
        if failed is not None:
            name, r = failed
            outcome = {"status": r.get("status"), "message": r.get("message", ""), "failed_impl": "incumbent", "backend": name}
            return decide.judged_decision(self.policy, outcome)
        outcome = {"status": target.status, "message": target.reason}
        if target.status == "ok":
            seen = raw[tb].get("correctness", {})
            launched, called = seen.get("launched", {}).get("candidate"), seen.get("called", {}).get("candidate")
            outcome.update(timing=raw[tb]["timing"], unmeasurable=unmeasurable,
                           unexercised=unexercised(*sources, launched, called) if launched is not None else [])
        return decide.judged_decision(self.policy, outcome, remeasured,
                                      guard_failures=guard_failures(results, tb) if target.status == "ok" else ())


def voided(b: BackendResult, why: str) -> BackendResult:
    """A backend's result of a void measurement: nothing it measured or checked is kept but why."""
    if b.status in ("unavailable", "not_run"):
        return b
    return replace(b, status="unmeasured", reason=why[:500], latency_ms=None, incumbent_ms=None, correctness=None,
                   shapes=[])
