"""Decision-check's verdicts, pure: each trial of a scenario (A/A, a planted slowdown, a planted
speedup, a candidate of the playbook's own recipes) is one judged measurement, decided exactly as an iteration decides its target backend's
(`judged_decision`: the judge's typed status first, then `loop.decide.comparisons` + `decide`), per
shape and, with more than one shape, over all shapes at once; then the rate of each scenario's
headline outcome with its Wilson interval. Also the plant's size search (`next_size`). The
measuring is `loop.tools.decision_check`'s.

A measurement reaches this module as an *outcome*:

    {"status": "ok" | "fallback" | "incorrect" | "uncorroborated" | a crash status,
     "message": why, when not ok, "failed_impl": the implementation a failure is charged to,
     "timing": the judge's timing result ({"shapes": [...]}) when ok, else None,
     "shapes": the shapes timed (the rows of a measurement that failed),
     "unexercised": the functions the change touched that no check ran, "unmeasurable": why the
     change cannot show in this timing mode ("" when it can)}
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Callable, Sequence

from loop.common.jobs import shape_text as _key
from loop.decide.rules import VOID, Decision, Outcome, Policy, comparisons, decide, judged_decision

SCENARIOS = ("aa", "slowdown", "speedup", "honest")
PLANTED = ("slowdown", "speedup")  # the scenarios that need a plant


def trial_rows(event: dict, policy: Policy) -> list[dict]:
    """The loop's decision for one trial: per shape, and over all shapes when there are several.

    As in an iteration, a `remeasure` (a speedup over `policy.suspicious`) is not the end: the trial
    was measured again (`again` in the event) and that second measurement decides the rows whose
    first decision was `remeasure`, with `remeasured=True`, the loop's own second look."""
    base = {"trial": event["trial"], "scenario": event["scenario"]}
    rows = _decided(event["first"], base, policy, remeasured=False)
    if event.get("again"):
        again = _decided(event["again"], base, policy, remeasured=True)
        rows = [second if first["action"] == "remeasure" else first for first, second in zip(rows, again)]
    return rows


def wants_again(rows: list[dict]) -> bool:
    """Whether the loop would measure this trial again before deciding it."""
    return any(r["action"] == "remeasure" for r in rows)


def _decided(event: dict, base: dict, policy: Policy, remeasured: bool) -> list[dict]:
    """The rows of one measurement of a trial (`event`: its outcome as decision-check kept it)."""
    outcome = Outcome.from_json(event)
    whole = judged_decision(policy, outcome, remeasured)
    timed = outcome.timing.shapes if outcome.timing is not None else ()
    if not timed or whole.verdict in ("guard_failed", "unexercised", "unmeasured", VOID):  # one decision for every row
        shapes = [list(s.shape) for s in timed] or list(event.get("shapes") or [])
        keys = shapes + (["all"] if len(shapes) != 1 else [])
        return [{**base, "shape": k, **_decision_fields(whole, remeasured)} for k in keys]
    comps = comparisons(outcome.timing, policy)
    rows = [{**base, "shape": list(c.shape), "method": s.method,
             **_decision_fields(decide(policy, shapes=[c], remeasured=remeasured), remeasured)}
            for c, s in zip(comps, timed)]
    if len(comps) > 1:
        rows.append({**base, "shape": "all", **_decision_fields(whole, remeasured)})
    return rows


def _decision_fields(d: Decision, remeasured: bool) -> dict:
    return {"action": d.action, "verdict": d.verdict, "speedup": d.speedup, "lo": d.lo, "hi": d.hi,
            "ratio": 1.0 / d.speedup if d.speedup else None, "remeasured": remeasured}


