"""tileloop decision-check: the plant (its source, its size search), the per-trial decisions as the
loop takes them and their summary (pure), the checks of --dtype and the entry point, the job each
trial gives the judge (an iteration's), the whole check over a stand-in judge (calibration, trials,
second measurements, a crash), and one end-to-end run through the real judge on vector_add under
the Triton interpreter (A/A not kept, a planted doubling detected both ways)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import re
import shutil
import signal
import types
from pathlib import Path

import pytest

from cli_schema import problems, schemas
from loop import decide
from loop.cli import main
from loop.common import settings as settings_mod
from loop.common.errors import UserError
from loop.common.jobs import MAX_PROBES
from loop.decide import Outcome
from loop.decide.check import judged_decision, next_size, summarize, trial_rows, wants_again, wilson
from loop.measure import evaluate
from loop.target.change import describe
from loop.target.contract import load_kernel
from loop.tools import campaign, decision_check
from loop.tools.decision_check import Judged, parse_shape
from loop.tools.plant import planted_source
from tests.conftest import materialise

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
POLICY = decide.Policy()


# ----------------------------------------------------------------------------- plant size search


def search(effect_of, frac: float, rate: float, max_elems: int = 1 << 29) -> list[tuple[int, float]]:
    """The calibration loop, over a synthetic cost model instead of measurements."""
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


# ----------------------------------------------------------------------------- the plant's source

TOY = "import torch\n\n\ndef run(x, out):\n    out.copy_(x * 2)\n    return out\n"


def load(source: str) -> types.ModuleType:
    module = types.ModuleType("planted_toy")
    exec(compile(source, "planted_toy.py", "exec"), module.__dict__)  # noqa: S102 - the test's own source
    return module


def scratch_of(planted) -> dict:
    """The plant's buffers by size, from the planted entry function's closure."""
    (scratch,) = [c.cell_contents for c in planted.__closure__ if isinstance(c.cell_contents, dict)]
    return scratch


def test_the_planted_source_returns_the_same_output_and_does_real_work_in_proportion_to_its_arguments():
    import torch

    module = load(planted_source(TOY, "run", 1 << 18, "cpu"))  # size 2^18: scratch bytes = the arguments' bytes
    x = torch.arange(1 << 16, dtype=torch.float32)
    out = module.run(x=x, out=torch.empty_like(x))
    assert torch.equal(out, x * 2)
    ((n, buf),) = scratch_of(module.run).items()
    assert n == 2 * (1 << 16) and buf.dtype == torch.float32 and buf.eq(-1).all()  # negated once per call
    module.run(x=x, out=torch.empty_like(x))
    assert buf.eq(1).all() and len(scratch_of(module.run)) == 1  # the same buffer for arguments of the same size
    small = load(planted_source(TOY, "run", 1, "cpu"))
    small.run(x=x, out=torch.empty_like(x))
    assert list(scratch_of(small.run)) == [1]  # the smallest plant: one extra launch on one element


def test_a_planted_change_is_measurable_and_exercised_as_the_loop_reads_it():
    from loop.target.change import describe
    from loop.target.coverage import unexercised

    src = (KERNELS / "vector_add" / "vector_add_triton.py").read_text()
    planted = planted_source(src, "run", 1000, "cuda")
    for before, after in ((src, planted), (planted, src)):
        change = describe(before, after)
        assert change.kinds and decide.measurability(change, "gpu").measurable
        assert decide.measurability(change, "interpreter").measurable
        assert unexercised(before, after, ["add_kernel"], ["run"]) == []


def test_the_plant_follows_the_entry_the_spec_names_and_refuses_an_adapter(tmp_path):
    op = tmp_path / "op"
    shutil.copytree(KERNELS / "vector_add", op, ignore=shutil.ignore_patterns("__pycache__"))
    kernel = load_kernel(op / "vector_add_triton.py", tmp_path)
    assert decision_check._plant_entry(kernel) == "run"
    spec = op / "spec.py"
    spec.write_text(spec.read_text() + "\n\ndef entry(target, x, y, out):\n    return target.run(x=x, y=y, out=out)\n")
    with pytest.raises(UserError, match="adapter"):
        decision_check._plant_entry(kernel)


# ----------------------------------------------------------------------------- decisions per trial


def timing_entry(shape, inc, cand):
    return {"shape": list(shape), "dtype": "float32", "method": "cuda_graph", "calls_per_sample": 1, "notes": [],
            "impls": {"incumbent": {"samples_ms": inc, "median_ms": sorted(inc)[len(inc) // 2]},
                      "candidate": {"samples_ms": cand, "median_ms": sorted(cand)[len(cand) // 2]}},
            "recheck": {"incumbent": {"ok": True}, "candidate": {"ok": True}}}


def ok(*entries) -> dict:
    return {"status": "ok", "message": "", "timing": {"shapes": list(entries)}, "shapes": [e["shape"] for e in entries],
            "unexercised": [], "unmeasurable": ""}


def failed(status, shapes, failed_impl="candidate") -> dict:
    return {"status": status, "message": "why", "failed_impl": failed_impl, "timing": None, "shapes": shapes,
            "unexercised": [], "unmeasurable": ""}


def samples(rng, factor, n=40, spread=0.003):
    inc = [math.exp(rng.gauss(0, spread)) for _ in range(n)]
    cand = [factor * math.exp(rng.gauss(0, spread)) for _ in range(n)]
    return inc, cand


def test_trial_rows_decide_each_shape_and_all_shapes_like_the_loop():
    rng = random.Random(1)
    slow = timing_entry((1024,), *samples(rng, 1.10))
    same = timing_entry((4096,), *samples(rng, 1.00))
    rows = trial_rows({"trial": 4, "scenario": "slowdown", "first": ok(slow, same)}, POLICY)
    by_shape = {json.dumps(r["shape"]): r for r in rows}
    assert by_shape["[1024]"]["verdict"] == "regression" and by_shape["[1024]"]["ratio"] == pytest.approx(1.10, rel=0.01)
    assert by_shape["[4096]"]["verdict"] == "within_noise"
    assert by_shape['"all"']["action"] == "revert" and by_shape['"all"']["verdict"] == "regression"
    assert all(r["trial"] == 4 and r["scenario"] == "slowdown" for r in rows)
    # the joint row is the loop's own decision on the judged measurement
    assert by_shape['"all"']["speedup"] == judged_decision(POLICY, Outcome.from_json(ok(slow, same))).speedup


def test_trial_rows_one_shape_has_no_joint_row_and_a_speedup_is_kept():
    rng = random.Random(2)
    rows = trial_rows({"trial": 0, "scenario": "speedup", "first": ok(timing_entry((8,), *samples(rng, 1 / 1.03)))}, POLICY)
    assert len(rows) == 1
    assert (rows[0]["action"], rows[0]["verdict"]) == ("keep", "low_gain")


def test_a_suspicious_speedup_is_decided_by_its_second_measurement_like_the_loop():
    rng = random.Random(4)
    first = ok(timing_entry((8,), *samples(rng, 1 / 3.5)), timing_entry((16,), *samples(rng, 1 / 2.0)))
    event = {"trial": 1, "scenario": "speedup", "first": first}
    alone = trial_rows(event, POLICY)  # no second measurement recorded: the decision is what it is
    assert [r["action"] for r in alone] == ["remeasure", "keep", "remeasure"] and not any(r["remeasured"] for r in alone)
    assert wants_again(alone)
    again = ok(timing_entry((8,), *samples(rng, 1 / 2.2)), timing_entry((16,), *samples(rng, 1 / 2.1)))
    rows = trial_rows({**event, "again": again}, POLICY)
    by_shape = {json.dumps(r["shape"]): r for r in rows}
    # the shapes the loop would have measured again are decided on the second measurement
    assert by_shape["[8]"]["remeasured"] and by_shape["[8]"]["ratio"] == pytest.approx(1 / 2.2, rel=0.01)
    assert by_shape['"all"']["remeasured"] and by_shape['"all"']["action"] == "keep"
    # a decision that was final the first time stays the first measurement's
    assert not by_shape["[16]"]["remeasured"] and by_shape["[16]"]["ratio"] == pytest.approx(1 / 2.0, rel=0.01)
    assert {r["action"] for r in rows} == {"keep"} and not wants_again(rows)


@pytest.mark.parametrize("status, failed_impl, action, verdict", [
    ("incorrect", "candidate", "revert", "incorrect"),  # an output of the timed run wrong: the judge says so
    ("uncorroborated", "candidate", "revert", "uncorroborated"),  # the judge's clock refused the candidate's timing
    ("uncorroborated", "incumbent", "unmeasured", "void"),  # the incumbent's: nothing charged to the candidate
    ("runtime_error", "candidate", "crash", "runtime_error"),
    ("fallback", None, "revert", "guard_failed"),  # the backend proof failed
])
def test_a_judged_failure_decides_every_row_as_the_loop_decides_it(status, failed_impl, action, verdict):
    rows = trial_rows({"trial": 0, "scenario": "aa", "first": failed(status, [[8], [16]], failed_impl)}, POLICY)
    assert [r["shape"] for r in rows] == [[8], [16], "all"]
    assert {(r["action"], r["verdict"]) for r in rows} == {(action, verdict)}
    assert all(r["ratio"] is None for r in rows)


def test_a_change_no_check_ran_is_unexercised_for_every_row():
    rng = random.Random(3)
    outcome = {**ok(timing_entry((8,), *samples(rng, 0.5))), "unexercised": ["helper"]}
    (r,) = trial_rows({"trial": 0, "scenario": "slowdown", "first": outcome}, POLICY)
    assert (r["action"], r["verdict"]) == ("revert", "unexercised")


def judge_raw(status="ok", factor=1.0, failed_impl=None, proof_ok=True, seed=1) -> dict:
    """A judge's result (`tileloop.worker/1`) of vector_add at two shapes, the candidate `factor` as slow."""
    rng = random.Random(seed)
    raw = {"status": status, "correctness": {"passed": True, "launched": {"candidate": ["add_kernel"]},
                                             "called": {"candidate": ["run"]}},
           "timing": {"dtype": "float16", "device": "cpu",
                      "shapes": [timing_entry(s, *samples(rng, factor)) for s in ((256,), (4096,))]},
           "proof": {"ok": proof_ok, "detail": "compiled for another backend"}}
    return raw if status == "ok" else {**raw, "failed_impl": failed_impl, "message": "why"}


