"""loop.decide: every branch of decide() and stop_state(), plus statistical properties.

Samples are synthetic: interleaved rounds of (incumbent, candidate) timings with seeded jitter.
"""

from __future__ import annotations

import math
import random

import pytest

from loop.decide import CRASH_STATUSES, Decision, Policy, Progress, ShapeComparison, combine, compare_shape, decide, stop_state

POLICY = Policy()


# ----------------------------------------------------------------------------- sample builders


def interleaved(rng: random.Random, *, factor: float = 1.0, n: int = 30, spread: float = 0.001, base: float = 1.0,
                outlier_p: float = 0.0, outlier: float = 1.2, drift: float = 0.0) -> tuple[list[float], list[float]]:
    """n rounds of (incumbent, candidate) timings in ms; the candidate's true time is base / factor.

    `spread` is the lognormal sigma of each sample, `outlier_p` the chance that a sample is
    `outlier` times slower, `drift` the sigma of a factor shared by both samples of a round.
    """
    inc, cand = [], []
    for _ in range(n):
        shared = math.exp(rng.gauss(0.0, drift)) if drift else 1.0
        a = base * shared * math.exp(rng.gauss(0.0, spread))
        b = base / factor * shared * math.exp(rng.gauss(0.0, spread))
        if rng.random() < outlier_p:
            a *= outlier
        if rng.random() < outlier_p:
            b *= outlier
        inc.append(a)
        cand.append(b)
    return inc, cand


def shapes_for(factors, *, seed: int = 0, spread: float = 0.001, n: int = 30, policy: Policy = POLICY,
               **kw) -> list[ShapeComparison]:
    rng = random.Random(seed)
    out = []
    for i, f in enumerate(factors):
        inc, cand = interleaved(rng, factor=f, n=n, spread=spread, base=0.1 * (i + 1), **kw)
        out.append(compare_shape((1024 * (i + 1),), inc, cand, policy))
    return out


def fixed(speedup: float, half: float = 0.001, shape=(1,)) -> ShapeComparison:
    """A comparison with a chosen effect and interval half-width (in log space)."""
    c = math.log(speedup)
    return ShapeComparison(tuple(shape), speedup, math.exp(c - half), math.exp(c + half), c, half / POLICY.z, 30)


# ----------------------------------------------------------------------------- compare_shape / combine


def test_compare_shape_recovers_a_planted_speedup_with_a_tight_interval():
    inc, cand = interleaved(random.Random(1), factor=1.25, spread=0.01)
    s = compare_shape((4096,), inc, cand, POLICY)
    assert s.shape == (4096,) and s.n == 30
    assert s.speedup == pytest.approx(1.25, rel=0.01)
    assert s.lo < s.speedup < s.hi
    assert s.lo > 1.2 and s.hi < 1.3


def test_compare_shape_is_symmetric_for_a_slowdown():
    inc, cand = interleaved(random.Random(2), factor=1 / 1.25, spread=0.01)
    s = compare_shape((7,), inc, cand, POLICY)
    assert s.speedup == pytest.approx(0.8, rel=0.01)
    assert s.hi < 0.85


def test_compare_shape_pairs_rounds_so_shared_drift_cancels():
    # 20% round-to-round drift shared by both samples of a round, 0.1% private noise
    inc, cand = interleaved(random.Random(3), factor=1.03, spread=0.001, drift=0.2)
    s = compare_shape((1,), inc, cand, POLICY)
    assert s.lo > 1.015 and s.hi < 1.045  # the floor (+-1%) only: uncancelled, 20% drift would swamp a 3% effect


def test_compare_shape_interval_never_narrower_than_the_noise_floor():
    inc = [1.0] * 30
    cand = [1.0 / 1.1] * 30  # zero spread: MAD and stdev are 0
    s = compare_shape((1,), inc, cand, POLICY)
    assert s.speedup == pytest.approx(1.1)
    assert math.log(s.hi / s.speedup) == pytest.approx(math.log1p(POLICY.noise_floor))
    assert math.log(s.speedup / s.lo) == pytest.approx(math.log1p(POLICY.noise_floor))


