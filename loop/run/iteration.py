"""One iteration: a value that a proposer makes and named stage functions carry to its record.

    propose   `candidate`: a playbook candidate, its sweep first where it carries one (`step --recipe`
              and the unattended loop; `loop.run.suggest` and `loop.run.unattended` choose it through
              the one screen, `suggest.Screen`); `edit`: the agent's own edit of the target (`tileloop
              step -m`), not screened: the agent asked for it (an A/A check, a version measured
              before), and a change no check runs is decided `unexercised` when it is measured
    apply     the proposed source written to the target; the target checked the only change
    commit    the change described and committed, pending
    verify    the ahead-of-time compile gate, or the repository's test command    (`loop.run.measuring`)
    measure   one judge per backend, or the bench command                         (`loop.run.measuring`)
    decide    the repository checked after kernel code ran, and the rules' decision (again after a remeasure)
    record    the counters, the stop state and the record, built once
    finish    the message amended, a rejected commit moved aside, the record appended (`loop.run.recording`)

`state.inflight` names the stage at every step, so `resume` can finish or record an interrupted
iteration exactly once (`loop.run.resume`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

from loop import decide as rules
from loop.common.errors import UserError
from loop.common.files import atomic_write_text
from loop.common.messages import Failure, Inflight
from loop.measure.evaluate import guard_failures, timing_of
from loop.measure.launch import JudgeAhead
from loop.records import gitops
from loop.records.results import NOT_CHECKED, BackendResult, Record
from loop.run import measuring
from loop.run.core import Run, now
from loop.run.integrity import changed_while_measured, check_integrity
from loop.run.recording import count, finish, new_record, pending_message
from loop.run.sweep import sweep_stage
from loop.target.change import describe
from loop.target.coverage import unexercised
from playbook.recipe import Candidate


@dataclass(frozen=True)
class Iteration:
    """What one iteration is and what its stages found: each stage returns it with its part filled."""

    n: int
    optimization: str
    hypothesis: str = ""
    recipe: str | None = None
    key: str | None = None  # the candidate's key (a sweep's: the sweep's): tried once it is decided
    kind: str = "agent"
    rationale: str = ""
    expected: str = ""
    sweep: dict | None = None  # the sweep that chose this version (`loop.run.sweep`), kept in the record
    source: str | None = None  # the proposed version of the target; None: the agent's edit, already in the tree
    allow_unchanged: bool = False  # an A/A check: the best version evaluated against itself
    # apply
    incumbent: str = ""
    candidate: str = ""
    started: str = ""
    clock: float = 0.0  # time.monotonic() when it was applied (its sweep began): its wall time runs from there
    # commit
    change: rules.Change | None = None
    can: rules.Measurability | None = None
    # verify, measure
    results: dict[str, BackendResult] = field(default_factory=dict)
    raw: dict = field(default_factory=dict)
    gate: dict = field(default_factory=dict)
    # decide
    decision: rules.Decision | None = None
    remeasured: bool = False
    # record
    stop: rules.Stop | None = None
    record: Record | None = None


# ------------------------------------------------------------------------------------------- propose


def edit(run: Run, optimization: str, hypothesis: str = "", *, rationale: str = "", expected: str = "",
         allow_unchanged: bool = False, recipe: str | None = None, key: str | None = None) -> Iteration:
    """The agent's proposer: its own edit of the target, found in the tree by `apply`."""
    return Iteration(run.state.last_iteration + 1, optimization, hypothesis, recipe, key, rationale=rationale,
                     expected=expected, allow_unchanged=allow_unchanged)