VECTOR_ADD = (KERNELS / "vector_add" / "vector_add_triton.py").read_text()
HELPER = VECTOR_ADD + "\n\n@triton.jit\ndef helper(x):\n    return x + 1\n"


@pytest.mark.parametrize("sources, raw", [
    ((VECTOR_ADD, VECTOR_ADD), judge_raw()),
    ((VECTOR_ADD, planted_source(VECTOR_ADD, "run", 99, "cpu")), judge_raw(factor=1.10)),
    ((planted_source(VECTOR_ADD, "run", 99, "cpu"), VECTOR_ADD), judge_raw(factor=1 / 1.5)),
    ((VECTOR_ADD, VECTOR_ADD), judge_raw(factor=1 / 3.5)),  # suspicious: measured again
    ((VECTOR_ADD, VECTOR_ADD), judge_raw("uncorroborated", failed_impl="candidate")),
    ((VECTOR_ADD, VECTOR_ADD), judge_raw("uncorroborated", failed_impl="incumbent")),
    ((VECTOR_ADD, VECTOR_ADD), judge_raw("incorrect", failed_impl="candidate")),
    ((VECTOR_ADD, VECTOR_ADD), judge_raw("runtime_error", failed_impl="candidate")),
    ((VECTOR_ADD, VECTOR_ADD), judge_raw(proof_ok=False)),
    ((VECTOR_ADD, VECTOR_ADD.replace("NUM_WARPS = 1", "NUM_WARPS = 4")), judge_raw(factor=0.8)),  # not under the interpreter
    ((VECTOR_ADD, HELPER), judge_raw(factor=0.8)),  # a change no check ran
])
def test_a_trial_is_decided_as_an_iteration_decides_the_same_judged_measurement(tmp_path, sources, raw):
    """decision-check's decision of a judge's result is the one `iteration.judgement` takes of it (the
    target backend alone, no guard backends), first and second look."""
    from loop.run import iteration

    out = decision_check.outcome("interpreter", raw, tmp_path, *sources)
    results = {"interpreter": evaluate.to_backend_result("interpreter", raw, "candidate", tmp_path, tmp_path)}
    can = decide.measurability(describe(*sources), "interpreter")
    loop = types.SimpleNamespace(state=types.SimpleNamespace(target_backend="interpreter"), policy=POLICY)
    for remeasured in (False, True):
        theirs = iteration.judgement(loop, results, {"interpreter": raw}, sources, remeasured=remeasured,
                                   unmeasurable="" if can.measurable else can.reason)
        mine = judged_decision(POLICY, Outcome.from_json(out), remeasured)
        assert (mine.action, mine.verdict, mine.speedup) == (theirs.action, theirs.verdict, theirs.speedup)


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