def test_compare_shape_uses_stdev_when_mad_is_zero():
    # more than half the log-ratios equal: MAD is 0 but the samples do vary
    inc = [1.0] * 30
    cand = [1.0] * 20 + [0.5] * 10
    s = compare_shape((1,), inc, cand, POLICY)
    assert s.log_se > 0


def test_compare_shape_with_one_sample_has_an_unbounded_interval():
    s = compare_shape((1,), [2.0], [1.0], POLICY)
    assert s.speedup == pytest.approx(2.0)
    assert s.lo == 0.0 and s.hi == math.inf


def test_compare_shape_without_samples_raises():
    with pytest.raises(ValueError):
        compare_shape((1,), [], [1.0], POLICY)


def test_combine_is_the_geometric_mean_over_shapes():
    speedup, lo, hi = combine([fixed(1.21), fixed(1.0, shape=(2,))], POLICY)
    assert speedup == pytest.approx(1.1)
    assert lo < 1.1 < hi


# ----------------------------------------------------------------------------- decide(): failures


@pytest.mark.parametrize("status", ["compile_error", "runtime_error", "timeout", "oom"])
def test_crash_statuses_give_crash(status):
    assert status in CRASH_STATUSES
    d = decide(POLICY, failure=status, failure_message=f"{status} details", shapes=shapes_for([2.0]))
    assert (d.action, d.verdict, d.reason) == ("crash", status, f"{status} details")
    assert d.speedup is None


def test_crash_without_message_uses_the_status_as_reason():
    d = decide(POLICY, failure="oom")
    assert (d.action, d.verdict, d.reason) == ("crash", "oom", "oom")


def test_incorrect_reverts():
    d = decide(POLICY, failure="incorrect", failure_message="max abs err 0.5 at (127,) float16", shapes=shapes_for([2.0]))
    assert (d.action, d.verdict) == ("revert", "incorrect")
    assert "0.5" in d.reason
    d = decide(POLICY, failure="incorrect")
    assert (d.action, d.verdict, d.reason) == ("revert", "incorrect", "correctness check failed")


@pytest.mark.parametrize("status", ["segfault", "fallback", "ok", ""])
def test_unknown_failure_raises(status):
    with pytest.raises(ValueError, match="unknown failure"):
        decide(POLICY, failure=status, shapes=shapes_for([1.1]))


def test_no_failure_and_no_shapes_raises():
    with pytest.raises(ValueError):
        decide(POLICY)


def test_guard_failure_reverts_even_a_big_speedup():
    d = decide(POLICY, shapes=shapes_for([1.5, 1.5]), guard_failures=["tileir: incorrect", "ptx: timeout"])
    assert (d.action, d.verdict) == ("revert", "guard_failed")
    assert "tileir: incorrect" in d.reason and "ptx: timeout" in d.reason


# ----------------------------------------------------------------------------- decide(): measurements


def test_regression_on_one_shape_reverts_although_the_mean_improves():
    shapes = shapes_for([1.10, 1.10, 1 / 1.05])
    sp, lo, _ = combine(shapes, POLICY)
    assert lo > 1.03  # on the mean alone this would be a keep
    d = decide(POLICY, shapes=shapes)
    assert (d.action, d.verdict) == ("revert", "regression")
    assert "3072" in d.reason  # names the slow shape
    assert len(d.shapes) == 3 and d.speedup == pytest.approx(sp)


def test_regression_names_the_worst_shape():
    d = decide(POLICY, shapes=shapes_for([1 / 1.05, 1.3, 1 / 1.2]))
    assert d.verdict == "regression"
    assert "3072" in d.reason and "1024" not in d.reason


def test_slowdown_below_the_regression_threshold_does_not_revert():
    # 1.5% slower on one shape, measured tightly: inside the allowed 2%
    shapes = shapes_for([1.10, 1.10, 1 / 1.015])
    assert shapes[2].hi < 1.0  # it is a real slowdown...
    d = decide(POLICY, shapes=shapes)
    assert d.verdict != "regression"  # ...but not a regression
    assert (d.action, d.verdict) == ("keep", "improved")


