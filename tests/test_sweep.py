"""A sweep is one experiment: several values of one numeric variable timed in one judged measurement
beside the incumbent, every value's paired result recorded, the best measured again alone.

Fast: the pure choice (`loop.decide.sweep`), the values the recipes offer, the pruning of tried values,
the record and trailers, the sweep stage's loop over failing values and its untimed case (with the
measurement replaced), and a kill during the sweep stage. Slow: a real sweep under the interpreter.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import playbook
from conftest import git
from loop.decide import Policy
from loop.decide import sweep as sweeps
from loop.common.messages import Timing
from loop.common.settings import load as load_settings
from loop.records import gitops, history
from loop.records.perf_table import measurement_lines
from loop.records.results import BackendResult, Record, read_records
from loop.run import state as st
from loop.run import iteration, resume, suggest, unattended
from loop.run import sweep as sweeping
from loop.run.experiment import open_run
from loop.run.sweep import MAX_MEASUREMENTS
from playbook.analysis import analyze
from playbook.recipe import Sweep
from test_json_contract import RUN, TARGET, make_run

POLICY = Policy()
VECTOR_ADD = (Path(__file__).resolve().parent.parent / TARGET).read_text()


def raw_of(samples: dict[str, list[float]], shapes=((4096,),)) -> dict:
    """A judged measurement's timing result: the same samples at every shape."""
    return {"status": "ok", "timing": {"shapes": [{"shape": list(s), "impls": {lab: {"samples_ms": xs} for lab, xs in
                                                                               samples.items()}} for s in shapes]}}


def timing_of(samples: dict[str, list[float]], shapes=((4096,),)) -> Timing:
    """The same timing result, typed as the judge's boundary reads it."""
    return Timing.from_json(raw_of(samples, shapes)["timing"])


# ----------------------------------------------------------------------------------- the pure choice


def test_each_value_is_paired_with_the_incumbent_and_the_best_geomean_is_chosen():
    inc = [10.0, 10.2, 9.9, 10.1, 10.0, 10.3, 9.8, 10.0]
    raw = timing_of({"incumbent": inc, "sweep-512": [x / 1.5 for x in inc], "sweep-1024": [x / 2.0 for x in inc],
                     "sweep-2048": [x / 0.9 for x in inc]}, shapes=((4096,), (8192,)))
    results = [sweeps.value_result(v, f"k:{v}", f"sweep-{v}", raw, POLICY) for v in (512, 1024, 2048)]
    assert [round(r.speedup, 6) for r in results] == [1.5, 2.0, round(0.9, 6)]
    assert all(r.lo <= r.speedup <= r.hi and len(r.shapes) == 2 for r in results)
    assert sweeps.choose(results).value == 1024
    # a value that failed is never chosen, whatever it claimed; none timed: none chosen
    assert sweeps.choose([sweeps.failed(1024, "k:1024", "incorrect", "wrong"), results[0]]).value == 512
    assert sweeps.choose([sweeps.failed(1, "k:1", sweeps.NOT_TIMED, "launch settings")]) is None


def test_a_failed_measurement_is_charged_to_the_value_it_names():
    labels = ["sweep-512", "sweep-5120"]
    assert sweeps.charged("incorrect", "sweep-5120", "wrong at (7,)", labels) == "sweep-5120"
    assert sweeps.charged("uncorroborated", "sweep-512", "timing refused at [4096]: sweep-5120: claimed 1 ms",
                          labels) == "sweep-5120"  # the judge charges the first checked; the reason names the culprit
    assert sweeps.charged("runtime_error", "incumbent", "died", labels) is None
    assert sweeps.charged("timeout", None, "the judge timed out", labels) is None


# ----------------------------------------------------------------------------------- what recipes offer


def sweep_of(recipe: str, source: str, key: str) -> Sweep:
    cand = next(c for c in playbook.get(recipe).candidates(source, analyze(source)) if c.key == key)
    assert cand.sweep is not None and cand.sweep.values[0].source == cand.source  # the step's own value first
    return cand.sweep