def test_dtype_is_the_iterations_unless_asked_and_then_one_of_the_spec():
    kernel = load_kernel(KERNELS / "vector_add" / "vector_add_triton.py", KERNELS.parent)
    assert decision_check._bench_dtype(kernel, "cuda", None) is None  # the judge times the spec's first, as an iteration
    assert decision_check._bench_dtype(kernel, "cuda", "bfloat16") == "bfloat16"
    with pytest.raises(UserError, match="interpreter"):
        decision_check._bench_dtype(kernel, "cpu", "bfloat16")
    with pytest.raises(UserError, match="DTYPES"):
        decision_check._bench_dtype(kernel, "cuda", "float64")


def test_plant_scenarios_without_a_plant_are_refused(capsys):
    target = str(KERNELS / "vector_add" / "vector_add_triton.py")
    assert main(["decision-check", target, "--device", "cpu", "--scenarios", "aa,slowdown"]) == 2
    assert "--plant" in capsys.readouterr().err
    assert main(["decision-check", target, "--plant", "1.5"]) == 2  # argparse's refusal: the one error contract
    assert "--plant" in capsys.readouterr().err


def test_each_trial_is_the_judged_measurement_an_iteration_asks_for(tmp_path, monkeypatch):
    """The job decision-check writes is `loop.measure.evaluate.measure`'s for the target backend, key for
    key and value for value (but the seed, which is the trial's), and it goes to the judge."""
    from loop.measure.launch import worker_command

    asked = []
    monkeypatch.setattr(evaluate, "run_worker", lambda workdir, job, *a, **k: asked.append(job) or {"status": "timeout"})
    kernel = load_kernel(KERNELS / "vector_add" / "vector_add_triton.py", KERNELS.parent)
    impls = {"incumbent": tmp_path / "a.py", "candidate": tmp_path / "b.py"}
    evaluate.measure(root=tmp_path, workdir=tmp_path, spec_path=kernel.spec_abs, target_dir=kernel.target_abs.parent,
                     impls=impls, check=["candidate"], backend_names=["interpreter"],
                     availability={"interpreter": {"available": True}}, target_backend="interpreter", device="cpu", seed=5,
                     settings=settings_mod.load(), cache_root=tmp_path, timing=evaluate.CPU_TIMING, target=kernel.target_abs)
    (iteration,) = asked
    mine = Judged(kernel, "interpreter", "cpu", settings_mod.load(), tmp_path, None, None).job(impls, 5)
    assert {k: v for k, v in mine.items() if k != "seed"} == {k: v for k, v in iteration.items() if k != "seed"}
    assert "mode" not in mine and worker_command(settings_mod.load(), tmp_path, "w", mine)[2] == "loop.judge"
    asked_for = Judged(kernel, "interpreter", "cpu", settings_mod.load(), tmp_path, [(256,)], "float32").job(impls, 5)
    assert asked_for["bench_shapes"] == [[256]] and asked_for["bench_dtype"] == "float32"