def test_slowdown_inside_the_noise_does_not_count_as_regression():
    # 5% slower point estimate, but its interval reaches past 0.98
    shapes = [fixed(1.2, shape=(1,)), fixed(1.2, shape=(2,)), fixed(0.95, half=0.06, shape=(3,))]
    assert shapes[2].hi > 1 - POLICY.regression
    d = decide(POLICY, shapes=shapes)
    assert d.verdict != "regression"
    # and the same point estimate with a tight interval is one
    shapes[2] = fixed(0.95, half=0.01, shape=(3,))
    assert decide(POLICY, shapes=shapes).verdict == "regression"


def test_regression_threshold_comes_from_the_policy():
    shapes = shapes_for([1.10, 1.10, 1 / 1.05])
    assert decide(Policy(regression=0.10), shapes=shapes).action == "keep"


def test_suspicious_speedup_is_measured_again():
    shapes = shapes_for([4.0, 4.0, 4.0])
    d = decide(POLICY, shapes=shapes)
    assert (d.action, d.verdict) == ("remeasure", "suspicious")
    assert d.speedup == pytest.approx(4.0, rel=0.01)


def test_one_suspicious_shape_is_named_where_the_combined_speedup_is_under_the_limit():
    d = decide(POLICY, shapes=shapes_for([1.5, 2.0, 4.0]))
    assert (d.action, d.verdict) == ("remeasure", "suspicious") and d.speedup < POLICY.suspicious
    assert d.reason.startswith("4.00x at shape ") and f"exceeds {POLICY.suspicious}x" in d.reason


def test_suspicious_speedup_counts_after_remeasuring():
    d = decide(POLICY, shapes=shapes_for([4.0, 4.0, 4.0]), remeasured=True)
    assert (d.action, d.verdict, d.priority, d.stop_after) == ("keep", "improved", "normal", False)


def test_speedup_just_under_the_suspicious_limit_is_kept_at_once():
    d = decide(POLICY, shapes=shapes_for([2.9, 2.9, 2.9]))
    assert (d.action, d.verdict) == ("keep", "improved")


def test_within_noise_reverts_a_tiny_speedup():
    d = decide(POLICY, shapes=shapes_for([1.003, 1.003, 1.003]))
    assert d.lo <= 1.0 < d.speedup
    assert (d.action, d.verdict) == ("revert", "within_noise")


def test_within_noise_reverts_a_real_looking_gain_drowned_in_noise():
    # 6% point estimate, but 30% per-sample noise: the interval does not clear 1
    shapes = [fixed(1.06, half=0.2, shape=(i,)) for i in range(3)]
    d = decide(POLICY, shapes=shapes)
    assert (d.action, d.verdict) == ("revert", "within_noise")
    # the same effect measured tightly is a keep
    assert decide(POLICY, shapes=[fixed(1.06, shape=(i,)) for i in range(3)]).action == "keep"


def test_a_single_sample_can_never_be_kept():
    d = decide(POLICY, shapes=[compare_shape((1,), [1.5], [1.0], POLICY)])
    assert d.action == "revert" and d.verdict == "within_noise"


def test_keep_improved_at_ten_percent():
    d = decide(POLICY, shapes=shapes_for([1.10, 1.10, 1.10]))
    assert (d.action, d.verdict, d.priority, d.stop_after) == ("keep", "improved", "normal", False)
    assert d.speedup == pytest.approx(1.10, rel=0.005)
    assert 1.0 < d.lo < d.speedup < d.hi
    assert [row["shape"] for row in d.shapes] == [[1024], [2048], [3072]]


def test_keep_low_gain_between_two_and_five_percent():
    d = decide(POLICY, shapes=shapes_for([1.03, 1.03, 1.03]))
    assert (d.action, d.verdict, d.priority, d.stop_after) == ("keep", "low_gain", "low", False)


