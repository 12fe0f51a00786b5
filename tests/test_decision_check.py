"""tileloop decision-check: the plant size search, the per-trial decisions and their summary (pure),
the worker's choice of shapes and dtype, the CLI's refusals, and one end-to-end run on vector_add
under the Triton interpreter (A/A not kept, a planted doubling detected both ways)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli_schema import problems, schemas
from loop import decide
from loop.cli import main
from loop.decide.check import summarize, trial_rows, wilson
from loop.tools.decision_check import parse_shape, read_events
from loop.common.jobs import MAX_PROBES
from loop.worker.decision_job import BadInput, _bench_dtype, _shapes, next_size

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
POLICY = decide.Policy()


# ----------------------------------------------------------------------------- plant size search


def search(effect_of, frac: float, rate: float, max_elems: int = 1 << 29) -> list[tuple[int, float]]:
    """The calibration loop of the worker, over a synthetic cost model instead of measurements."""
    tol = max(0.15 * frac, 0.002)
    probes = [(1, effect_of(1))]
    while len(probes) < MAX_PROBES and min(abs(e - frac) for _, e in probes) > tol:
        n = next_size(probes, frac, max_elems, rate)
        if n is None:
            break
        probes.append((n, effect_of(n)))
    return probes


@pytest.mark.parametrize("rate_error", [0.1, 1.0, 8.0])
def test_search_reaches_the_target_on_an_affine_cost(rate_error):
    # one launch costs 0.2% of the kernel, each element 1e-8 of it: 3% needs 2.8e6 elements
    rng = random.Random(7)
    effect = lambda n: 0.002 + 1e-8 * n + rng.gauss(0.0, 0.0005)  # noqa: E731
    probes = search(effect, 0.03, rate=1e-8 * rate_error)
    best = min(probes, key=lambda p: abs(p[1] - 0.03))
    assert abs(best[1] - 0.03) <= 0.0045, probes
    assert 2.0e6 < best[0] < 3.6e6


def test_search_stops_at_the_floor_when_one_launch_overshoots():
    assert next_size([(1, 0.30)], 0.03, 1 << 29, rate=1e-8) is None


def test_search_stops_at_the_cap():
    assert next_size([(1, 0.001), (1 << 20, 0.01)], 0.5, 1 << 20, rate=1e-9) is None


def test_search_stays_inside_its_bracket_even_with_a_wild_estimate():
    n = next_size([(1, 0.0), (1000, 0.01), (100_000, 0.5)], 0.03, 1 << 29, rate=1.0)
    assert 1000 < n < 100_000
    assert next_size([(1, 0.0), (2, 0.5)], 0.03, 1 << 29, rate=1e-3) is None  # closed bracket


# ----------------------------------------------------------------------------- decisions per trial


def timing_entry(shape, inc, cand, ok=True):
    return {"shape": list(shape), "dtype": "float32", "method": "cuda_graph", "calls_per_sample": 1, "notes": [],
            "impls": {"incumbent": {"samples_ms": inc}, "candidate": {"samples_ms": cand}},
            "recheck": {"incumbent": {"ok": True}, "candidate": {"ok": ok, **({} if ok else {"reason": "3 NaN"})}}}


def samples(rng, factor, n=40, spread=0.003):
    inc = [math.exp(rng.gauss(0, spread)) for _ in range(n)]
    cand = [factor * math.exp(rng.gauss(0, spread)) for _ in range(n)]
    return inc, cand


def test_trial_rows_decide_each_shape_and_all_shapes_like_the_loop():
    rng = random.Random(1)
    slow = timing_entry((1024,), *samples(rng, 1.10))
    same = timing_entry((4096,), *samples(rng, 1.00))
    rows = trial_rows({"trial": 4, "scenario": "slowdown", "timing": {"shapes": [slow, same]}}, POLICY)
    by_shape = {json.dumps(r["shape"]): r for r in rows}
    assert by_shape["[1024]"]["verdict"] == "regression" and by_shape["[1024]"]["ratio"] == pytest.approx(1.10, rel=0.01)
    assert by_shape["[4096]"]["verdict"] == "within_noise"
    assert by_shape['"all"']["action"] == "revert" and by_shape['"all"']["verdict"] == "regression"
    assert all(r["trial"] == 4 and r["scenario"] == "slowdown" for r in rows)


def test_trial_rows_one_shape_has_no_joint_row_and_a_speedup_is_kept():
    rng = random.Random(2)
    rows = trial_rows({"trial": 0, "scenario": "speedup", "timing": {"shapes": [timing_entry((8,), *samples(rng, 1 / 1.03))]}},
                      POLICY)
    assert len(rows) == 1
    assert (rows[0]["action"], rows[0]["verdict"]) == ("keep", "low_gain")


def test_a_suspicious_speedup_is_decided_by_its_second_measurement_like_the_loop():
    rng = random.Random(4)
    first = {"shapes": [timing_entry((8,), *samples(rng, 1 / 3.5)), timing_entry((16,), *samples(rng, 1 / 2.0))]}
    event = {"trial": 1, "scenario": "speedup", "timing": first}
    alone = trial_rows(event, POLICY)  # no second measurement recorded: the decision is what it is
    assert [r["action"] for r in alone] == ["remeasure", "keep", "remeasure"] and not any(r["remeasured"] for r in alone)
    again = {"shapes": [timing_entry((8,), *samples(rng, 1 / 2.2)), timing_entry((16,), *samples(rng, 1 / 2.1))]}
    rows = trial_rows({**event, "remeasure": again}, POLICY)
    by_shape = {json.dumps(r["shape"]): r for r in rows}
    # the shapes the loop would have measured again are decided on the second measurement
    assert by_shape["[8]"]["remeasured"] and by_shape["[8]"]["ratio"] == pytest.approx(1 / 2.2, rel=0.01)
    assert by_shape['"all"']["remeasured"] and by_shape['"all"']["action"] == "keep"
    # a decision that was final the first time stays the first measurement's
    assert not by_shape["[16]"]["remeasured"] and by_shape["[16]"]["ratio"] == pytest.approx(1 / 2.0, rel=0.01)
    assert {r["action"] for r in rows} == {"keep"}


def test_the_worker_measures_again_exactly_when_the_loop_would():
    from loop.worker.decision_job import remeasure_wanted

    rng = random.Random(5)
    assert remeasure_wanted([timing_entry((8,), *samples(rng, 1.0)), timing_entry((16,), *samples(rng, 1 / 3.4))], POLICY.to_json())
    assert not remeasure_wanted([timing_entry((8,), *samples(rng, 1 / 2.8))], POLICY.to_json())
    assert not remeasure_wanted([timing_entry((8,), *samples(rng, 1 / 3.4), ok=False)], POLICY.to_json())  # incorrect: decided as such
    for factor in (1 / 3.4, 1 / 2.8, 1.0):  # the trigger agrees with decide() on a single shape
        entry = timing_entry((8,), *samples(rng, factor))
        (r,) = trial_rows({"trial": 0, "scenario": "speedup", "timing": {"shapes": [entry]}}, POLICY)
        assert (r["action"] == "remeasure") == remeasure_wanted([entry], POLICY.to_json())


def test_wrong_output_of_a_timed_run_reverts_every_row_as_incorrect():
    rng = random.Random(3)
    bad = timing_entry((8,), *samples(rng, 0.5), ok=False)
    good = timing_entry((16,), *samples(rng, 0.5))
    rows = trial_rows({"trial": 0, "scenario": "aa", "timing": {"shapes": [good, bad]}}, POLICY)
    assert {(r["action"], r["verdict"]) for r in rows} == {("revert", "incorrect")}
    assert len(rows) == 3


# ----------------------------------------------------------------------------- summary


def row(scenario, shape, action, verdict, ratio):
    return {"trial": 0, "scenario": scenario, "shape": shape, "action": action, "verdict": verdict,
            "speedup": 1 / ratio, "lo": None, "hi": None, "ratio": ratio}


def test_summary_rates_histogram_and_planted_truth():
    rows = ([row("aa", [8], "keep", "marginal", 0.99)] + [row("aa", [8], "revert", "within_noise", 1.0)] * 3
            + [row("slowdown", [8], "revert", "regression", 1.05)] * 2 + [row("slowdown", [8], "revert", "within_noise", 1.01)]
            + [row("speedup", [8], "keep", "low_gain", 0.96), row("speedup", [8], "revert", "within_noise", 0.99)])
    out = {s["scenario"]: s for s in summarize(rows, ["aa", "slowdown", "speedup"], {"8": 1.04}, POLICY)}
    assert out["aa"]["metric"] == "false_keep" and out["aa"]["hits"] == 1 and out["aa"]["rate"] == 0.25
    assert out["aa"]["decisions"] == {"keep/marginal": 1, "revert/within_noise": 3}
    assert out["aa"]["true_ratio"] == 1.0
    assert out["slowdown"]["rate"] == pytest.approx(2 / 3) and out["slowdown"]["true_ratio"] == 1.04
    assert out["slowdown"]["measured_ratio_median"] == 1.05
    assert out["speedup"]["rate"] == 0.5 and out["speedup"]["true_ratio"] == pytest.approx(1 / 1.04)


def test_summary_of_all_shapes_plants_the_geometric_mean():
    rows = [row("slowdown", [8], "revert", "regression", 1.02), row("slowdown", [16], "revert", "regression", 1.08),
            row("slowdown", "all", "revert", "regression", 1.05)]
    out = {json.dumps(s["shape"]): s for s in summarize(rows, ["slowdown"], {"8": 1.02, "16": 1.08}, POLICY)}
    assert out['"all"']["true_ratio"] == pytest.approx(math.sqrt(1.02 * 1.08))


def test_wilson_interval_matches_the_published_values():
    lo, hi = wilson(0, 100)
    assert lo == 0.0 and hi == pytest.approx(0.0370, abs=5e-4)  # 0 of 100: the rate is below 3.7% at 95%
    lo, hi = wilson(100, 100)
    assert lo == pytest.approx(0.9630, abs=5e-4) and hi == pytest.approx(1.0)
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=5e-4) and hi == pytest.approx(0.5962, abs=5e-4)


# ----------------------------------------------------------------------------- inputs


def test_parse_shape():
    assert parse_shape("4096x4096x4096") == (4096, 4096, 4096)
    assert parse_shape("1048576") == (1048576,)
    for bad in ("0", "ax1", "", "4096x-1"):
        with pytest.raises(Exception, match="shape"):
            parse_shape(bad)


SPEC = SimpleNamespace(benchmark_shapes=[(1 << 24,), (1 << 20,), (1 << 28,)], interpreter_shapes=[(8192,)],
                       correctness_shapes=[(1,), (127,)], dtypes=["bfloat16", "float16"])  # as loop.common.spec.Spec reads it


def test_default_shapes_are_the_smallest_and_largest_an_iteration_times():
    assert _shapes(SPEC, {"device": "cuda"}) == [(1 << 20,), (1 << 28,)]
    assert _shapes(SPEC, {"device": "cpu"}) == [(8192,)]
    assert _shapes(SPEC, {"device": "cpu", "shapes": [[1024], [2048]]}) == [(1024,), (2048,)]
    with pytest.raises(BadInput, match="2 dimension"):
        _shapes(SPEC, {"device": "cuda", "shapes": [[64, 64]]})


def test_dtype_is_the_iterations_unless_asked():
    assert _bench_dtype(SPEC, {"device": "cuda"}) == "bfloat16"
    assert _bench_dtype(SPEC, {"device": "cpu"}) == "float16"
    with pytest.raises(BadInput, match="interpreter"):
        _bench_dtype(SPEC, {"device": "cpu", "dtype": "bfloat16"})
    with pytest.raises(BadInput, match="DTYPES"):
        _bench_dtype(SPEC, {"device": "cuda", "dtype": "float64"})


def test_read_events_ignores_a_torn_last_line(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "start"}\n{"event": "trial", "trial": 0}\n{"event": "tri')
    assert [e["event"] for e in read_events(path)] == ["start", "trial"]


def test_plant_scenarios_without_a_plant_are_refused(capsys):
    target = str(KERNELS / "vector_add" / "vector_add_triton.py")
    assert main(["decision-check", target, "--device", "cpu", "--scenarios", "aa,slowdown"]) == 2
    assert "--plant" in capsys.readouterr().err
    assert main(["decision-check", target, "--plant", "1.5"]) == 2  # argparse's refusal: the one error contract
    assert "--plant" in capsys.readouterr().err


# ----------------------------------------------------------------------------- end to end (interpreter)


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    root = tmp_path_factory.mktemp("dc")
    shutil.copytree(KERNELS / "vector_add", root / "vector_add", ignore=shutil.ignore_patterns("__pycache__"))
    report = root / "report.md"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["decision-check", str(root / "vector_add" / "vector_add_triton.py"), "--device", "cpu",
                   "--trials", "5", "--plant", "1.0", "--shapes", "256", "--json", "--out", str(report)])
    return rc, json.loads(out.getvalue()), report


@pytest.mark.slow
def test_cpu_run_is_complete_and_labelled(cpu_check):
    rc, payload, report = cpu_check
    assert rc == 0
    assert payload["schema"] == "tileloop.cli/1" and payload["command"] == "decision-check"
    assert payload["complete"] and payload["trials_done"] == 5
    assert payload["backend"] == "interpreter" and payload["timings"] == "interpreter"
    assert payload["shapes"] == [[256]] and payload["dtype"] == "float16"
    assert len(payload["per_trial"]) == 15  # 5 trials x 3 scenarios x 1 shape
    assert "false_keep" in report.read_text() and "interpreter" in report.read_text()


@pytest.mark.slow
def test_cpu_aa_trials_are_not_kept(cpu_check):
    _, payload, _ = cpu_check
    aa = [r for r in payload["per_trial"] if r["scenario"] == "aa"]
    # on a quiet machine none is kept; a heavily shared CPU has shown about 1 false keep in 20 interpreter
    # trials, so one is tolerated here. A decision path that keeps identical code fails this.
    assert len(aa) == 5 and sum(r["action"] == "keep" for r in aa) <= 1
    assert {r["action"] for r in aa} <= {"keep", "revert"} and "incorrect" not in {r["verdict"] for r in aa}
    summary = next(s for s in payload["summary"] if s["scenario"] == "aa")
    assert summary["metric"] == "false_keep" and summary["true_ratio"] == 1.0
    assert summary["hits"] == sum(r["action"] == "keep" for r in aa)


@pytest.mark.slow
def test_cpu_planted_doubling_is_measured_and_detected_both_ways(cpu_check):
    _, payload, _ = cpu_check
    (cal,) = payload["calibration"]
    assert cal["elems"] > 1 and len(cal["rounds"]) == 3 and cal["probes"][0]["elems"] == 1
    # asked 2.0; the interpreter on a shared 2-core machine measured as little as 1.17 once (the probes that
    # sized the plant and the rounds that measure it run minutes apart); a plant that does nothing measures ~1.0
    assert cal["ratio"] > 1.15
    slow = next(s for s in payload["summary"] if s["scenario"] == "slowdown")
    fast = next(s for s in payload["summary"] if s["scenario"] == "speedup")
    # a shared CPU can make a trial's interval very wide (then it is reverted within_noise: seen in one of
    # three trials in CI's slow tier, two tests per core), but a doubling is far outside the noise of most
    # trials: two of five; a plant that did nothing would score 0 here (at most one A/A false keep in 20)
    assert slow["hits"] >= 2 and set(slow["decisions"]) <= {"revert/regression", "revert/within_noise"}
    # a speedup measured over 3x is measured again, as an iteration does: no trial ends on `remeasure`
    assert fast["hits"] >= 2 and set(fast["decisions"]) <= {"keep/improved", "revert/within_noise"}
    assert "remeasure" not in {r["action"] for r in payload["per_trial"]}
    assert slow["measured_ratio_median"] > 1.3 and fast["measured_ratio_median"] < 1 / 1.3
    assert slow["true_ratio"] == cal["ratio"] and fast["true_ratio"] == pytest.approx(1 / cal["ratio"])


@pytest.mark.slow
def test_every_json_field_is_documented(cpu_check):
    """The output fits its schema, and every field of it and of its rows is declared there (docs/json.md is
    generated from the schemas)."""
    _, payload, _ = cpu_check
    assert problems(payload) == []
    declared = schemas()["decision-check.json"]["properties"]
    for part in ("summary", "calibration", "per_trial"):
        missing = set(payload[part][0]) - set(declared[part]["items"]["properties"])
        assert not missing, (part, missing)


@pytest.mark.slow
def test_cpu_speedups_over_the_suspicious_limit_are_measured_again_and_decided_on_that(tmp_path):
    """With the limit lowered under the planted doubling, every speedup trial takes the loop's second look."""
    from loop.tools import decision_check
    from loop.common import settings as settings_mod

    shutil.copytree(KERNELS / "vector_add", tmp_path / "vector_add", ignore=shutil.ignore_patterns("__pycache__"))
    policy = decide.Policy(suspicious=1.2)
    result = decision_check.run(str(tmp_path / "vector_add" / "vector_add_triton.py"), trials=2, plant=1.0,
                                scenarios=("speedup",), shapes=[(256,)], device="cpu", target_backend=None, dtype=None,
                                seed=7, settings=settings_mod.load(), workdir=tmp_path / "work", log=lambda _m: None,
                                policy=policy)
    assert result["complete"] and result["policy"]["suspicious"] == 1.2
    events = [ev for ev in read_events(tmp_path / "work" / "decision-check.events.jsonl") if ev.get("event") == "trial"]
    assert len(events) == 2 and all(ev["remeasure"] and len(ev["remeasure"]["shapes"]) == 1 for ev in events)
    # the second measurement is its own (fresh inputs, new samples), and it is the one decided
    for ev in events:
        first, again = ev["timing"]["shapes"][0], ev["remeasure"]["shapes"][0]
        assert first["impls"]["candidate"]["samples_ms"] != again["impls"]["candidate"]["samples_ms"]
    rows = result["per_trial"]
    assert len(rows) == 2 and all(r["remeasured"] for r in rows)
    assert "remeasure" not in {r["action"] for r in rows}