# ----------------------------------------------------------------------------- the check over a stand-in judge


class StandInJudge:
    """`run_worker` for a judged measurement, from the two implementation files it is given: a planted
    file (its size read from its source) takes 1 + 0.002 + 2e-6 * size as long; `crash_at` makes that
    measurement a runtime error."""

    def __init__(self, crash_at: int | None = None, spread: float = 0.002):
        self.jobs, self.crash_at, self.rng, self.spread = [], crash_at, random.Random(11), spread

    @staticmethod
    def cost(path: str) -> float:
        m = re.search(r"_decision_check_plant\(entry, size=(\d+)", Path(path).read_text())
        return 1.0 + (0.002 + 2e-6 * int(m.group(1)) if m else 0.0)

    def __call__(self, workdir, job, backend, settings, cache_dir, timeout_s=None, name="", host=None):
        self.jobs.append(job)
        if len(self.jobs) == self.crash_at:
            return {"status": "runtime_error", "failed_impl": "candidate", "message": "illegal address", "log_tail": ""}
        cost = {i["label"]: self.cost(i["path"]) for i in job["impls"]}
        shapes = []
        for shape in job.get("bench_shapes") or [[256], [4096]]:
            impls = {}
            for label, c in cost.items():
                xs = [c * math.exp(self.rng.gauss(0, self.spread)) for _ in range(30)]
                impls[label] = {"samples_ms": xs, "median_ms": sorted(xs)[15]}
            shapes.append({"shape": shape, "dtype": "float16", "method": "interpreter_wallclock", "calls_per_sample": 1,
                           "notes": [], "impls": impls, "recheck": {k: {"ok": True} for k in impls}})
        return {"status": "ok", "correctness": {"passed": True, "launched": {"candidate": ["add_kernel"]},
                                                "called": {"candidate": ["run"]}},
                "timing": {"dtype": "float16", "device": "cpu", "shapes": shapes}, "proof": {"ok": True}}


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    judge = StandInJudge()
    monkeypatch.setattr(decision_check, "run_worker", judge)
    monkeypatch.setattr(decision_check.probing, "probe_environment", lambda root, settings: {"triton_version": "3.6.0"})
    monkeypatch.setattr(decision_check, "start_judge_host", lambda settings, folder: None)
    shutil.copytree(KERNELS / "vector_add", tmp_path / "vector_add", ignore=shutil.ignore_patterns("__pycache__"))
    return judge


def check(tmp_path, **kw) -> dict:
    args = dict(trials=3, plant=0.05, scenarios=None, shapes=None, device="cpu", target_backend=None, dtype=None, seed=1,
                settings=settings_mod.load(), workdir=tmp_path / "work", log=lambda _m: None)
    return decision_check.run(str(tmp_path / "vector_add" / "vector_add_triton.py"), **{**args, **kw})


def test_the_check_calibrates_the_plant_and_decides_every_trial_through_judged_measurements(tmp_path, stand_in):
    result = check(tmp_path)
    assert result["complete"] and result["measured_by"] == "judge" and result["trials_done"] == 3
    assert result["judged_measurements"] == len(stand_in.jobs)
    (cal_256, cal_4096) = result["calibration"]
    # 5% asked: 0.002 + 2e-6 * size = 0.05 at size 24000; one size for both shapes
    assert cal_256["elems"] == cal_4096["elems"] and abs(cal_256["elems"] - 24_000) < 0.15 * 24_000
    assert cal_256["ratio"] == pytest.approx(1 + 0.002 + 2e-6 * cal_256["elems"], abs=0.003)
    assert cal_256["probes"][0]["elems"] == 1 and cal_256["probes"][1]["elems"] == 1 << 28 and cal_256["refused"] == 0
    trials = stand_in.jobs[-9:]  # 3 trials x 3 scenarios, in a rotating order, each its own judged measurement
    assert all(j["check"] == ["candidate"] and "mode" not in j for j in trials)
    planted = {(StandInJudge.cost(j["impls"][0]["path"]) > 1, StandInJudge.cost(j["impls"][1]["path"]) > 1) for j in trials}
    assert planted == {(False, False), (False, True), (True, False)}  # aa, slowdown, speedup
    by = {s["scenario"]: s for s in result["summary"] if s["shape"] == "all"}
    assert by["aa"]["hits"] == 0 and by["slowdown"]["hits"] == 3 and by["speedup"]["hits"] == 3
    assert result["shapes"] == [[256], [4096]] and result["dtype"] == "float16"
    assert problems({"schema": "tileloop.cli/1", "command": "decision-check", **result}) == []