def candidate(run: Run, cand: Candidate, optimization: str | None = None, hypothesis: str | None = None,
              rationale: str = "", expected: str = "", announce: bool = False) -> Iteration:
    """The playbook's proposer (`step --recipe`, the unattended loop): `cand` as one experiment, its
    untried sweep values timed first when it carries at least two (`step --key <its key>` passes the
    candidate without its sweep), the best of them proposed. `announce`: log what is proposed."""
    hypothesis = cand.hypothesis if hypothesis is None else hypothesis
    n = run.state.last_iteration + 1
    sweep = cand.sweep.untried(run.state.tried) if cand.sweep is not None and not run.state.harness else None
    if sweep is None:
        title = optimization or cand.title
        if announce:
            run.log(f"#{n} apply {title} [{cand.recipe}]")
        return Iteration(n, title, hypothesis, cand.recipe, cand.key, cand.kind, rationale, expected, source=cand.source)
    if not hypothesis or hypothesis == cand.hypothesis:  # the step's own speaks of one value: the sweep's of all
        hypothesis = sweep.hypothesis or hypothesis
    hypothesis += (f" (swept over {', '.join(str(v.value) for v in sweep.values)} in one judged measurement; "
                   f"the best value measured again alone decides)")
    started, clock = now(), time.monotonic()  # the experiment's time includes its sweep's measurement
    summary, chosen = sweep_stage(run, n, cand, sweep, hypothesis)
    title = optimization or (sweep.named(chosen.value) if chosen else sweep.title)
    if announce:
        run.log(f"#{n} apply {title} [{cand.recipe}]")
    return Iteration(n, title, hypothesis, cand.recipe, sweep.key, cand.kind, rationale, expected, summary,
                     (chosen or sweep.values[0]).source, started=started, clock=clock)


# ------------------------------------------------------------------------------------------- the stages


def evaluate(run: Run, it: Iteration) -> tuple[Record, rules.Stop]:
    """The proposed iteration through every stage; the record as written (with its commit) and the stop state."""
    it = apply(run, it)
    ahead = measuring.judge_ahead(run, it.n)  # it gets ready while the candidate is committed (and compiled)
    try:
        # a HarnessFailure is not the candidate's fault: state keeps the in-flight iteration for `resume`
        it = measure(run, commit(run, it), ahead)
    finally:
        if ahead is not None:
            ahead.cancel()  # not used (the compile gate failed, or anything raised): ended
    run.stage("decide")
    it = decide(run, it)
    if it.decision.action == "remeasure":
        run.log(f"#{it.n} {it.decision.reason}")
        it = decide(run, measure(run, it), remeasured=True)
    it = record(run, it)
    return finish(run, it.record), it.stop


def apply(run: Run, it: Iteration) -> Iteration:
    """The proposed source written to the target (an agent's edit is there already); then the run's
    position and the tree checked (only the target changed), and both versions read."""
    if it.source is not None:
        run.state.inflight = Inflight(it.n, "apply", it.optimization, key=it.key, hypothesis=it.hypothesis,
                                      recipe=it.recipe, sweep=it.sweep or None)
        run.save()
        atomic_write_text(run.root / run.state.target, it.source)
        run.stage("apply")
    run.check_position()
    check_integrity(run)
    cand_src = (run.root / run.state.target).read_text()
    inc_src = gitops.show_file(run.root, run.state.best_commit, run.state.target)
    if cand_src == inc_src and not it.allow_unchanged:
        raise UserError(f"the target {run.state.target} is unchanged since the best commit",
                        hint="edit the target first (or pass --allow-unchanged for an A/A check)")
    return replace(it, incumbent=inc_src, candidate=cand_src, started=it.started or now(), clock=it.clock or time.monotonic(),
                   optimization=" ".join(it.optimization.split()) or "unnamed change")


def commit(run: Run, it: Iteration) -> Iteration:
    """The change described (can it show in this run's timing?) and committed with a pending message."""
    change = describe(it.incumbent, it.candidate, it.kind)
    can = rules.measurability(change, run.timing_mode)  # before timing: can this change show in it?
    run.state.inflight = Inflight(it.n, "commit", it.optimization, key=it.key, hypothesis=it.hypothesis,
                                  recipe=it.recipe, started=it.started, kind=it.kind, sweep=it.sweep or None)
    run.stage("commit")
    sha = gitops.commit(run.root, pending_message(run, it.n, it.optimization, it.hypothesis), [run.state.target],
                        allow_empty=it.candidate == it.incumbent)
    run.state.inflight = replace(run.state.inflight, commit=sha)
    run.save()
    if not can.measurable:
        run.log(f"#{it.n} unmeasured: {can.reason}; correctness is checked, the timing is not decided on")
    return replace(it, change=change, can=can)


def measure(run: Run, it: Iteration, ahead: JudgeAhead | None = None) -> Iteration:
    """The verify and measure stages (`loop.run.measuring`) of the committed candidate beside the best."""
    results, raw, gate = measuring.measure_version(run, it.n, it.incumbent, it.candidate, ahead)
    return replace(it, results=results, raw=raw, gate=gate)


