"""Keep / revert / stop decisions as pure functions over measurements. No I/O, no clock.

The policy follows the TileGym loop, made precise:

* correctness FAIL -> revert; crash (compile_error, runtime_error, timeout, oom) -> crash;
* a guard backend incorrect or crashing -> revert;
* a correct change that cannot show in this timing mode (`loop.decide.measurable`) -> unmeasured: the
  source goes back like a revert, and no timing is looked at;
* any benchmark shape slower by more than `regression` *beyond noise* (its whole interval below
  1 - regression) -> revert;
* a speedup counts only when the lower end of its interval clears 1 (the measured noise band);
  otherwise -> revert as `within_noise`;
* counted speedup >= 5% -> keep; 2-5% -> keep at lower priority; < 2% -> keep but stop;
* speedups over `suspicious` (3x), overall or at any one shape, are measured again before they count;
* a measurement voided by what is not the candidate's doing (a tracked file other than the target,
  the run's records or git files changed while it was measured; the incumbent failed a check or an
  audit) -> unmeasured, verdict `void` (`void`): nothing is charged to the candidate;
* stop: two non-improvements in a row, `max_iters` (25), a time budget, an exhausted playbook;
  two crashes in a row -> escalate (a person should look: the playbook cannot explain them).
  Unmeasured iterations (void ones too) count towards the iteration limit only: they say nothing about
  gains or crashes.

Noise: incumbent and candidate are timed interleaved, so sample i of each comes from the same
round. Per shape we take the paired log-ratios d_i = log(t_incumbent / t_candidate), their
median as the effect, and a robust standard error (1.2533 * 1.4826 * MAD / sqrt(n)). The
geometric mean over shapes averages the effects; its interval is +- z * se (z = 2.576), never
narrower than +- `noise_floor` for the noise the interleaving cannot see. The floor is 1%: incumbent
and candidate run in processes of their own (the judge's kernel processes), and between two processes
running the same code the GPU showed effects up to 0.9% that every round of the interleaving shares
(A/A experiments of softmax and of the A/A adversary on an H100: with a 0.5% floor 3 of 40 were kept
as marginal, none of 40 with 1%: docs/results/judge-H100-2026-11-25.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from loop.common.messages import Action, Decision, Stop, StopName, Timing
from loop.common.stats import ShapeComparison, paired

CRASH_STATUSES = ("compile_error", "runtime_error", "timeout", "oom")


@dataclass(frozen=True)
class Policy:
    keep_continue: float = 0.05
    keep_low: float = 0.02
    regression: float = 0.02
    z: float = 2.576
    noise_floor: float = 0.01
    suspicious: float = 3.0
    max_iters: int = 25
    max_no_improve: int = 2
    max_crashes: int = 2
    time_budget_s: float | None = None
    early_stop: bool = True  # False (--no-early-stop): only iterations, time, playbook or escalation stop a run

    def to_json(self) -> dict:
        return asdict(self)


def compare_shape(shape, incumbent_ms: Sequence[float], candidate_ms: Sequence[float], policy: Policy) -> ShapeComparison:
    """Paired comparison of interleaved samples at one shape (speedup > 1: candidate faster)."""
    return paired(shape, incumbent_ms, candidate_ms, policy.z, policy.noise_floor)


def comparisons(timing: Timing, policy: Policy) -> list[ShapeComparison]:
    """Per benchmark shape, the incumbent against the candidate, from the judge's timing result."""
    return [compare_shape(s.shape, s.samples("incumbent"), s.samples("candidate"), policy) for s in timing.shapes]


@dataclass(frozen=True)
class Outcome:
    """One judged measurement of the target backend as the rules read it: its status (ok, fallback, or
    the typed failure) and message, which implementation failed and on which backend (where the
    incumbent did), the judge's timing result when ok, the functions the change touched that no check
    ran, and why the change cannot show in the timing mode (empty: it can)."""

    status: str
    message: str = ""
    failed_impl: str | None = None
    backend: str | None = None
    timing: Timing | None = None
    unexercised: tuple[str, ...] = ()
    unmeasurable: str = ""

    @classmethod
    def from_json(cls, d: dict) -> "Outcome":
        """An outcome as decision-check keeps it in its trial events (fields it does not read ignored)."""
        timing = Timing.from_json(d["timing"]) if d.get("timing") else None
        return cls(d["status"], d.get("message", ""), d.get("failed_impl"), d.get("backend"), timing,
                   tuple(d.get("unexercised") or ()), d.get("unmeasurable") or "")