def test_keep_marginal_below_two_percent_and_stop():
    d = decide(POLICY, shapes=shapes_for([1.015, 1.015, 1.015]))
    assert d.lo > 1.0
    assert (d.action, d.verdict, d.priority, d.stop_after) == ("keep", "marginal", "low", True)


@pytest.mark.parametrize("speedup, verdict", [(1.049, "low_gain"), (1.051, "improved"), (1.019, "marginal"),
                                              (1.021, "low_gain")])
def test_keep_thresholds(speedup, verdict):
    shapes = [fixed(speedup, half=0.001, shape=(i,)) for i in range(3)]
    assert decide(POLICY, shapes=shapes).verdict == verdict


def test_decision_round_trips_to_json():
    d = decide(POLICY, shapes=shapes_for([1.1]))
    j = d.to_json()
    assert j["action"] == "keep" and j["shapes"][0]["shape"] == [1024]
    assert Decision(**j) == d


# ----------------------------------------------------------------------------- stop_state()


def progress(outcomes=(), *, iterations=None, elapsed_s=0.0, last_verdict=None, crash_causes=(), exhausted=False):
    return Progress(iterations=len(outcomes) if iterations is None else iterations, elapsed_s=elapsed_s,
                    outcomes=tuple(outcomes), last_verdict=last_verdict, crash_causes=tuple(crash_causes),
                    playbook_exhausted=exhausted)


def test_continue_at_the_start():
    s = stop_state(POLICY, progress())
    assert (s.state, s.reason) == ("continue", "")


def test_escalate_after_two_crashes_in_a_row():
    s = stop_state(POLICY, progress(["keep", "crash", "crash"], last_verdict="oom",
                                    crash_causes=["compile_error", "timeout", "oom"]))
    assert s.state == "escalate"
    assert "timeout, oom" in s.reason and "compile_error" not in s.reason


def test_escalate_takes_precedence_over_every_stop_rule():
    s = stop_state(POLICY, progress(["crash", "crash"], iterations=99, elapsed_s=1e9, crash_causes=["oom", "oom"],
                                    exhausted=True))
    assert s.state == "escalate"


def test_one_crash_continues():
    assert stop_state(POLICY, progress(["keep", "crash"], crash_causes=["oom"])).state == "continue"


def test_crashes_not_in_a_row_stop_without_escalating():
    s = stop_state(POLICY, progress(["crash", "keep", "crash"], crash_causes=["oom", "oom"]))
    assert s.state == "continue"
    s = stop_state(POLICY, progress(["crash", "revert", "crash"], crash_causes=["oom", "oom"]))
    assert s.state == "stop" and "no improvement" in s.reason


def test_marginal_keep_stops():
    s = stop_state(POLICY, progress(["keep"], last_verdict="marginal"))
    assert s.state == "stop" and "2%" in s.reason
    assert stop_state(POLICY, progress(["keep"], last_verdict="low_gain")).state == "continue"


def test_two_non_improvements_in_a_row_stop():
    s = stop_state(POLICY, progress(["keep", "revert", "revert"], last_verdict="within_noise"))
    assert s.state == "stop" and "2 consecutive" in s.reason
    s = stop_state(POLICY, progress(["keep", "revert", "crash"], last_verdict="oom", crash_causes=["oom"]))
    assert s.state == "stop"


def test_non_improvements_separated_by_a_keep_continue():
    assert stop_state(POLICY, progress(["revert", "keep", "revert"])).state == "continue"
    assert stop_state(POLICY, progress(["revert"])).state == "continue"


def test_max_iters_stops():
    outcomes = ["keep"] * 25
    s = stop_state(POLICY, progress(outcomes, last_verdict="improved"))
    assert s.state == "stop" and "25 iterations" in s.reason
    assert stop_state(POLICY, progress(outcomes[:24], last_verdict="improved")).state == "continue"
    assert stop_state(Policy(max_iters=3), progress(["keep"] * 3)).state == "stop"


def test_time_budget_stops():
    policy = Policy(time_budget_s=100.0)
    s = stop_state(policy, progress(["keep"], elapsed_s=100.0))
    assert s.state == "stop" and "100s" in s.reason
    assert stop_state(policy, progress(["keep"], elapsed_s=99.9)).state == "continue"
    assert stop_state(POLICY, progress(["keep"], elapsed_s=1e9)).state == "continue"  # no budget set


