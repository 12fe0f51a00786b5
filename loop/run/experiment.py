"""The experiment: init (branch + baseline), one iteration, the unattended loop, and resume.

One iteration: propose -> apply -> integrity -> commit -> measure (verify inside) -> decide ->
record -> keep|revert. `state.inflight` names the stage at every step, so `resume` can finish
or record an interrupted iteration exactly once.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from loop import backends as backend_registry
from loop import decide
from loop.records import experience, gitops, history
from loop.measure import external
from loop.run import state as st
from loop.target.contract import load_kernel, source_hash, spec_dtypes
from loop.common.errors import EnvironmentMismatch, IntegrityError, UserError
from loop.common.errors import HarnessFailure
from loop.decide import comparisons
from loop.measure.evaluate import compile_gate, compile_summary, guard_failures, measure, not_run, require_available
from loop.records.results import BackendResult, Record, Row, append_record, read_records, render_perf_results
from loop.common.files import atomic_write_text
from loop.measure.launch import run_worker
from loop.run.progress import ProgressView, plain_log
from loop.common.settings import Settings

Log = Callable[[str], None]
CPU_TIMING = {"min_reps": 5, "max_reps": 15, "budget_s": 0.5}
DEFAULT_ARCHS = ("sm_90", "sm_100")  # Hopper and Blackwell: every candidate must compile for both


def _now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


stderr_log = plain_log


def probe_environment(root: Path, settings: Settings) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tileloop-probe-") as tmp:
        workdir = Path(tmp)
        result = run_worker(workdir, None, None, settings, workdir / "triton-cache", timeout_s=300, name="probe")
    if result.get("status") != "ok":
        raise UserError(f"environment probe failed: {result.get('message')}", hint=(result.get("log_tail") or "")[-300:])
    return result["probe"]


class Experiment:
    """A run bound to its repository; every public method leaves state.json consistent."""

    def __init__(self, root: Path, state: st.RunState, settings: Settings, log: Log = stderr_log):
        from dataclasses import replace

        # the run's own per-worker timeout, unless TILELOOP_WORKER_TIMEOUT overrides it for this session
        if "TILELOOP_WORKER_TIMEOUT" not in os.environ:
            settings = replace(settings, worker_timeout_s=state.worker_timeout_s)
        self.root, self.state, self.settings = root, state, settings
        self.policy = decide.Policy(**state.policy)
        self.progress_view = ProgressView(state.run_id, self.policy.max_iters, log)
        self.progress_view.update(best=state.best_latency_ms)
        self.log = self.progress_view.log

    # ------------------------------------------------------------------ paths and helpers
    @property
    def dir(self) -> Path:
        return st.run_dir(self.root, self.state.run_id)

    @property
    def results_path(self) -> Path:
        return self.dir / "results.jsonl"

    @property
    def perf_path(self) -> Path:
        return self.dir / "perf_results.md"

    def iter_dir(self, n: int) -> Path:
        """Everything one iteration's workers wrote: jobs, results, logs, the candidate copies."""
        return self.dir / "logs" / f"iter-{n:03d}"

    def records(self) -> list[Record]:
        return read_records(self.results_path)

    def save(self) -> None:
        st.save(self.root, self.state)

    def stage(self, name: str, **extra) -> None:
        assert self.state.inflight is not None
        self.state.inflight.update(stage=name, **extra)
        self.save()
        self.progress_view.update(stage=name)
        if self.settings.test_kill_at == name and self.state.inflight.get("iteration", 0) >= 1:
            # fault injection for the resume tests: a kill -9 on entering this stage
            os.kill(os.getpid(), signal.SIGKILL)

    def render(self) -> None:
        recs = self.records()
        header = {
            "target": f"`{self.state.target}` ({self.state.language})",
            "branch": f"`{self.state.branch}`",
            "target backend": self.state.target_backend,
            "device": self.state.env.get("gpu") or "CPU (Triton interpreter)",
            "latency_ms": "geometric mean over benchmark shapes of the target backend's median",
        }
        if self.state.harness:
            header.update({"device": self.state.env.get("gpu") or "no GPU visible to tileloop",
                           "latency_ms": "geometric mean over the bench command's records of their median over "
                                         f"{self.state.harness['bench_repeats']} runs (ms)",
                           "test command": f"`{self.state.harness['test_cmd']}`",
                           "bench command": f"`{self.state.harness['bench_cmd']}`"})
        text = render_perf_results(self.state.run_id, header, [Row.from_record(r) for r in recs],
                                   any(r.interpreter for r in recs))
        atomic_write_text(self.perf_path, text)

    def progress(self) -> decide.Progress:
        """What the stop rules see. An interrupted iteration (a kill, a reboot) counts as an iteration
        but says nothing about the candidates: it is neither a crash nor a non-improvement there, so a
        resume right after a genuine crash does not escalate on the interruption."""
        real = [(o, v) for o, v in zip(self.state.outcomes, self.state.verdicts) if v != "interrupted"]
        return decide.Progress(
            iterations=max(self.state.last_iteration, 0), elapsed_s=self.state.active_s,
            outcomes=tuple(o for o, _ in real), last_verdict=real[-1][1] if real else None,
            crash_causes=tuple(c for c in self.state.crash_causes if c != "interrupted"))

    def stop_state(self, exhausted: bool = False) -> decide.StopState:
        p = self.progress()
        if exhausted:
            p = decide.Progress(p.iterations, p.elapsed_s, p.outcomes, p.last_verdict, p.crash_causes, True)
        return decide.stop_state(self.policy, p)

    def _check_position(self) -> None:
        branch = gitops.current_branch(self.root)
        if branch != self.state.branch:
            raise UserError(f"the repository is on {branch!r}, not the run's branch {self.state.branch!r}",
                            hint=f"git checkout {self.state.branch}")
        head = gitops.head_sha(self.root)
        if head != self.state.best_commit:
            raise UserError(f"branch tip {head[:10]} is not the run's best commit {self.state.best_commit[:10]}",
                            hint="tileloop resume repairs an interrupted iteration")

    # ------------------------------------------------------------------ measurement
    def _measure(self, n: int, incumbent_src: str | None, candidate_src: str) -> tuple[dict[str, BackendResult], dict, dict]:
        workdir = self.iter_dir(n)
        workdir.mkdir(parents=True, exist_ok=True)
        if self.state.harness:  # the repository's own test and bench commands decide (loop.external)
            if self.state.inflight is not None:
                self.stage("verify")

            def on_stage(what: str) -> None:  # the test command is the verify stage, entered above
                if what == "test":
                    self.log(f"#{n} test")
                else:
                    self._on_measure(n, what)

            results, raw = external.measure(
                root=self.root, target=self.state.target, harness=external.Harness.from_json(self.state.harness),
                workdir=workdir, incumbent_src=incumbent_src, candidate_src=candidate_src,
                timeout_s=self.settings.worker_timeout_s, allowed_untracked=set(self.state.untracked_at_start),
                on_stage=on_stage)
            return results, raw, {}
        stem = Path(self.state.target).stem
        impls = {}
        if incumbent_src is not None:
            impls["incumbent"] = workdir / f"{stem}__incumbent.py"
            impls["incumbent"].write_text(incumbent_src)
        label = "candidate" if incumbent_src is not None else "baseline"
        impls[label] = workdir / f"{stem}__{label}.py"
        impls[label].write_text(candidate_src)
        gate = {}
        if self.state.inflight is not None:
            self.stage("verify")
        if self.state.archs:
            self.log(f"#{n} compile {','.join(self.state.archs)}")
            raw = compile_gate(workdir=workdir, spec_path=self.root / self.state.spec, target_dir=(self.root / self.state.target).parent,
                               target=impls[label], language=self.state.language, archs=self.state.archs,
                               settings=self.settings, cache_root=self.dir / "triton-cache",
                               dtypes=spec_dtypes(self.root / self.state.spec))
            gate = {"status": raw["status"], "archs": self.state.archs, "rows": compile_summary(raw)}
            if raw["status"] != "ok":
                reason = f"ahead-of-time compile failed: {raw.get('message', '')}"[:500]
                results = {name: not_run(name, self.state.availability, "compile gate failed") for name in self.state.backends}
                tb = self.state.target_backend
                results[tb] = BackendResult(tb, True, raw["status"], reason, correctness="FAIL",
                                            timing_label=backend_registry.get(tb).timing_label,
                                            worker_dir=str(workdir.relative_to(self.root)))
                return results, {}, gate
        m = measure(root=self.root, workdir=workdir, spec_path=self.root / self.state.spec,
                    target_dir=(self.root / self.state.target).parent, impls=impls, check=[label],
                    backend_names=self.state.backends, availability=self.state.availability,
                    target_backend=self.state.target_backend, device=self.state.device, seed=self.state.seed + n,
                    settings=self.settings, cache_root=self.dir / "triton-cache",
                    on_stage=lambda s: self._on_measure(n, s), timing=CPU_TIMING if self.state.device == "cpu" else None)
        return m.results, m.raw, gate

    def _on_measure(self, n: int, what: str) -> None:
        if self.state.inflight is not None and self.state.inflight.get("stage") != "measure":
            self.stage("measure")
        self.log(f"#{n} {what}")

    # ------------------------------------------------------------------ baseline
    def baseline(self) -> Record:
        started, t0 = _now(), time.monotonic()
        src = (self.root / self.state.target).read_text()
        self.state.inflight = {"iteration": 0, "stage": "measure", "optimization": "baseline"}
        self.save()
        results, _raw, gate = self._measure(0, None, src)
        target = results[self.state.target_backend]
        if target.status != "ok":
            raise UserError(f"the baseline does not pass: {self.state.target_backend}: {target.status}: {target.reason}",
                            hint=f"logs under {target.worker_dir}")
        bad = guard_failures_from(results, self.state.target_backend)
        if bad:
            raise UserError(f"the baseline fails on a guard backend: {'; '.join(bad)}")
        record = Record(run=self.state.run_id, iteration=0, optimization="baseline", status="keep", correctness="PASS",
                        latency_ms=target.latency_ms, target_backend=self.state.target_backend, backends=results,
                        commit=None, parent=self.state.base_commit, hypothesis="", env=portable_env(self.state.env),
                        source_hash=source_hash(src), started=started, finished=_now(), wall_s=round(time.monotonic() - t0, 3),
                        decision={"verdict": "baseline", "reason": "iteration 0: the code as given"}, compile=gate,
                        harness=self.state.harness)
        sha = gitops.commit(self.root, history.commit_message(record), [], allow_empty=True)
        record = _with(record, commit=sha)
        append_record(self.results_path, record)
        self.state.best_commit, self.state.best_latency_ms = sha, target.latency_ms
        self.state.last_iteration, self.state.inflight = 0, None
        self._mark_seen(src)
        self.state.active_s += record.wall_s
        self.save()
        self.render()
        return record

    # ------------------------------------------------------------------ one iteration
    def check_integrity(self) -> None:
        """Only the target may change. Anything else is refused before it runs, set aside under
        sandbox/<run>/refused/<time>/ (a patch, copies of new files) and restored; a changed
        .git/config is restored from the run's snapshot."""
        others, new = gitops.integrity_violations(self.root, self.state.target, set(self.state.untracked_at_start))
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
        started, t0 = _now(), time.monotonic()
        optimization = " ".join(optimization.split()) or "unnamed change"
        self.state.inflight = {"iteration": n, "stage": "commit", "optimization": optimization, "hypothesis": hypothesis,
                               "recipe": recipe, "key": key, "started": started}
        self.stage("commit")
        pending = self._record(n, optimization, hypothesis, recipe, "crash", "FAIL", None, {}, None, {}, {}, None,
                               cand_src, started, 0.0)
        sha = gitops.commit(self.root, history.commit_message(pending, pending=True), [self.state.target],
                            allow_empty=cand_src == inc_src)
        self.state.inflight["commit"] = sha
        self.save()
        try:
            results, raw, gate = self._measure(n, inc_src, cand_src)
        except HarnessFailure:
            raise  # not the candidate's fault: state keeps the in-flight iteration for `resume`
        self.stage("decide")
        decision, remeasured = self._decide(results, raw), False
        if decision.action == "remeasure":
            self.log(f"#{n} {decision.reason}")
            results, raw, gate = self._measure(n, inc_src, cand_src)
            decision, remeasured = self._decide(results, raw, remeasured=True), True
        status = {"keep": "keep", "revert": "revert", "crash": "crash"}[decision.action]
        target = results[self.state.target_backend]
        failure = None if target.status == "ok" else {"status": target.status, "message": target.reason}
        correctness = "PASS" if target.correctness == "PASS" and decision.verdict not in ("incorrect", "guard_failed") else "FAIL"
        self._update_counters(decision, status, target)
        stop = self.stop_state()
        record = self._record(n, optimization, hypothesis, recipe, status, correctness, target.latency_ms, results,
                              decision.speedup, {**decision.to_json(), "remeasured": remeasured}, stop.to_json(), failure,
                              cand_src, started, time.monotonic() - t0, parent=self.state.best_commit, key=key)
        record = _with(record, compile=gate, rationale=rationale, expected=expected, kind=kind)
        atomic_write_text(self.iter_dir(n) / "record.json", json.dumps(record.to_json(), indent=1, default=str))
        self.stage("record")
        self._finish(record)
        return record, stop

    def _decide(self, results: dict[str, BackendResult], raw: dict, remeasured: bool = False) -> decide.Decision:
        tb = self.state.target_backend
        target = results[tb]
        if target.status == "fallback":
            return decide.Decision("revert", "guard_failed", target.reason)
        if target.status != "ok":
            return decide.decide(self.policy, failure=target.status, failure_message=target.reason)
        return decide.decide(self.policy, shapes=comparisons(raw[tb], self.policy),
                             guard_failures=guard_failures_from(results, tb), remeasured=remeasured)

    def _update_counters(self, decision: decide.Decision, status: str, target: BackendResult) -> None:
        self.state.outcomes.append(status)
        self.state.verdicts.append(decision.verdict)
        if status == "crash":
            self.state.crash_causes.append(decision.verdict)
        inflight = self.state.inflight or {}
        if inflight.get("key"):
            self.state.tried.append(inflight["key"])
        if status == "keep" and decision.priority == "low" and inflight.get("key"):
            self.state.demoted.append(inflight["key"].split("=")[0])

    def _record(self, n, optimization, hypothesis, recipe, status, correctness, latency, results, speedup, decision,
                stop, failure, src, started, wall, parent=None, key=None) -> Record:
        return Record(run=self.state.run_id, iteration=n, optimization=optimization, status=status, correctness=correctness,
                      latency_ms=latency, target_backend=self.state.target_backend, backends=results, commit=None,
                      parent=parent or self.state.best_commit, hypothesis=hypothesis, recipe=key or recipe, speedup=speedup,
                      decision=decision, stop=stop, failure=failure, env=portable_env(self.state.env), source_hash=source_hash(src),
                      started=started, finished=_now(), wall_s=round(wall, 3), harness=self.state.harness)

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
        record = _with(record, commit=sha)
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
        if n >= 1 and record.decision.get("verdict") != "interrupted":
            self.remember(record)
        self.log(f"#{n} {record.optimization}: {record.status} ({record.decision.get('verdict')}) "
                 f"{record.decision.get('reason', '')}")
        return record

    # ------------------------------------------------------------------ unattended loop
    def run_loop(self, max_iters: int | None = None) -> decide.StopState:
        from playbook import next_candidate
        from playbook.analysis import analyze
        from playbook.base import why_nothing

        self.state.mode = "run"
        self.save()
        done_here, why = 0, None
        while True:
            stop = self.stop_state()
            if stop.state != "continue":
                break
            if max_iters is not None and done_here >= max_iters:
                stop = decide.StopState("stop", f"reached --max-iters {max_iters}")
                break
            if self.state.device == "cuda" and (bad := self.gpu_health()):
                stop = decide.StopState("escalate", f"GPU health check failed: {bad}")
                break
            src = (self.root / self.state.target).read_text()
            an = analyze(src, backend=self.state.target_backend, arch=None if self.arch == "cpu" else self.arch)
            cand = self._injected(self.state.last_iteration + 1) or next_candidate(src, an, self.state.tried,
                                                                                    self.state.demoted,
                                                                                    self.state.skip_recipes)
            if cand is None:
                stop = self.stop_state(exhausted=True)
                if stop.state == "stop" and stop.reason.startswith("playbook exhausted"):
                    why = why_nothing(src, an, self.state.tried, self.state.skip_recipes)
                break
            self.progress_view.update(iteration=self.state.last_iteration + 1, change=cand.title)
            self.log(f"#{self.state.last_iteration + 1} apply {cand.title} [{cand.recipe}]")
            self.state.inflight = {"iteration": self.state.last_iteration + 1, "stage": "apply", "key": cand.key,
                                   "optimization": cand.title, "hypothesis": cand.hypothesis, "recipe": cand.recipe}
            self.save()
            atomic_write_text(self.root / self.state.target, cand.source)
            self.stage("apply")
            self.evaluate(cand.title, cand.hypothesis, cand.recipe, cand.key, kind=cand.kind)
            done_here += 1
        # an exhausted playbook says, per recipe, why it has nothing left: where a new recipe or an edit would go
        self.state.stopped = {**stop.to_json(), **({"recipes": why} if why else {})}
        self.save()
        self.log(f"stopped: {stop.state}: {stop.reason}; best {self.state.best_latency_ms} ms at {self.state.best_commit[:10]}")
        for rid, reason in (why or {}).items():
            self.log(f"  {rid}: {reason}")
        self.progress_view.close()
        return stop

    def _mark_seen(self, source: str) -> None:
        """A kept version's own values count as tried: a step down never returns to where we were."""
        from playbook.base import current_keys

        self.state.tried.extend(k for k in current_keys(source) if k not in self.state.tried)

    def _injected(self, n: int):
        """A fault planted by TILELOOP_TEST_INJECT for iteration n (tests of unattended runs), once."""
        from playbook import Candidate

        for it, path in self.settings.test_inject:
            key = f"fault-injection:{it}"
            if it == n and key not in self.state.tried:
                return Candidate("fault-injection", "fault", key, f"injected fault: {Path(path).stem}",
                                 "a planted fault: it must be classified and reverted, and the run must go on",
                                 Path(path).read_text())
        return None

    @property
    def arch(self) -> str:
        cap = self.state.env.get("capability")
        return f"sm_{cap[0]}{cap[1]}" if cap else "cpu"

    def remember(self, record: Record) -> None:
        """One experience entry per finished experiment (never fatal: experience is advisory)."""
        from playbook.analysis import analyze

        try:
            cls = analyze(gitops.show_file(self.root, self.state.best_commit, self.state.target)).kernel_class
            experience.append(experience.Entry(
                op=self.state.op, kernel_class=cls, language=self.state.language, backend=self.state.target_backend,
                arch=self.arch, kind=record.kind or "agent", key=record.recipe or record.optimization,
                optimization=record.optimization, outcome=record.status, verdict=str(record.decision.get("verdict")),
                speedup=record.speedup, run=self.state.run_id, date=record.finished))
        except OSError as exc:
            self.log(f"experience not recorded: {exc}")

    def suggestions(self, limit: int = 3) -> list[dict]:
        """Next candidates from the playbook for the current best version, experience first."""
        from playbook import next_candidate
        from playbook.analysis import analyze

        src = gitops.show_file(self.root, self.state.best_commit, self.state.target)
        an = analyze(src, backend=self.state.target_backend, arch=None if self.arch == "cpu" else self.arch)
        ranked = experience.recommend(experience.load(), an.kernel_class, self.state.target_backend, self.arch)
        order = {r["kind"]: i for i, r in enumerate(ranked) if r["kept"]}
        tried, out = list(self.state.tried), []
        while len(out) < 3 * limit:
            c = next_candidate(src, an, tried, self.state.demoted, self.state.skip_recipes)
            if c is None:
                break
            tried.append(c.key)
            hist = next((r for r in ranked if r["kind"] == c.kind), None)
            out.append({"recipe": c.recipe, "kind": c.kind, "key": c.key, "optimization": c.title,
                        "hypothesis": c.hypothesis, "experience": hist})
        out.sort(key=lambda c: order.get(c["kind"], len(order)))  # stable: playbook order within equal rank
        return out[:limit]

    def gpu_health(self) -> str | None:
        """None when the device answers a tiny round trip within a minute, else why not."""
        workdir = self.dir / "logs" / "health"
        res = run_worker(workdir, None, None, self.settings, self.dir / "triton-cache" / "health", timeout_s=60, name="health")
        if res.get("status") == "ok":
            return None
        return f"{res.get('status')}: {res.get('message')}"

    # ------------------------------------------------------------------ resume
    def repair(self) -> Record | None:
        """Finish or record an interrupted iteration exactly once; return its record if one was written."""
        inflight = self.state.inflight
        if not inflight:
            return None
        n = inflight["iteration"]
        interrupted_at = inflight.get("stage")
        if n == 0:
            raise UserError("the run was interrupted during its baseline; start a new run with tileloop init")
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
                self.state.inflight = None
                self.save()
                return None
            gitops.check_integrity(self.root, self.state.target, set(self.state.untracked_at_start))
            pending = self._record(n, inflight.get("optimization") or inflight.get("key") or "interrupted change",
                                   inflight.get("hypothesis", ""), inflight.get("recipe"), "crash", "FAIL", None, {}, None,
                                   {}, {}, None, target_path.read_text(), inflight.get("started", _now()), 0.0)
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
                              inflight.get("hypothesis", ""), inflight.get("recipe"), "crash", "FAIL", None, results, None,
                              decision.to_json(), self.stop_state().to_json(),
                              {"status": "interrupted", "message": decision.reason}, src,
                              inflight.get("started", _now()), 0.0, key=inflight.get("key"))
        record = _with(record, optimization=f"{record.optimization} (interrupted)")
        return self._finish(record)

    def check_environment(self, probe: dict) -> None:
        now = {k: probe.get(k) for k in st.FINGERPRINT_KEYS}
        diff = [f"{k}: {v!r} -> {now[k]!r}" for k, v in self.state.fingerprint().items() if now[k] != v]
        if diff:
            raise EnvironmentMismatch(f"this run was measured on a different machine or toolchain ({'; '.join(diff)})",
                                      hint="start a new run with tileloop init; results from two setups are not comparable")