def combine(shapes: Sequence[ShapeComparison], policy: Policy) -> tuple[float, float, float]:
    """Geometric-mean speedup over shapes and its interval."""
    k = len(shapes)
    center = sum(s.log_effect for s in shapes) / k
    se = math.sqrt(sum(s.log_se**2 for s in shapes)) / k
    half = max(policy.z * se, math.log1p(policy.noise_floor))
    return math.exp(center), math.exp(center - half), math.exp(center + half)


VOID = "void"


def void(reason: str) -> Decision:
    """A measurement that says nothing about the candidate (`reason`: what voided it): the change goes
    back as an unmeasured one does, and neither the stop rules nor the experience log count it."""
    return Decision("unmeasured", VOID, reason)


def judged_decision(policy: Policy, outcome: Outcome, remeasured: bool = False, guard_failures: Sequence[str] = ()
                    ) -> Decision:
    """The loop's decision on one judged measurement of its target backend, taken by an iteration
    (`loop.run.iteration`, with its guard backends' failures) and by decision-check's trials alike: a
    failure of the incumbent voids the measurement (unmeasured, verdict `void`: nothing is charged to
    the candidate), a failed backend proof is `guard_failed`, a typed failure of the candidate
    (incorrect, uncorroborated, a crash) is decided as such, a change no check ran is `unexercised`,
    one that cannot show in the timing mode `unmeasured`; else the paired comparisons of every timed
    shape decide."""
    if outcome.status not in ("ok", "fallback") and outcome.failed_impl == "incumbent":
        where = f" on {outcome.backend}" if outcome.backend else ""
        return void(f"the incumbent failed{where} ({outcome.status}: {str(outcome.message)[:300]}): "
                    "the measurement is void, nothing is charged to the candidate")
    if outcome.status == "fallback":
        return Decision("revert", "guard_failed", outcome.message)
    if outcome.status != "ok":
        return decide(policy, failure=outcome.status, failure_message=outcome.message)
    if outcome.unexercised or outcome.unmeasurable:  # correct, but its timing is not looked at
        return decide(policy, guard_failures=guard_failures, unexercised=outcome.unexercised,
                      unmeasurable=outcome.unmeasurable)
    return decide(policy, shapes=comparisons(outcome.timing, policy), guard_failures=guard_failures,
                  remeasured=remeasured)


def decide(
    policy: Policy,
    *,
    failure: str | None = None,
    failure_message: str = "",
    shapes: Sequence[ShapeComparison] = (),
    guard_failures: Sequence[str] = (),
    remeasured: bool = False,
    unexercised: Sequence[str] = (),
    unmeasurable: str = "",
) -> Decision:
    """One iteration's decision. `failure` is the target backend's typed failure, if any;
    `unexercised` the functions the change touched when none of them ran in the checks;
    `unmeasurable` why the change cannot show in this timing mode, when it cannot (its timing,
    if any, is not looked at)."""
    if failure in CRASH_STATUSES:
        return Decision("crash", failure, failure_message or failure)
    if failure == "incorrect":
        return Decision("revert", "incorrect", failure_message or "correctness check failed")
    if failure == "uncorroborated":  # the judge's clock does not bear out the kernel process's timings
        return Decision("revert", "uncorroborated", failure_message or "timing refused by the judge")
    if failure is not None:
        raise ValueError(f"unknown failure status {failure!r}")
    if guard_failures:
        return Decision("revert", "guard_failed", "; ".join(guard_failures))
    if unexercised:
        return Decision("revert", "unexercised", f"the change touches only {', '.join(unexercised)}, which no checked "
                        "shape runs: the correctness checks cannot have seen it")
    if unmeasurable:
        return Decision("unmeasured", "unmeasured", unmeasurable)
    if not shapes:
        raise ValueError("decide needs at least one shape comparison when nothing failed")
    rows = [s.to_json() for s in shapes]
    speedup, lo, hi = combine(shapes, policy)
    slow = [s for s in shapes if s.hi < 1.0 - policy.regression]
    if slow:
        worst = min(slow, key=lambda s: s.speedup)
        return Decision("revert", "regression",
                        f"shape {list(worst.shape)} slower by {1 / worst.speedup - 1:.1%} (interval {worst.lo:.3f}-{worst.hi:.3f}x)",
                        speedup, lo, hi, shapes=rows)
    if max(speedup, *(s.speedup for s in shapes)) > policy.suspicious and not remeasured:
        top = max(shapes, key=lambda s: s.speedup)
        what = f"{speedup:.2f}x" if speedup > policy.suspicious else f"{top.speedup:.2f}x at shape {list(top.shape)}"
        return Decision("remeasure", "suspicious", f"{what} exceeds {policy.suspicious}x: measure again before it counts",
                        speedup, lo, hi, shapes=rows)
    if lo <= 1.0:
        return Decision("revert", "within_noise", f"{speedup:.4f}x, interval {lo:.4f}-{hi:.4f}x does not clear noise",
                        speedup, lo, hi, shapes=rows)
    gain = speedup - 1.0
    if gain >= policy.keep_continue:
        return Decision("keep", "improved", f"{speedup:.4f}x (interval {lo:.4f}-{hi:.4f}x)", speedup, lo, hi, shapes=rows)
    if gain >= policy.keep_low:
        return Decision("keep", "low_gain", f"{speedup:.4f}x: 2-5%, keep at lower priority", speedup, lo, hi, "low", shapes=rows)
    return Decision("keep", "marginal", f"{speedup:.4f}x: below 2%, keep but stop", speedup, lo, hi, "low", True, shapes=rows)