def test_exhausted_playbook_stops():
    s = stop_state(POLICY, progress(["keep"], exhausted=True))
    assert s.state == "stop" and "playbook" in s.reason


# ----------------------------------------------------------------------------- statistical properties


def trial_shapes(rng: random.Random, factors, spread: float, outlier_p: float) -> list[ShapeComparison]:
    out = []
    for i, f in enumerate(factors):
        base = rng.uniform(0.01, 5.0)
        inc, cand = interleaved(rng, factor=f, n=30, spread=spread, base=base, outlier_p=outlier_p, outlier=1.2,
                                drift=0.01)
        out.append(compare_shape((i,), inc, cand, POLICY))
    return out


def test_a_a_false_keep_rate_is_at_most_one_percent():
    """Incumbent and candidate from the SAME distribution: a keep is a false positive."""
    rng = random.Random(20240601)
    keeps, verdicts = 0, {}
    for _ in range(1000):
        spread = rng.uniform(0.02, 0.05)
        d = decide(POLICY, shapes=trial_shapes(rng, (1.0, 1.0, 1.0), spread, outlier_p=0.05))
        keeps += d.action == "keep"
        verdicts[d.verdict] = verdicts.get(d.verdict, 0) + 1
    assert keeps <= 10, verdicts
    assert verdicts.get("within_noise", 0) >= 980, verdicts  # the ordinary outcome of an A/A trial


def test_planted_ten_percent_speedup_is_kept():
    rng = random.Random(7)
    kept = sum(decide(POLICY, shapes=trial_shapes(rng, (1.10, 1.10, 1.10), 0.02, outlier_p=0.02)).action == "keep"
               for _ in range(200))
    assert kept >= 190


def test_planted_five_percent_slowdown_on_one_shape_is_reverted():
    rng = random.Random(11)
    decisions = [decide(POLICY, shapes=trial_shapes(rng, (1.0, 1.0, 1 / 1.05), 0.02, outlier_p=0.0))
                 for _ in range(200)]
    assert all(d.action == "revert" for d in decisions), [d.verdict for d in decisions if d.action != "revert"]


def test_planted_slowdown_is_caught_by_the_regression_rule_when_other_shapes_improve():
    """The mean improves by ~5%, so only the per-shape regression rule can revert it."""
    rng = random.Random(13)
    decisions = [decide(POLICY, shapes=trial_shapes(rng, (1.10, 1.10, 1 / 1.05), 0.02, outlier_p=0.0))
                 for _ in range(200)]
    regressions = sum(d.action == "revert" and d.verdict == "regression" for d in decisions)
    # power of a 2%-wide test against a 5% slowdown at 2% noise and 30 samples is ~96%
    assert regressions >= 180


def test_an_interruption_is_not_a_crash_for_the_stop_rules():
    """A kill right after a genuine crash must not escalate on resume: the interrupted iteration counts
    as an iteration, but neither as a crash nor as a non-improvement."""
    from types import SimpleNamespace

    from loop.run.core import Run

    state = SimpleNamespace(last_iteration=3, active_s=10.0, outcomes=["keep", "crash", "crash"],
                            verdicts=["improved", "compile_error", "interrupted"], crash_causes=["compile_error", "interrupted"])
    p = Run.progress(SimpleNamespace(state=state, timing_mode="gpu"))
    assert p.iterations == 3 and p.outcomes == ("keep", "crash") and p.crash_causes == ("compile_error",)
    assert p.last_verdict == "compile_error"
    policy = Policy(max_iters=25, early_stop=False)
    assert stop_state(policy, p).state == "continue"
    # a second genuine crash still escalates
    state.outcomes.append("crash"), state.verdicts.append("runtime_error"), state.crash_causes.append("runtime_error")
    assert stop_state(policy, Run.progress(SimpleNamespace(state=state, timing_mode="gpu"))).state == "escalate"
