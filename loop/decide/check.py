"""Decision-check's verdicts, pure: each trial of a scenario (A/A, a planted slowdown, a planted
speedup) decided exactly as an iteration is decided (`loop.decide.comparisons` + `decide`), per
shape and, with more than one shape, over all shapes at once; then the rate of each scenario's
headline outcome with its Wilson interval. The measuring is `loop.tools.decision_check`'s."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Callable, Sequence

from loop.common.jobs import shape_text as _key
from loop.decide.rules import Decision, Policy, comparisons, decide

SCENARIOS = ("aa", "slowdown", "speedup")


def trial_rows(event: dict, policy: Policy) -> list[dict]:
    """The loop's decision for one trial: per shape, and over all shapes when there are several.

    As in an iteration, a `remeasure` (a speedup over `policy.suspicious`) is not the end: the
    worker measured the trial again (`remeasure` in the event) and that second measurement is
    decided with `remeasured=True`, the loop's own second look."""
    base = {"trial": event["trial"], "scenario": event["scenario"]}
    rows = _decided(event["timing"], base, policy, remeasured=False)
    if event.get("remeasure"):
        again = _decided(event["remeasure"], base, policy, remeasured=True)
        rows = [second if first["action"] == "remeasure" else first for first, second in zip(rows, again)]
    return rows


def _decided(timing: dict, base: dict, policy: Policy, remeasured: bool) -> list[dict]:
    shapes = timing["shapes"]
    keys = [s["shape"] for s in shapes] + (["all"] if len(shapes) > 1 else [])
    wrong = [(s["shape"], lab, rc) for s in shapes for lab, rc in s["recheck"].items() if not rc["ok"]]
    if wrong:  # the worker of an iteration reports this as `incorrect`; so does this check
        shape, lab, rc = wrong[0]
        d = decide(policy, failure="incorrect",
                          failure_message=f"{lab}: output written by the timed run is wrong at {shape}: {rc.get('reason')}")
        return [{**base, "shape": k, **_decision_fields(d, remeasured)} for k in keys]
    comps = comparisons({"timing": timing}, policy)
    rows = [{**base, "shape": list(c.shape), "method": s["method"],
             **_decision_fields(decide(policy, shapes=[c], remeasured=remeasured), remeasured)}
            for c, s in zip(comps, shapes)]
    if len(comps) > 1:
        rows.append({**base, "shape": "all",
                     **_decision_fields(decide(policy, shapes=comps, remeasured=remeasured), remeasured)})
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
    """Candidate time over incumbent time that the scenario plants (1 for A/A by construction)."""
    if scenario == "aa":
        return 1.0
    if planted is None:
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