def metric(scenario: str, policy: Policy) -> tuple[str, str, Callable[[dict], bool]]:
    """(name, meaning, hit) of the headline rate of a scenario."""
    if scenario == "aa":
        return "false_keep", "kept although candidate and incumbent are the same source", lambda r: r["action"] == "keep"
    if scenario == "slowdown":
        return ("detected", f"reverted as a regression: the whole interval lies below {1 - policy.regression:g}x",
                lambda r: r["verdict"] == "regression")
    if scenario == "speedup":
        return ("detected", "kept: the interval's lower end clears 1 (improved, low_gain or marginal)",
                lambda r: r["action"] == "keep")
    if scenario == "honest":
        return ("refused", "refused uncorroborated although the candidate is one of the playbook's own recipes",
                lambda r: r["verdict"] == "uncorroborated")
    raise ValueError(f"unknown scenario {scenario!r}; valid: {', '.join(SCENARIOS)}")


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a rate (95% by default); well behaved at 0/n and n/n."""
    if n <= 0:
        return 0.0, 1.0
    p = hits / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def true_ratio(scenario: str, planted: float | None) -> float | None:
    """Candidate time over incumbent time that the scenario plants (1 for A/A by construction; none
    for honest candidates)."""
    if scenario == "aa":
        return 1.0
    if planted is None or scenario not in PLANTED:
        return None
    return planted if scenario == "slowdown" else 1.0 / planted


def summarize(rows: list[dict], scenarios: Sequence[str], planted: dict[str, float], policy: Policy) -> list[dict]:
    """One line per scenario and shape (`planted`: shape key -> measured planted/plain ratio)."""
    out = []
    keys = list(dict.fromkeys(_key(r["shape"]) for r in rows))
    for scenario in scenarios:
        name, means, hit = metric(scenario, policy)
        for key in keys:
            mine = [r for r in rows if r["scenario"] == scenario and _key(r["shape"]) == key]
            if not mine:
                continue
            hits = sum(1 for r in mine if hit(r))
            ratios = [r["ratio"] for r in mine if r["ratio"] is not None]
            if key == "all":
                per_shape = [true_ratio(scenario, planted.get(k)) for k in keys if k != "all"]
                truth = math.exp(statistics.fmean(math.log(t) for t in per_shape)) if all(per_shape) else None
            else:
                truth = true_ratio(scenario, planted.get(key))
            out.append({"scenario": scenario, "shape": mine[0]["shape"], "trials": len(mine),
                        "decisions": dict(sorted(Counter(f"{r['action']}/{r['verdict']}" for r in mine).items())),
                        "metric": name, "metric_means": means, "hits": hits, "rate": hits / len(mine),
                        "rate_ci95": list(wilson(hits, len(mine))),
                        "keep_rate": sum(r["action"] == "keep" for r in mine) / len(mine),
                        "regression_rate": sum(r["verdict"] == "regression" for r in mine) / len(mine),
                        "measured_ratio_median": statistics.median(ratios) if ratios else None,
                        "true_ratio": truth})
    return out


def next_size(probes: Sequence[tuple[int, float]], frac: float, max_elems: int, rate: float) -> int | None:
    """The next plant size to try so that the plant adds `frac` to the kernel's time (a size is the
    plant's knob, `loop.tools.decision_check.planted_source`: scratch elements per MiB of arguments).

    `probes` are (size, measured effect) pairs, effect = planted/plain - 1; `rate` is the effect of one
    unit of size as first estimated (the slope used while the sizes below the target do not give one).
    An extra op costs about a + b * size, so between a size below and a size above the target the next
    size interpolates (kept strictly inside that bracket); with sizes below only, it extrapolates with
    the measured slope (at most 64x at once) or the estimate. None: no size can do better (the
    smallest already overshoots, `max_elems` is reached, or the bracket is closed).
    """
    tried = {n for n, _ in probes}
    effect = dict(probes)
    above = [n for n, e in probes if e >= frac]
    n_hi = min(above) if above else None
    below = sorted((n, e) for n, e in probes if e < frac and (n_hi is None or n < n_hi))
    if not below:
        if n_hi is None or n_hi <= 1:
            return None
        n = max(1, n_hi // 16)
        return None if n in tried else n
    n_lo, e_lo = below[-1]
    if n_hi is None:
        if n_lo >= max_elems:
            return None
        slope, low, high = rate, 2 * n_lo, max_elems
        if len(below) >= 2 and below[-1][1] > below[-2][1]:
            (n_a, e_a), (n_b, e_b) = below[-2:]
            slope, low, high = (e_b - e_a) / (n_b - n_a), n_lo + max(1, n_lo // 4), 64 * n_lo
        guess = n_lo + (frac - e_lo) / slope if slope > 0 else 16 * n_lo
        n = int(round(min(max(guess, low), high, max_elems)))
    else:
        if n_hi - n_lo <= 1:
            return None
        guess = n_lo + (frac - e_lo) * (n_hi - n_lo) / (effect[n_hi] - e_lo)
        n = int(round(min(max(guess, n_lo + 1), n_hi - 1)))
        if n in tried:
            n = int(round(math.sqrt(n_lo * n_hi)))
    return None if n in tried else n
