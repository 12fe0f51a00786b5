"""The suite's wall time simulated on N GPUs: longest-first list scheduling on numbers worked out by
hand, each run lengthened by the driver's cost per task, the driver's own work as a floor, and the
run time each entry gives."""

from __future__ import annotations

import pytest

from loop.cli import main
from loop.suite import simulate


def test_longest_first_on_numbers_worked_by_hand():
    # 7->w0, 5->w1, 4->w1 (9), 3->w0 (10), 3->w1 (12), 2->w0 (12): 12, as good as any schedule (24 / 2)
    assert simulate.schedule([3, 7, 2, 5, 3, 4], 2) == 12
    # LPT is not optimal: 3->w0, 3->w1, 2->w0 (5), 2->w1 (5), 2->w0 (7), where 3+3 / 2+2+2 gives 6
    assert simulate.schedule([2, 3, 2, 3, 2], 2) == 7
    assert simulate.schedule([2, 3, 2, 3, 2], 1) == 12  # one worker: the sum
    assert simulate.schedule([2, 3, 2, 3, 2], 64) == 3  # more workers than runs: the longest
    assert simulate.schedule([], 4) == 0
    with pytest.raises(ValueError):
        simulate.schedule([1.0], 0)


def entry(target: str, started: float, ended: float, driver_s: float | None = None, **more) -> dict:
    e = {"schema": "tileloop.suite-entry/1", "run": target, "target": target, "started": started, "ended": ended, **more}
    if driver_s is not None:
        e["driver"] = {"sent_bytes": 2048, "send_s": 0.0, "checkpoints": 3, "checkpoint_bytes": 4096,
                       "returned_bytes": 1024, "fetch_s": driver_s / 2, "take_s": driver_s / 2, "driver_s": driver_s}
    return e


def test_the_suite_on_1_4_16_64_gpus_with_the_drivers_cost_per_task():
    # run times 3, 3, 2, 2, 2 s; the driver's cost per task 0.5 s (the median of 0.4, 0.5, 0.5, 0.6, 0.9)
    es = [entry("a", 100, 103, 0.5), entry("b", 100, 103, 0.4), entry("c", 100, 102, 0.6), entry("d", 103, 105, 0.9),
          entry("e", 105, 107, 0.5)]
    sim = simulate.simulate(es)
    assert sim["driver_s_per_task"] == 0.5 and sim["driver_from"] == "entries" and sim["driver"]["tasks"] == 5
    rows = {r["gpus"]: r for r in sim["rows"]}
    # 1 GPU: 3.5 + 3.5 + 2.5 * 3 = 14.5
    assert rows[1]["wall_s"] == 14.5 and rows[1]["speedup"] == 1.0
    # 4 GPUs: 3.5, 3.5, 2.5, 2.5 then 2.5 on the first to free (a 2.5 one): 5.0
    assert rows[4]["wall_s"] == 5.0 and rows[4]["speedup"] == round(14.5 / 5.0, 3) and rows[4]["bound_by"] == "the schedule"
    # 16 and 64: every run at once, the longest (3.5) bounds; the driver's 5 x 0.5 = 2.5 does not
    assert rows[16]["wall_s"] == rows[64]["wall_s"] == 3.5 and rows[64]["bound_by"] == "the longest target"
    assert [t["run_s"] for t in sim["targets"]] == [3, 3, 2, 2, 2]


def test_a_driver_slower_than_the_runs_bounds_the_suite():
    es = [entry(t, 0, 1) for t in "abcd"]  # 1 s each, no Ray entry: 0 s per task unless given
    assert simulate.simulate(es)["rows"][-1]["wall_s"] == 1 and simulate.simulate(es)["driver_from"] == "none"
    sim = simulate.simulate(es, counts=(1, 64), per_task_s=2.0)
    # 64 GPUs: each run 1 + 2 = 3 s at once, but the driver's 4 x 2 = 8 s one after another
    assert sim["rows"][1] == {"gpus": 64, "wall_s": 8.0, "bound_by": "the driver", "speedup": round(12 / 8, 3)}
    assert sim["rows"][0]["wall_s"] == 12.0


def test_each_entry_gives_its_run_time_or_is_left_out():
    assert simulate.run_time(entry("a", 10, 25)) == (15, "start to end")
    # a resumed run: this call's start to end is a share; its records' wall times span every session
    assert simulate.run_time(entry("a", 10, 25, resumed=True, records_wall_s=40.0)) == (40.0, "records")
    assert simulate.run_time({"suite_wall_s": 7.0}) == (7.0, "this call's share")
    failed = {"schema": "tileloop.suite-entry/1", "run": "x", "target": "x", "error": "no records (exit 1)"}
    sim = simulate.simulate([entry("a", 0, 4), failed])
    assert sim["left_out"] == ["x"] and [t["target"] for t in sim["targets"]] == ["a"]
    page = "\n".join(simulate.markdown(sim))
    assert "Left out (no run time): x." in page and "not measured by these entries" in page


def test_a_published_results_list_gives_one_run_time_per_target(tmp_path, capsys):
    import json

    # a row per target, shape and dtype, each with its target's wall_s: 10 s and 4 s
    rows = [{"op": "a", "language": "triton", "shape": [1], "dtype": "float16", "wall_s": 10.0},
            {"op": "a", "language": "triton", "shape": [2], "dtype": "float16", "wall_s": 10.0},
            {"op": "b", "language": "cutile", "shape": [1], "dtype": "float16", "wall_s": 4.0}]
    assert simulate.published_runs(rows) == [("a triton", 10.0, "published wall_s"), ("b cutile", 4.0, "published wall_s")]
    path = tmp_path / "unattended.json"
    path.write_text(json.dumps(rows))
    assert main(["suite", "simulate", str(path), "--driver-s", "1", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)["simulation"]
    # 1 GPU: 11 + 5 = 16; 4 GPUs: the longest, 11
    assert [(r["gpus"], r["wall_s"]) for r in sim["rows"]] == [(1, 16.0), (4, 11.0), (16, 11.0), (64, 11.0)]
    assert sim["driver_from"] == "given"
    path.write_text(json.dumps([{"op": "a"}]))
    assert main(["suite", "simulate", str(path)]) == 2 and "not a published results list" in capsys.readouterr().err