def test_a_speedup_over_the_suspicious_limit_is_measured_again_and_decided_on_that(tmp_path, stand_in):
    result = check(tmp_path, plant=0.5, scenarios=("speedup",), trials=2, policy=decide.Policy(suspicious=1.2))
    rows = result["per_trial"]
    assert len(rows) == 6 and all(r["remeasured"] for r in rows) and "remeasure" not in {r["action"] for r in rows}
    assert result["judged_measurements"] == len(stand_in.jobs)
    seeds = [j["seed"] for j in stand_in.jobs[-4:]]
    assert seeds[0] == seeds[1] and seeds[2] == seeds[3]  # measured again as an iteration does: the same inputs


def test_a_crash_ends_the_check_incomplete_with_the_trials_so_far(tmp_path, stand_in):
    stand_in.crash_at = 3
    result = check(tmp_path, plant=None, trials=5)
    assert not result["complete"] and result["failure"]["status"] == "runtime_error"
    assert result["trials_done"] == 2 and result["judged_measurements"] == 3
    assert [r["action"] for r in result["per_trial"] if r["trial"] == 2] == ["crash"] * 3  # the loop's decision, kept
    stand_in.crash_at, stand_in.jobs[:] = 1, []
    with pytest.raises(UserError, match="before any trial finished"):
        check(tmp_path, plant=0.05)  # the calibration's first measurement


def test_a_budget_stops_starting_trials_and_keeps_those_done(tmp_path, stand_in, monkeypatch):
    clock = iter(range(0, 10_000, 10))  # each look at the clock 10 s later
    monkeypatch.setattr(decision_check.time, "monotonic", lambda: next(clock))
    result = check(tmp_path, plant=None, trials=50, budget_s=25)
    assert not result["complete"] and result["failure"]["status"] == "budget" and "--budget" in result["failure"]["message"]
    assert 0 < result["trials_done"] < 50 and result["judged_measurements"] == result["trials_done"]
    assert "INCOMPLETE: budget" in decision_check.render(result)



def _judged_with(monkeypatch, stand_in, before_each):
    """The stand-in judge, with `before_each(n)` called before its n-th judged measurement (from 1)."""
    count = [0]

    def judge(*args, **kwargs):
        count[0] += 1
        before_each(count[0])
        return stand_in(*args, **kwargs)

    monkeypatch.setattr(decision_check, "run_worker", judge)