def decide(run: Run, it: Iteration, remeasured: bool = False) -> Iteration:
    """The repository put back after kernel code ran (a change there overrides the rules: the target
    changed is the candidate's doing, anything else voids the measurement), else the rules' decision."""
    tampered = changed_while_measured(run, it.candidate)
    unmeasurable = "" if remeasured or it.can.measurable else it.can.reason
    judged = judgement(run, it.results, it.raw, (it.incumbent, it.candidate), remeasured, unmeasurable)
    return replace(it, decision=tampered or judged, remeasured=remeasured)


def judgement(run: Run, results: dict[str, BackendResult], raw: dict, sources: tuple[str, str],
              remeasured: bool = False, unmeasurable: str = "") -> rules.Decision:
    """The rules' decision on one measurement (`loop.decide.judged_decision`), from the target backend's
    result, the guard backends' failures and what the checks ran of the candidate."""
    tb = run.state.target_backend
    target = results[tb]
    # the incumbent's failure on any backend says nothing about the candidate
    failed = next(((name, r) for name, r in raw.items() if r.get("failed_impl") == "incumbent" and r.get("status") != "ok"),
                  None)
    if failed is not None:
        name, r = failed
        outcome = rules.Outcome(r.get("status"), r.get("message", ""), failed_impl="incumbent", backend=name)
        return rules.judged_decision(run.policy, outcome)
    outcome = rules.Outcome(target.status, target.reason)
    if target.status == "ok":
        outcome = replace(outcome, timing=timing_of(raw[tb]), unmeasurable=unmeasurable,
                          unexercised=tuple(unexercised(*sources, target.launched, target.called))
                          if target.launched is not None else ())
    return rules.judged_decision(run.policy, outcome, remeasured,
                                  guard_failures=guard_failures(results, tb) if target.status == "ok" else ())


def record(run: Run, it: Iteration) -> Iteration:
    """The counters and the stop state updated, and the iteration's record built (once), written
    beside its logs before the record stage is entered."""
    decision, can, tb = it.decision, it.can, run.state.target_backend
    status = {"keep": "keep", "revert": "revert", "crash": "crash", "unmeasured": "unmeasured"}[decision.action]
    void = decision.verdict == rules.VOID
    results = it.results
    if void:  # nothing it measured counts: every backend that ran says why
        results = {name: voided(b, decision.reason) for name, b in results.items()}
    elif status == "unmeasured":  # its timing measured nothing: the record carries none
        results = {name: b.unmeasured(f"not timed for the decision: {can.reason}") for name, b in results.items()}
    target = results[tb]
    failure = None if target.status in ("ok", "unmeasured") else Failure(target.status, target.reason)
    correctness = "PASS" if target.correctness == "PASS" and decision.verdict not in ("incorrect", "guard_failed") else "FAIL"
    if void:
        correctness = NOT_CHECKED  # its checks are void too: neither PASS nor FAIL for the candidate
    rec = new_record(run, it.n, optimization=it.optimization, status=status, source=it.candidate, started=it.started,
                     wall_s=time.monotonic() - it.clock, speedup=decision.speedup, hypothesis=it.hypothesis,
                     recipe=it.key or it.recipe, correctness=correctness, latency_ms=target.latency_ms, backends=results,
                     decision=replace(decision, remeasured=it.remeasured), stop=None, failure=failure,
                     compile=it.gate, rationale=it.rationale, expected=it.expected, kind=it.kind,
                     change=replace(it.change, measurable=can.measurable, reason=can.reason),
                     unchecked=measuring.unchecked(it.raw, tb), sweep=it.sweep)
    # counted as its record will count (its key and every value its sweep tried are tried), then its stop state
    rec = count(run, rec)
    stop = rec.stop
    atomic_write_text(run.iter_dir(it.n) / "record.json", json.dumps(rec.to_json(), indent=1, default=str))
    run.stage("record")
    return replace(it, record=rec, stop=stop)


def voided(b: BackendResult, why: str) -> BackendResult:
    """A backend's result of a void measurement: nothing it measured or checked is kept but why."""
    if b.status in ("unavailable", "not_run"):
        return b
    return replace(b, status="unmeasured", reason=why[:500], latency_ms=None, incumbent_ms=None, correctness=None,
                   shapes=[], launched=None, called=None)