@dataclass(frozen=True)
class Progress:
    """What the stop rules need to know about the run so far."""

    iterations: int  # experiments finished, baseline excluded
    elapsed_s: float
    outcomes: tuple[str, ...]  # per finished iteration: keep | revert | crash | unmeasured (in order)
    last_verdict: str | None = None  # of the last iteration decided on its timing or failure (not unmeasured)
    crash_causes: tuple[str, ...] = ()  # failure status of each crash, in order
    playbook_exhausted: bool = False
    timing: str = "gpu"  # interpreter | gpu | harness: what the decisions were made on


INTERPRETER_NOTES = (" (a run on Triton interpreter timings of the CPU, not GPU timings)",
                     " (decided on Triton interpreter timings of the CPU, not GPU timings)")


def stopping(what: StopName, reason: str, timing: str, timed: bool = False) -> Stop:
    """A stop state; under the interpreter its reason says so (`timed`: the rule read the timings)."""
    note = INTERPRETER_NOTES[timed] if timing == "interpreter" and what != "continue" else ""
    return Stop(what, reason + note, timing)


def stop_state(policy: Policy, progress: Progress) -> Stop:
    """The stop rules over the decided outcomes (unmeasured iterations are skipped: they measured
    nothing). Under the interpreter every stop says so in its reason, the rules that read timings
    that they decided on them."""

    def state(what: StopName, reason: str, timed: bool = False) -> Stop:
        return stopping(what, reason, progress.timing, timed)

    decided = [o for o in progress.outcomes if o != "unmeasured"]
    tail = decided[-max(policy.max_no_improve, policy.max_crashes):]
    crashes = [o for o in tail[-policy.max_crashes:] if o == "crash"]
    if len(crashes) >= policy.max_crashes:
        causes = ", ".join(progress.crash_causes[-policy.max_crashes:])
        return state("escalate", f"{policy.max_crashes} crashes in a row ({causes}): root cause unknown, needs a person")
    if policy.early_stop and progress.last_verdict == "marginal":
        return state("stop", "last improvement below 2%: keep but stop", timed=True)
    recent = tail[-policy.max_no_improve:]
    if policy.early_stop and len(recent) >= policy.max_no_improve and all(o != "keep" for o in recent):
        return state("stop", f"no improvement in {policy.max_no_improve} consecutive iterations", timed=True)
    if progress.iterations >= policy.max_iters:
        return state("stop", f"reached {policy.max_iters} iterations")
    if policy.time_budget_s is not None and progress.elapsed_s >= policy.time_budget_s:
        return state("stop", f"time budget of {policy.time_budget_s:.0f}s spent")
    if progress.playbook_exhausted:
        return state("stop", "playbook exhausted: every applicable candidate was tried")
    return state("continue", "")