def test_launch_param_sweeps_block_sizes_up_and_down_and_every_warp_count():
    source = VECTOR_ADD
    up = sweep_of("launch-param", source, "launch-param:BLOCK=256")
    assert [v.value for v in up.values] == [256, 512, 1024, 2048]
    assert (up.key, up.title) == ("launch-param:BLOCK=sweep(256,512,1024,2048)", "BLOCK sweep 128 -> {256,512,1024,2048}")
    assert [v.key for v in up.values] == [f"launch-param:BLOCK={v}" for v in (256, 512, 1024, 2048)]
    assert all(f"BLOCK = {v.value}\n" in v.source for v in up.values)
    assert up.named(1024) == "BLOCK 128 -> 1024 (swept 256, 512, 1024, 2048)"
    down = sweep_of("launch-param", source, "launch-param:BLOCK=64")  # a second thought: tier 1
    assert [v.value for v in down.values] == [64, 32]
    warps = sweep_of("launch-param", source, "launch-param:num_warps=2")
    assert [v.value for v in warps.values] == [2, 4, 8, 16]
    from4 = sweep_of("launch-param", source.replace("NUM_WARPS = 1", "NUM_WARPS = 4"), "launch-param:num_warps=8")
    assert [v.value for v in from4.values] == [8, 16, 2, 1]
    # the two-step moves carry no sweep: the sweeps above cover them
    assert all(c.sweep is None for c in playbook.get("launch-param").candidates(source, analyze(source)) if c.tier == 2)


CUTILE = '''import cuda.tile as ct

TILE = 256


@ct.kernel
def add_kernel(x, y, out, TILE: ct.Constant[int]):
    pid = ct.bid(0)
    a = ct.load(x, index=(pid,), shape=(TILE,))
    b = ct.load(y, index=(pid,), shape=(TILE,))
    ct.store(out, index=(pid,), tile=a + b)


def run(x, y, out):
    n = out.shape[0]
    ct.launch(None, (ct.cdiv(n, TILE), 1, 1), add_kernel, (x, y, out, TILE))
    return out
'''


def test_cutile_hint_sweeps_tiles_and_occupancy():
    tile = sweep_of("cutile-hint", CUTILE, "cutile-hint:TILE=512")
    assert tile.title == "TILE sweep 256 -> {512,1024,2048,4096}"
    assert all(f"TILE = {v.value}\n" in v.source for v in tile.values)
    occ = sweep_of("cutile-hint", CUTILE, "cutile-hint:add_kernel.occupancy=2")
    assert [v.value for v in occ.values] == [2, 4, 8, 16, 32, 1]  # from the compiler's choice: 1 last
    assert all(f"@ct.kernel(occupancy={v.value})" in v.source for v in occ.values)
    # a kept tile's value is the run's: never swept again
    assert "cutile-hint:TILE=1024" in playbook.get("cutile-hint").current_keys(tile.values[1].source)


def test_tried_values_leave_the_sweep_and_a_sweep_of_one_is_a_step():
    up = sweep_of("launch-param", VECTOR_ADD, "launch-param:BLOCK=256")
    rest = up.untried({"launch-param:BLOCK=512"})
    assert [v.value for v in rest.values] == [256, 1024, 2048] and rest.key == "launch-param:BLOCK=sweep(256,1024,2048)"
    assert up.untried({"launch-param:BLOCK=512", "launch-param:BLOCK=1024", "launch-param:BLOCK=2048"}) is None
    assert up.untried({up.key}) is None  # twice interrupted: the sweep counts as tried


# ----------------------------------------------------------------------------------- the record


def test_a_record_without_a_sweep_is_written_as_before_and_one_with_it_names_every_value():
    rec = Record(run="r", iteration=1, optimization="BLOCK 128 -> 1024 (swept 256, 1024, 2048)", status="keep",
                 correctness="PASS", latency_ms=1.0, target_backend="interpreter",
                 backends={"interpreter": BackendResult("interpreter", True, "ok", latency_ms=1.0)}, commit=None,
                 parent=None)
    assert "sweep" not in rec.to_json() and "Tileloop-Sweep" not in history.trailers_for(rec)
    values = [sweeps.value_result(v, f"k:{v}", f"sweep-{v}", timing_of({"incumbent": [2.0] * 5,
                                                                         f"sweep-{v}": [2.0 / s] * 5}), POLICY).to_json()
              for v, s in ((256, 1.25), (2048, 1.5))]
    values.insert(1, sweeps.failed(1024, "k:1024", "incorrect", "wrong at (127,)").to_json())
    swept = Record(**{**rec.__dict__, "sweep": {"variable": "BLOCK", "from": "128", "key": "k", "timed": True,
                                                  "measurements": 2, "chosen": 2048, "reason": "r", "values": values}})
    assert Record.from_json(json.loads(json.dumps(swept.to_json()))) == swept
    t = history.trailers_for(swept)
    assert (t["Tileloop-Sweep"], t["Tileloop-Sweep-Chosen"]) == ("256=1.2500x 1024=incorrect 2048=1.5000x", "2048")
    assert "Sweep: BLOCK from 128 over 256, 1024, 2048" in history.commit_message(swept)
    # perf_results.md says what a swept row's speedup is, only where there is one
    assert "swept rows" in "\n".join(measurement_lines([rec, swept], "interpreter"))
    assert "swept rows" not in "\n".join(measurement_lines([rec], "interpreter"))