def portable_env(env: dict) -> dict:
    """The environment as records keep it: tools by name and version, not by where they were installed."""
    return {k: (os.path.basename(v) if k in ("tileiras", "ncu") and isinstance(v, str) else v) for k, v in env.items()}


def guard_failures_from(results: dict[str, BackendResult], target_backend: str) -> list[str]:
    from loop.measure.evaluate import Measurement

    return guard_failures(Measurement(results, {}), target_backend)


def _with(record: Record, **changes) -> Record:
    from dataclasses import replace

    return replace(record, **changes)


# ---------------------------------------------------------------------- entry points


def default_branch(op: str, now: dt.datetime | None = None) -> str:
    return f"tileloop/{op}-{(now or dt.datetime.now()):%Y%m%d-%H%M}"


def init_run(target: str, *, device: str, branch: str | None, target_backend: str | None, seed: int,
             policy: decide.Policy, settings: Settings, log: Log = stderr_log,
             archs: list[str] | None = None, worker_timeout_s: float | None = None,
             harness: external.Harness | None = None, skip_recipes: list[str] | None = None,
             mode: str = "agent") -> Experiment:
    """Branch and baseline. With `harness`, the repository's own commands decide (no spec.py, no compile gate).
    `mode` "run" (an unattended run) is recorded before the baseline, so that a run killed right
    after its baseline is continued by `tileloop resume`, not left waiting for an agent's step."""
    root = gitops.find_root(Path.cwd())
    if harness is None:
        kernel = load_kernel(target, root)
        target_rel, spec_rel, language, op = kernel.target, kernel.spec, kernel.language, kernel.op
    else:
        if target_backend is not None:
            raise UserError("--target-backend does not apply to a run with --test-cmd/--bench-cmd: the bench command decides")
        if archs:
            raise UserError("--archs does not apply to a run with --test-cmd/--bench-cmd: the compile gate needs the "
                            "example inputs of a spec.py", hint="let the test command compile what it needs")
        (target_rel, language, op), spec_rel, archs = external.load_target(target, root), None, []
    if skip_recipes:
        from playbook import get as get_recipe

        for rid in skip_recipes:
            get_recipe(rid)  # an unknown id is refused with the list of valid ones
    gitops.require_clean(root)
    if not gitops.is_tracked(root, str(target_rel)):
        raise UserError(f"target {target_rel} is not committed", hint="git add and commit it first")
    if spec_rel is not None and not gitops.is_tracked(root, str(spec_rel)):
        raise UserError(f"spec {spec_rel} is not committed", hint="git add and commit it first")
    from playbook.hazards import scan

    for hazard in scan((root / target_rel).read_text(), language):
        if hazard.severity != "info":
            log(f"Tile IR hazard: {target_rel}:{hazard}")
    if branch is None:  # a default name never collides: a second run in the same minute gets -2, -3, ...
        base_name, n = default_branch(op), 1
        branch = base_name
        while gitops.branch_exists(root, branch) or st.state_path(root, branch.removeprefix("tileloop/")).exists():
            n += 1
            branch = f"{base_name}-{n}"
    if gitops.branch_exists(root, branch):
        raise UserError(f"branch {branch!r} already exists", hint="pass --branch NAME, or wait a minute for a new default name")
    gitops.check_branch_name(root, branch)
    run_id = re.sub(r"[^A-Za-z0-9._-]+", "-", branch.removeprefix("tileloop/"))
    if st.state_path(root, run_id).exists():
        raise UserError(f"a run named {run_id!r} already exists in {st.SANDBOX}/", hint="pass --branch NAME")
    names = [external.BACKEND] if harness else [b.name for b in backend_registry.for_language(language, device)]
    if target_backend is not None and target_backend not in names:
        raise UserError(f"--target-backend {target_backend} does not apply to a {language} target with "
                        f"--device {device}; valid: {', '.join(names)}")
    log(f"probing the environment ({device})")
    probe = probe_environment(root, settings)
    if device == "cuda" and not probe.get("cuda_available"):
        raise UserError(f"no GPU available: {probe.get('cuda_reason')}",
                        hint="pass --device cpu to run the loop under the Triton interpreter")
    if harness:
        avail, chosen = {external.BACKEND: {"available": True, "reason": ""}}, external.BACKEND
    else:
        avail = {n: backend_registry.availability(backend_registry.get(n), probe, device).to_json() for n in names}
        typed = {n: backend_registry.Availability(**a) for n, a in avail.items()}
        chosen = target_backend or backend_registry.default_target(language, device, typed)
        backend_registry.get(chosen)
        require_available(chosen, avail)
    origin = gitops.current_branch(root)
    base = gitops.head_sha(root)
    untracked = list(gitops.tree_status(root).untracked)
    state = st.RunState(run_id=run_id, branch=branch, origin_branch=origin, target=str(target_rel),
                        spec="" if spec_rel is None else str(spec_rel), language=language, op=op, device=device,
                        target_backend=chosen, backends=names, availability=avail, base_commit=base, seed=seed,
                        env=probe, untracked_at_start=untracked, policy=asdict(policy), created=_now(),
                        archs=list(DEFAULT_ARCHS if archs is None else archs),
                        worker_timeout_s=worker_timeout_s or settings.worker_timeout_s,
                        harness=harness.to_json() if harness else None, skip_recipes=list(skip_recipes or []),
                        mode=mode)
    gitops.ensure_excluded(root, f"/{st.SANDBOX}/")
    gitops.create_branch(root, branch)
    exp = Experiment(root, state, settings, log)
    exp.save()
    (exp.dir / "git-config.snapshot").write_bytes(gitops.config_path(root).read_bytes())
    st.set_current(root, run_id)
    log(f"run {run_id} on branch {branch}: target backend {chosen}; measuring the baseline")
    try:
        exp.baseline()
    except BaseException:
        # leave nothing half-made: back to the user's branch, drop the empty run branch, keep the logs
        gitops.checkout(root, origin or base)
        with gitops.open_repo(root) as repo:
            repo.git.branch("-D", branch)
        st.state_path(root, run_id).unlink(missing_ok=True)
        raise
    return exp


def open_run(run_id: str | None, settings: Settings, log: Log = stderr_log, cwd: Path | None = None) -> Experiment:
    root = gitops.find_root(cwd or Path.cwd())
    rid = st.current(root, run_id)
    return Experiment(root, st.load(root, rid), settings, log)