def test_no_round_starts_that_the_longest_so_far_would_end_past_the_budget(tmp_path, stand_in, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(decision_check.time, "monotonic", lambda: now[0])
    _judged_with(monkeypatch, stand_in, lambda n: now.__setitem__(0, now[0] + 10))  # each measurement 10 s
    result = check(tmp_path, plant=None, scenarios=("aa",), trials=50, budget_s=25)
    # rounds start at 0 and 10 s; the third would start at 20 s and end at 30 s, past the 25 s budget
    assert result["trials_done"] == 2 and result["judged_measurements"] == 2
    assert result["failure"]["status"] == "budget" and "the longest round so far took 10 s" in result["failure"]["message"]


def test_a_sigterm_ends_the_check_with_the_trials_done_kept(tmp_path, stand_in, monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    _judged_with(monkeypatch, stand_in, lambda n: os.kill(os.getpid(), signal.SIGTERM) if n == 3 else None)
    result = check(tmp_path, plant=None, scenarios=("aa",), trials=50)
    assert not result["complete"] and result["failure"]["status"] == "terminated"
    assert result["trials_done"] == 2 and len(result["per_trial"]) == 2 * len(result["shapes"]) + 2  # per shape and all
    assert "INCOMPLETE: terminated" in decision_check.render(result)
    assert signal.getsignal(signal.SIGTERM) is before  # the check's handler is gone with it


# ----------------------------------------------------------------------------- timing method, L2 shapes, honest candidates


def test_a_forced_method_goes_into_every_job_and_auto_leaves_the_judge_its_choice(tmp_path):
    kernel = load_kernel(KERNELS / "vector_add" / "vector_add_triton.py", KERNELS.parent)
    impls = {"incumbent": tmp_path / "a.py", "candidate": tmp_path / "b.py"}
    judged = lambda m: Judged(kernel, "ptx", "cuda", settings_mod.load(), tmp_path, None, None, method=m)  # noqa: E731
    assert "method" not in judged("auto").job(impls, 5)
    assert judged("graph").job(impls, 5)["method"] == "graph" and judged("eager").job(impls, 5)["method"] == "eager"
    with pytest.raises(UserError, match="--method"):
        decision_check.run(str(kernel.target_abs), trials=1, plant=None, scenarios=None, shapes=None, device="cpu",
                           target_backend=None, dtype=None, seed=0, settings=settings_mod.load(), workdir=tmp_path,
                           method="graphs")


def test_parse_multiples():
    assert decision_check.parse_multiples("0.25,1,4,10") == (0.25, 1.0, 4.0, 10.0)
    assert decision_check.parse_multiples("1,1,2") == (1.0, 2.0)
    for bad in ("", "a", "0", "-1,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            decision_check.parse_multiples(bad)


def test_l2_shapes_give_inputs_and_outputs_of_the_multiples_asked():
    l2 = 50 * 2**20
    # 1-D: three fp16 tensors (x, y, out): 6 bytes an element
    shapes = campaign.l2_shapes((0.25, 1, 10), l2, 1, None, [(4096, 6 * 4096), (8192, 6 * 8192)])
    assert [6 * n for (n,) in shapes] == pytest.approx([0.25 * l2, l2, 10 * l2], abs=6)
    # 2-D: the column count kept, rows sized; a weight over the columns is the fixed part
    cols, per_row, weight = 4096, 2 * 4096 * 2, 4096 * 2
    rows = campaign.l2_shapes((1, 4), l2, 2, cols, [(8, weight + 8 * per_row), (16, weight + 16 * per_row)])
    assert all(c == cols for _, c in rows)
    assert [weight + r * per_row for r, _ in rows] == pytest.approx([l2, 4 * l2], abs=per_row)
    with pytest.raises(UserError, match="1-D.*2-D"):
        campaign.l2_shapes((1,), l2, 3, 64, [(8, 8), (16, 16)])


@pytest.mark.slow  # a process of its own imports torch and the spec: about 5 s each
@pytest.mark.parametrize("op, rank", [("vector_add", 1), ("softmax", 2)])
def test_l2_sizing_runs_the_specs_make_inputs_for_its_bytes(op, rank):
    kernel = load_kernel(KERNELS / op / f"{op}_triton.py", KERNELS.parent)
    got = campaign.size_for_l2(kernel, (0.25, 1.0), "float16", "cpu", {})
    assert got["l2_bytes"] == campaign.CPU_L2_BYTES and "stand-in" in got["note"]
    tensors = 3 if op == "vector_add" else 2  # x, y, out / x, out: fp16
    for m, shape in zip((0.25, 1.0), got["shapes"]):
        assert len(shape) == rank
        assert tensors * 2 * math.prod(shape) == pytest.approx(m * got["l2_bytes"], rel=0.01)
    if rank == 2:
        assert {s[1] for s in got["shapes"]} == {2048 * 8}  # the spec's last benchmark shape's columns
    if rank == 1:
        gpu = campaign.size_for_l2(kernel, (1.0,), "float16", "cuda", {"l2_mb": 50.0})
        assert gpu["l2_bytes"] == 50 * 2**20 and "device" in gpu["note"] and 6 * gpu["shapes"][0][0] == pytest.approx(50 * 2**20, abs=6)


def outcome_of(status="ok", methods=("cuda_graph",), failed_impl=None, factor=1.0, message="") -> dict:
    if status != "ok":
        return {"status": status, "failed_impl": failed_impl, "message": message, "timing": None, "methods": list(methods),
                "shapes": [[1024]], "unexercised": [], "unmeasurable": ""}
    rng = random.Random(3)
    entry = timing_entry((1024,), *samples(rng, factor))
    return {**ok(entry), "methods": list(methods)}


def test_tally_counts_decisions_refusals_and_failures_per_scenario_and_method():
    events = [
        {"trial": 0, "scenario": "aa", "first": outcome_of()},
        {"trial": 1, "scenario": "aa", "first": outcome_of("uncorroborated", ("cuda_events_l2_flush",), "incumbent",
                                                           message="timing refused at [1024]: incumbent: did less work")},
        {"trial": 0, "scenario": "honest", "candidate": "k1", "first": outcome_of(factor=0.8)},
        {"trial": 1, "scenario": "honest", "candidate": "k2", "first": outcome_of(factor=1.3)},
        {"trial": 2, "scenario": "honest", "candidate": "k3", "first": outcome_of("uncorroborated", failed_impl="candidate")},
        {"trial": 3, "scenario": "honest", "candidate": "k4", "first": outcome_of("compile_error", (), "candidate")},
        {"trial": 4, "scenario": "honest", "candidate": "k5", "first": outcome_of("incorrect", failed_impl="candidate")},
        {"trial": 0, "scenario": "slowdown", "first": outcome_of("uncorroborated", failed_impl="candidate")},
    ]
    counts = campaign.tally(events, "graph", POLICY)
    honest = counts["by_scenario"]["honest"]["graph"]
    assert (honest["trials"], honest["kept"], honest["reverted"], honest["uncorroborated"]) == (4, 1, 1, 1)
    assert honest["refused"] == {"candidate": 1} and honest["failures"] == {"incorrect": 1}
    assert counts["by_scenario"]["honest"]["untimed"]["failures"] == {"compile_error": 1}
    aa = counts["by_scenario"]["aa"]
    assert aa["graph"]["trials"] == 1 and aa["graph"]["uncorroborated"] == 0
    assert aa["eager"]["refused"] == {"incumbent": 1} and aa["eager"]["method_not_forced"] == 1
    # the number the check is for: honest candidates and A/A pairs refused, the planted scenarios not counted
    assert counts["honest_refusals"] == {"judged": 7, "uncorroborated": 2}
    assert [(r["scenario"], r["candidate"], r["failed_impl"]) for r in counts["refusals"]] == [
        ("aa", None, "incumbent"), ("honest", "k3", "candidate"), ("slowdown", None, "candidate")]
    assert "did less work" in counts["refusals"][0]["message"]


def test_honest_candidates_are_the_playbooks_own_each_source_once():
    kernel = load_kernel(KERNELS / "softmax" / "softmax_triton.py", KERNELS.parent)
    plain = kernel.target_abs.read_text()
    cands = campaign.honest_candidates(kernel, plain, "ptx", {"capability": [9, 0]})
    keys = [k for k, _ in cands]
    sources = [s for _, s in cands]
    assert len(set(sources)) == len(sources) and plain not in sources
    assert any(k.startswith("triton-persistent") for k in keys) and any(k.startswith("fast-math") for k in keys)
    assert "launch-param:BLOCK=2048" in keys  # a value of a sweep, not only its first


def test_the_honest_scenario_judges_the_playbooks_candidates_in_turn_and_counts_a_crash(tmp_path, stand_in):
    result = check(tmp_path, plant=None, scenarios=("aa", "honest"), trials=4, method="eager")
    assert result["complete"] and result["method"] == "eager"
    assert all(j.get("method") == "eager" for j in stand_in.jobs)
    honest_jobs = [j for j in stand_in.jobs if Path(j["impls"][1]["path"]).read_text() != Path(j["impls"][0]["path"]).read_text()]
    assert len(honest_jobs) == 4
    keys = result["honest_candidates"]
    target = (tmp_path / "vector_add" / "vector_add_triton.py").read_text()
    sources = dict(campaign.honest_candidates(load_kernel(tmp_path / "vector_add" / "vector_add_triton.py", tmp_path),
                                                    target, "interpreter", {}))
    assert [Path(j["impls"][1]["path"]).read_text() for j in honest_jobs] == [sources[k] for k in keys[:4]]
    assert [r["candidate"] for r in result["per_trial"] if r["scenario"] == "honest"] == [keys[t] for t in range(4) for _ in range(3)]
    counts = result["counts"]
    assert counts["honest_refusals"] == {"judged": 8, "uncorroborated": 0}
    assert problems({"schema": "tileloop.cli/1", "command": "decision-check", **result}) == []
    # an honest candidate that crashes is counted as its failure; the check goes on
    stand_in.jobs[:], stand_in.crash_at = [], 2
    again = check(tmp_path, plant=None, scenarios=("honest",), trials=3)
    assert again["complete"] and again["trials_done"] == 3
    assert sum(sum(c["failures"].values()) for c in again["counts"]["by_scenario"]["honest"].values()) == 1


# ----------------------------------------------------------------------------- end to end (interpreter, the real judge)


# The tests that read cpu_check run in one xdist group (the slow tier's `--dist loadgroup`, .ci/run): the
# module fixture is then made once, by one worker, rather than once by each worker that draws one of them.
CPU_CHECK = pytest.mark.xdist_group("decision-check-cpu")


# vector_add's correctness shapes but the largest (65537 elements): every judged measurement checks the
# candidate at every shape and dtype under the interpreter, and that shape was ~4 s of each ~4.5 s check,
# about 20 of them per check here. What these tests measure (the plant, the decisions, the counts) is timed
# at the shapes the check is given, not at the correctness shapes.
SMALL_SHAPES = [(1,), (127,), (4097,)]


def small_vector_add(root: Path) -> Path:
    """A copy of kernels/vector_add at root/vector_add with SMALL_SHAPES as its correctness shapes; its target."""
    return materialise(root, "vector_add", "triton", (KERNELS / "vector_add" / "vector_add_triton.py").read_text(),
                       CORRECTNESS_SHAPES=SMALL_SHAPES)


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    """decision-check's routine scenarios on a copy of vector_add with SMALL_SHAPES, timed at 256 elements."""
    root = tmp_path_factory.mktemp("dc")
    small_vector_add(root)
    report = root / "report.md"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["decision-check", str(root / "vector_add" / "vector_add_triton.py"), "--device", "cpu",
                   "--trials", "4", "--plant", "1.0", "--shapes", "256", "--json", "--out", str(report)])
    return rc, json.loads(out.getvalue()), report


@pytest.mark.slow
@CPU_CHECK
def test_cpu_run_is_complete_labelled_and_judged(cpu_check):
    rc, payload, report = cpu_check
    assert rc == 0
    assert payload["schema"] == "tileloop.cli/1" and payload["command"] == "decision-check"
    assert payload["complete"] and payload["trials_done"] == 4
    assert payload["backend"] == "interpreter" and payload["timings"] == "interpreter"
    assert payload["shapes"] == [[256]] and payload["dtype"] == "float16"
    assert len(payload["per_trial"]) == 12  # 4 trials x 3 scenarios x 1 shape
    assert payload["measured_by"] == "judge" and payload["judged_measurements"] >= 12 + 1 + 3  # trials, probes, rounds
    assert payload["proof"] and payload["proof"]["ok"]
    assert "false_keep" in report.read_text() and "interpreter" in report.read_text() and "judged" in report.read_text()


@pytest.mark.slow
@CPU_CHECK
def test_cpu_aa_trials_are_not_kept(cpu_check):
    _, payload, _ = cpu_check
    aa = [r for r in payload["per_trial"] if r["scenario"] == "aa"]
    # on a quiet machine none is kept; a heavily shared CPU has shown about 1 false keep in 20 interpreter
    # trials, so one is tolerated here. A decision path that keeps identical code fails this.
    assert len(aa) == 4 and sum(r["action"] == "keep" for r in aa) <= 1
    assert "incorrect" not in {r["verdict"] for r in aa}
    summary = next(s for s in payload["summary"] if s["scenario"] == "aa")
    assert summary["metric"] == "false_keep" and summary["true_ratio"] == 1.0
    assert summary["hits"] == sum(r["action"] == "keep" for r in aa)


@pytest.mark.slow
@CPU_CHECK
def test_cpu_planted_doubling_is_measured_and_detected_both_ways(cpu_check):
    _, payload, _ = cpu_check
    (cal,) = payload["calibration"]
    assert cal["elems"] > 1 and len(cal["rounds"]) == 3 and cal["probes"][0]["elems"] == 1
    # asked 2.0; the interpreter on a shared 2-core machine measured as little as 1.17 once (the probes that
    # sized the plant and the rounds that measure it run minutes apart); a plant that does nothing measures ~1.0
    assert cal["ratio"] > 1.15
    slow = next(s for s in payload["summary"] if s["scenario"] == "slowdown")
    fast = next(s for s in payload["summary"] if s["scenario"] == "speedup")
    # a shared CPU can make a trial's interval very wide (then it is reverted within_noise), or the judge's
    # clock refuse a timing (uncorroborated, or void where the incumbent's was refused), as it would in an
    # iteration; a doubling is far outside the noise of most trials: two of four; a plant that did nothing
    # would score 0 here
    loaded = {"revert/within_noise", "revert/uncorroborated", "unmeasured/void"}
    assert slow["hits"] >= 2 and set(slow["decisions"]) <= {"revert/regression"} | loaded
    # a speedup measured over 3x is measured again, as an iteration does: no trial ends on `remeasure`
    assert fast["hits"] >= 2 and set(fast["decisions"]) <= {"keep/improved"} | loaded
    assert "remeasure" not in {r["action"] for r in payload["per_trial"]}
    assert slow["measured_ratio_median"] > 1.3 and fast["measured_ratio_median"] < 1 / 1.3
    assert slow["true_ratio"] == cal["ratio"] and fast["true_ratio"] == pytest.approx(1 / cal["ratio"])


@pytest.mark.slow
@CPU_CHECK
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
def test_cpu_honest_campaign_at_l2_multiples_is_judged_and_counted(tmp_path):
    """The honest scenario end to end through the real judge: the playbook's candidates and A/A pairs at
    a shape sized to the interpreter's stand-in L2, each refusal counted (none expected); vector_add with
    SMALL_SHAPES as its correctness shapes."""
    small_vector_add(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["decision-check", str(tmp_path / "vector_add" / "vector_add_triton.py"), "--device", "cpu",
                   "--trials", "2", "--scenarios", "aa,honest", "--l2-multiples", "0.25", "--method", "eager", "--json"])
    payload = json.loads(out.getvalue())
    assert rc == 0 and payload["complete"] and payload["method"] == "eager"
    assert payload["l2_sizing"]["shapes"] == [[10923]] and payload["shapes"] == [[10923]]
    counts = payload["counts"]
    assert set(counts["by_scenario"]) == {"aa", "honest"}
    assert counts["honest_refusals"]["judged"] == 4
    assert counts["honest_refusals"]["uncorroborated"] == len([r for r in counts["refusals"] if r["scenario"] in ("aa", "honest")])
    assert [r["candidate"] for r in payload["per_trial"] if r["scenario"] == "honest"] == payload["honest_candidates"][:2]
    assert problems(payload) == []