# ----------------------------------------------------------------------------------- the stage, measurement replaced


class Fake:
    """Judged measurements of a sweep, in order: each a (status, failed_impl, message) or "ok"."""

    def __init__(self, outcomes):
        self.outcomes, self.asked = list(outcomes), []

    def __call__(self, n, attempt, incumbent, values):  # set on the class: called unbound
        self.asked.append([v.value for v in values])
        out = self.outcomes.pop(0)
        if out == "ok":
            samples = {"incumbent": [4.0] * 6, **{v.label: [4.0 / (1 + v.value / 1000)] * 6 for v in values}}
            return BackendResult("interpreter", True, "ok"), timing_of(samples), raw_of(samples)
        status, who, message = out
        return BackendResult("interpreter", True, status, message), None, {"status": status, "failed_impl": who,
                                                                           "message": message}


def stage(kernel_repo, monkeypatch, outcomes, key="launch-param:BLOCK=256"):
    make_run(kernel_repo)
    fake = Fake(outcomes)
    monkeypatch.setattr(sweeping, "measure_values", lambda run, *a: fake(*a))
    exp = open_run(RUN, load_settings(), log=lambda _: None)
    cand = next(c for c in playbook.get("launch-param").candidates(VECTOR_ADD, analyze(VECTOR_ADD)) if c.key == key)
    return exp, cand, fake


def test_a_value_that_fails_is_dropped_and_the_rest_measured_again(kernel_repo, monkeypatch):
    exp, cand, fake = stage(kernel_repo, monkeypatch, [("incorrect", "sweep-1024", "wrong at (127,)"), "ok"])
    summary, chosen = sweeping.sweep_stage(exp, 1, cand, cand.sweep, "h")
    assert fake.asked == [[256, 512, 1024, 2048], [256, 512, 2048]]
    assert chosen.value == 2048 and summary["chosen"] == 2048 and summary["measurements"] == 2
    by = {v["value"]: v for v in summary["values"]}
    assert (by[1024]["status"], by[1024]["reason"]) == ("incorrect", "wrong at (127,)")
    assert [by[v]["status"] for v in (256, 512, 2048)] == ["ok"] * 3 and by[2048]["speedup"] > by[256]["speedup"]
    # the tree was not touched: the sweep chose, the iteration applies
    assert (kernel_repo / TARGET).read_text() == VECTOR_ADD and st.load(kernel_repo, RUN).inflight.stage == "sweep"


def test_the_repeats_are_bounded_and_a_failure_of_no_value_stops_the_sweep(kernel_repo, monkeypatch):
    fails = [("incorrect", f"sweep-{v}", "wrong") for v in (256, 512, 1024)]
    exp, cand, fake = stage(kernel_repo, monkeypatch, fails)
    summary, chosen = sweeping.sweep_stage(exp, 1, cand, cand.sweep, "h")
    assert chosen is None and len(fake.asked) == MAX_MEASUREMENTS
    assert [v["status"] for v in summary["values"]] == ["incorrect"] * 3 + [sweeps.NOT_MEASURED]
    fake2 = Fake([("runtime_error", "incumbent", "the incumbent died")])
    monkeypatch.setattr(sweeping, "measure_values", lambda run, *a: fake2(*a))
    summary, chosen = sweeping.sweep_stage(exp, 1, cand, cand.sweep, "h")
    assert chosen is None and {v["status"] for v in summary["values"]} == {sweeps.NOT_MEASURED}


def test_an_experiments_wall_time_includes_its_sweep(kernel_repo, monkeypatch):
    """The record's start and wall time run from the sweep's start, not from the apply after it: on an H200
    a cuTile TILE sweep took 35 s and its record said 19 s (the re-measurement of the chosen value alone)."""
    import time

    exp, cand, fake = stage(kernel_repo, monkeypatch, ["ok"])
    monkeypatch.setattr(sweeping, "measure_values", lambda run, *a: (time.sleep(1.0), fake(*a))[1])
    before = time.monotonic()
    it = iteration.candidate(exp, cand)
    assert fake.asked and it.started and before <= it.clock < before + 0.5
    applied = iteration.apply(exp, it)
    assert (applied.clock, applied.started) == (it.clock, it.started) and time.monotonic() - applied.clock >= 1.0


def test_a_variable_the_interpreter_cannot_time_is_not_swept_and_goes_unmeasured(kernel_repo, monkeypatch):
    exp, cand, fake = stage(kernel_repo, monkeypatch, [], key="launch-param:num_warps=2")
    seen = {}
    monkeypatch.setattr(iteration, "evaluate", lambda run, it: seen.update(
        title=it.optimization, key=it.key, source=it.source, sweep=it.sweep))
    iteration.evaluate(exp, iteration.candidate(exp, cand))
    assert fake.asked == []  # nothing timed
    assert seen["title"] == "NUM_WARPS sweep 1 -> {2,4,8,16}" and seen["key"] == "launch-param:num_warps=sweep(2,4,8,16)"
    assert seen["sweep"]["chosen"] is None and not seen["sweep"]["timed"]
    assert {v["status"] for v in seen["sweep"]["values"]} == {sweeps.NOT_TIMED}
    assert "interpreter ignores launch settings" in seen["sweep"]["reason"]
    assert "NUM_WARPS = 2\n" in seen["source"]  # the step's own value is evaluated: the unmeasured rule reverts it


def test_a_kill_during_the_sweep_leaves_the_tree_at_the_best_and_counts_no_iteration(kernel_repo, monkeypatch):
    class Killed(BaseException):
        pass

    def killed(*_):
        raise Killed  # as a kill -9 in the judged measurement: state.json as it was on disk

    exp, cand, _ = stage(kernel_repo, monkeypatch, [])
    monkeypatch.setattr(sweeping, "measure_values", killed)
    best = st.load(kernel_repo, RUN).best_commit
    for attempt in (1, 2):
        with pytest.raises(Killed):
            iteration.candidate(open_run(RUN, load_settings(), log=lambda _: None), cand)
        state = st.load(kernel_repo, RUN)
        assert state.inflight.stage == "sweep" and state.inflight.key == cand.sweep.key
        assert gitops.head_sha(kernel_repo) == best and not git(kernel_repo, "status", "--porcelain", "--", TARGET).strip()
        resumed = open_run(RUN, load_settings(), log=lambda _: None)
        assert resume.repair(resumed) is None
        state = st.load(kernel_repo, RUN)
        assert state.inflight is None and state.last_iteration == 0 and len(read_records(resumed.results_path)) == 1
        # once cut off, the sweep is tried again; twice, it counts as tried (its values may still be stepped)
        assert (cand.sweep.key in state.interrupted, cand.sweep.key in state.tried) == (True, attempt == 2)
    assert cand.sweep.untried(state.tried) is None


# ----------------------------------------------------------------------------------- a real sweep (interpreter)

WRONG_AT_1024 = VECTOR_ADD.replace("    tl.store(out_ptr + offs, x + y, mask=mask)",
                                   "    if BLOCK == 1024:\n        y = y * 2\n    tl.store(out_ptr + offs, x + y, mask=mask)")
SMALL_SPEC_SHAPES = {"CORRECTNESS_SHAPES": "[(1,), (1000,)]", "INTERPRETER_SHAPES": "[(8192,)]",
                     "DTYPES": '["float32"]'}


@pytest.mark.slow
def test_a_sweep_under_the_interpreter_records_every_value_and_commits_the_best(kernel_repo, capsys):
    spec = kernel_repo / "kernels" / "vector_add" / "spec.py"
    text = spec.read_text()
    for name, value in SMALL_SPEC_SHAPES.items():
        text = "\n".join(f"{name} = {value}" if line.startswith(f"{name} =") else line for line in text.splitlines()) + "\n"
    spec.write_text(text)
    (kernel_repo / TARGET).write_text(WRONG_AT_1024)
    git(kernel_repo, "commit", "-qam", "a block size of 1024 computes the wrong sum")
    make_run(kernel_repo)
    from loop.cli import main
    code = main(["step", "--recipe", "launch-param", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    sweep = st.load(kernel_repo, RUN)
    (rec,) = [r for r in read_records(st.run_dir(kernel_repo, RUN) / "results.jsonl") if r.iteration == 1]
    by = {v["value"]: v for v in rec.sweep["values"]}
    assert by[1024]["status"] == "incorrect" and rec.sweep["measurements"] == 2  # dropped, then measured again
    assert all(by[v]["status"] == "ok" and by[v]["speedup"] > 0 and by[v]["shapes"] for v in (256, 512, 2048))
    chosen = rec.sweep["chosen"]
    assert chosen == max((256, 512, 2048), key=lambda v: by[v]["speedup"])
    assert rec.optimization == f"BLOCK 128 -> {chosen} (swept 256, 512, 1024, 2048)" == out["optimization"]
    assert rec.recipe == "launch-param:BLOCK=sweep(256,512,1024,2048)" and rec.correctness == "PASS"
    # the decision is the chosen value's own measurement, not the sweep's
    assert rec.speedup is not None and rec.decision.verdict != "unmeasured"
    message = git(kernel_repo, "log", "-1", "--format=%B", rec.commit)
    trailers = gitops.parse_trailers(message)
    assert trailers["Tileloop-Sweep"].split() == [f"{v}={by[v]['speedup']:.4f}x" if v != 1024 else "1024=incorrect"
                                                  for v in (256, 512, 1024, 2048)]
    assert trailers["Tileloop-Sweep-Chosen"] == str(chosen)
    assert f"BLOCK = {chosen}\n" in git(kernel_repo, "show", f"{rec.commit}:{TARGET}")
    if rec.status == "keep":
        assert gitops.head_sha(kernel_repo) == rec.commit
    assert {f"launch-param:BLOCK={v}" for v in (256, 512, 1024, 2048)} <= set(sweep.tried)
    assert history.rows(kernel_repo, RUN, sweep.branch)[-1].optimization == rec.optimization


def test_the_unattended_loop_sweeps_the_candidate_it_proposes(kernel_repo, monkeypatch):
    exp, _, fake = stage(kernel_repo, monkeypatch, ["ok"])
    exp.state.skip_recipes = [r.id for r in playbook.recipes() if r.id != "launch-param"]
    exp.settings = dataclasses.replace(exp.settings, judge_host=False)  # nothing is measured: no judge to host
    seen = {}
    monkeypatch.setattr(iteration, "evaluate", lambda run, it: seen.update(key=it.key, sweep=it.sweep))
    unattended.run_loop(exp, max_iters=1)
    assert seen["key"].startswith("launch-param:") and "=sweep(" in seen["key"] and seen["sweep"]["values"]
    assert seen["sweep"]["timed"] == bool(fake.asked)  # a block size is timed; num_warps under the interpreter is not


def test_an_experiment_interrupted_after_its_sweep_keeps_the_sweep_in_its_record(kernel_repo, monkeypatch):
    exp, cand, _ = stage(kernel_repo, monkeypatch, ["ok"])
    summary, chosen = sweeping.sweep_stage(exp, 1, cand, cand.sweep, "h")
    iteration.apply(exp, iteration.Iteration(1, cand.sweep.named(chosen.value), "h", cand.recipe, cand.sweep.key,
                                             source=chosen.source, sweep=summary))
    record = resume.repair(open_run(RUN, load_settings(), log=lambda _: None))  # as after a kill on entering commit
    assert record.status == "crash" and record.optimization.endswith("(interrupted)") and record.sweep == summary
    assert gitops.head_sha(kernel_repo) == st.load(kernel_repo, RUN).best_commit  # the tree restorable: at the best


def test_step_recipe_takes_the_sweep_unless_a_key_names_one_value(kernel_repo, monkeypatch):
    exp, _, _ = stage(kernel_repo, monkeypatch, [])
    first = suggest.recipe_candidate(exp, "launch-param")
    assert first.sweep is not None and first.sweep.values[0].key == first.key
    assert suggest.recipe_candidate(exp, "launch-param", first.key).sweep is None  # that value alone, as before sweeps
    assert suggest.recipe_candidate(exp, "launch-param", first.sweep.key).sweep == first.sweep
    exp.state.tried.append(first.sweep.values[1].key)  # a value tried: the sweep's key is the rest's
    rest = first.sweep.untried(exp.state.tried)
    assert suggest.recipe_candidate(exp, "launch-param", rest.key).sweep == first.sweep


def test_suggestions_offer_the_sweep_beside_the_one_value(kernel_repo, monkeypatch):
    exp, _, _ = stage(kernel_repo, monkeypatch, [])
    found = {s["key"]: s for s in suggest.suggestions(exp, limit=20)}
    block = found["launch-param:BLOCK=256"]
    assert block["sweep"] == {"key": "launch-param:BLOCK=sweep(256,512,1024,2048)",
                              "optimization": "BLOCK sweep 128 -> {256,512,1024,2048}", "values": [256, 512, 1024, 2048],
                              "apply": "tileloop step --recipe launch-param --key 'launch-param:BLOCK=sweep(256,512,1024,2048)'"}
    assert "sweep" not in found.get("eviction-policy:evict_first", {})  # a hint has no values to sweep
    exp.state.tried += ["launch-param:BLOCK=512", "launch-param:BLOCK=1024", "launch-param:BLOCK=2048"]
    assert "sweep" not in {s["key"]: s for s in suggest.suggestions(exp, limit=20)}["launch-param:BLOCK=256"]
