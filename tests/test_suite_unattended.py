"""`tileloop suite summarize --unattended-json`: the published list (one object per target, shape and
dtype of its final measurement, every number from that one measurement, torch.compile null where it
was unavailable), and its page (verdicts against the unattended targets, median seconds per
experiment, device, commands, unfinished targets)."""

from __future__ import annotations

import json
from datetime import datetime
import shutil
import statistics
from pathlib import Path

import pytest

from loop.cli import main
from loop.records.results import Record
from loop.run.levers import roofline
from loop.suite.summary import TARGETS_FILE, entry_from_run, record_targets

RECORDS = Path(__file__).resolve().parent.parent / "docs" / "results" / "audits-softmax-run-H100-2026-11-26-results.jsonl"
FIELDS = ["op", "language", "shape", "dtype", "best_ms", "eager_ms", "compile_ms", "clone_fraction", "experiments", "wall_s"]
UNAVAILABLE = "unavailable: torch.compile ran eagerly at a shape (recompile limit)"


def final_row(shape, dtype, best, eager, compile_, frac):
    return {"shape": shape, "dtype": dtype, "method": "graph", "best (ms)": best, "torch eager (ms)": eager,
            "torch.compile (ms)": compile_, "best, fraction of clone bandwidth": frac}


def entry(op, language, final, largest, iterations, walls, stop="stop", **extra):
    """A suite entry as `suite run` writes it, reduced to what the summaries read."""
    big = next(r for r in final if (r["shape"], r["dtype"]) == largest[:2]) if final else None
    return {"schema": "tileloop.suite-entry/1", "run": f"suite-{op.replace('_', '-')}-{language}", "op": op,
            "language": language, "target": f"kernels/{op}/{op}_{language}.py", "target_backend": "ptx",
            "device": "NVIDIA H100 80GB HBM3", "baseline_ms": 1.0, "best_ms": 0.5, "speedup": 2.0,
            "largest_shape": {"shape": [int(x) for x in largest[0].split("x")], "dtype": largest[1],
                              "flops": largest[2], "bytes": largest[3]},
            "final": final, "final_largest": big, "iterations": iterations,
            "outcomes": {"keep": 1, "revert": iterations - 1, "crash": 0, "unmeasured": 0}, "kept": [],
            "stop": {"state": stop, "reason": "no improvement in 2 consecutive iterations"}, "availability": {},
            "cut_off": False, "suite_wall_s": sum(walls) + 5.0, "experiment_wall_s": walls,
            "records_wall_s": sum(walls) + 3.0, "roofline": None, **extra}


@pytest.fixture
def suite_dir(tmp_path):
    """Entries of a finished memory-bound op (compile unavailable at its small shape), a matmul, a
    compute-bound attention, a cut-off run with no final measurement, a failed one, and the log of a
    run that started and was killed before it had an entry."""
    out = tmp_path / "suite"
    out.mkdir()
    va = entry("vector_add", "triton", [final_row("1048576", "float16", "0.003000", "0.003300", UNAVAILABLE, "0.90"),
                                        final_row("268435456", "float16", "0.370000", "0.390000", "0.380000", "0.97")],
               ("268435456", "float16", 2.7e8, 1.6e9), 3, [20.0, 30.0, 40.0])
    mm = entry("matmul", "cutile", [final_row("4096x4096x4096", "bfloat16", "0.200000", "0.210000", "0.220000", "0.04"),
                                    final_row("8192x8192x8192", "bfloat16", "1.500000", "1.400000", "1.450000", "0.02")],
               ("8192x8192x8192", "bfloat16", 1.1e12, 4.0e8), 2, [10.0, 12.0], resumed=True,
               roofline="0.02 of the same-run clone bandwidth (2900 GB/s) at [8192, 8192, 8192] bfloat16")
    att = entry("attention", "triton", [final_row("4x32x4096x64x1", "bfloat16", "1.000000", "1.200000", "1.100000", "0.10")],
                ("4x32x4096x64x1", "bfloat16", 1.4e11, 1.3e8), 1, [50.0])
    sm = entry("softmax", "cutile", [], ("2048x16384", "float16", 1e8, 1e8), 4, [5.0, 6.0, 7.0, 8.0],
               stop="continue", cut_off=True, final_error="report killed")
    failed = {"schema": "tileloop.suite-entry/1", "run": "suite-row-sum-triton", "target": "kernels/row_sum/row_sum_triton.py",
              "error": "no records (exit 1)"}
    for e in (va, mm, att, sm, failed):
        (out / f"{e['run']}.json").write_text(json.dumps(e))
        (out / f"{e['run']}.log").write_text(f"run {e['run']} on branch tileloop/{e['run']}: measuring the baseline\n")
    # started, killed before its entry; a log of something else; a target never started
    (out / "suite-layernorm-triton.log").write_text("run suite-layernorm-triton on branch tileloop/suite-layernorm-triton\n")
    (out / "suite-call1.log").write_text("[gpu 0] [suite] kernels/softmax/softmax_cutile.py: tileloop run\n")
    record_targets(out, [f"kernels/{op}/{op}_{lang}.py" for op, lang in (
        ("vector_add", "triton"), ("matmul", "cutile"), ("attention", "triton"), ("softmax", "cutile"))])
    record_targets(out, ["kernels/row_sum/row_sum_triton.py", "kernels/rmsnorm/rmsnorm_cutile.py",
                         "kernels/vector_add/vector_add_triton.py"])  # a second call: the list grows, once each
    return out


def test_the_list_holds_one_object_per_final_row_with_every_number(suite_dir, tmp_path, capsys):
    path = tmp_path / "docs" / "unattended-H100-2026-11-27.json"
    assert main(["suite", "summarize", str(suite_dir), "--unattended-json", str(path),
                 "--command", "tileloop suite run kernels/*/*_triton.py --gpus 0,1"]) == 0
    data = json.loads(path.read_text())
    entries = {e["op"]: e for e in (json.loads(p.read_text()) for p in suite_dir.glob("*.json")) if "op" in e}
    # every final row of each entry that has a final measurement, no row of the others
    assert [(d["op"], d["shape"]) for d in data] == [
        ("attention", [4, 32, 4096, 64, 1]), ("matmul", [4096, 4096, 4096]), ("matmul", [8192, 8192, 8192]),
        ("vector_add", [1048576]), ("vector_add", [268435456])]
    for d in data:
        assert list(d)[:len(FIELDS)] == FIELDS
        e = entries[d["op"]]
        row = next(r for r in e["final"] if [int(x) for x in r["shape"].split("x")] == d["shape"])
        assert (d["language"], d["dtype"]) == (e["language"], row["dtype"])
        assert d["best_ms"] == float(row["best (ms)"]) and d["eager_ms"] == float(row["torch eager (ms)"])
        assert d["experiments"] == e["iterations"]
        assert d["largest"] is (row is e["final"][-1] if d["op"] != "attention" else True)
    va_small, va_big = [d for d in data if d["op"] == "vector_add"]
    assert va_small["compile_ms"] is None and va_big["compile_ms"] == 0.38  # never the fallen-back figure
    assert (va_small["clone_fraction"], va_big["clone_fraction"]) == (0.90, 0.97)
    assert va_big["wall_s"] == entries["vector_add"]["suite_wall_s"]  # the run's own clock, one call
    mm = [d for d in data if d["op"] == "matmul"]
    assert [d["clone_fraction"] for d in mm] == [None, None]  # no copy-bandwidth fraction for a compute-bound op
    assert [d["matmul_ms"] for d in mm] == [0.21, 1.4]  # the matmul spec's torch eager is torch.matmul
    assert mm[0]["wall_s"] == entries["matmul"]["records_wall_s"]  # resumed: its records' time over every session
    (att,) = [d for d in data if d["op"] == "attention"]
    assert att["clone_fraction"] is None and att["memory_bound"] is False and "matmul_ms" not in att
    assert all(d["finished"] for d in data)


def test_the_page_judges_each_row_and_lists_what_did_not_finish(suite_dir, tmp_path):
    path = tmp_path / "unattended.json"
    cmd = "tileloop suite run kernels/*/*_triton.py --gpus 0,1"
    assert main(["suite", "summarize", str(suite_dir), "--unattended-json", str(path), "--command", cmd]) == 0
    text = path.with_suffix(".md").read_text()
    assert "- device: NVIDIA H100 80GB HBM3" in text and f"`{cmd}`" in text
    rows = {tuple(c.strip() for c in line.split("|")[1:5]): line for line in text.splitlines() if line.startswith("| ")}
    # largest shape at 0.97 of clone and 1.03x torch.compile (0.38/0.37): met
    big = rows[("vector_add", "triton", "268435456", "float16")]
    assert "| met " in big
    # the small shape's compile was unavailable: not judged (the clone target is for the largest shape only)
    small = rows[("vector_add", "triton", "1048576", "float16")]
    assert "not judged: torch.compile unavailable" in small and "clone" not in small.split("|")[-3]
    # matmul 8192: 1.4/1.5 of torch.matmul and 1.45/1.5 of torch.compile: both missed, with what the run recorded
    mm = rows[("matmul", "cutile", "8192x8192x8192", "bfloat16")]
    assert "not met: torch.matmul 0.933x (needs >= 1.0x); torch.compile 0.967x (needs >= 1.0x)" in mm
    assert "no profile recorded; stopped: no improvement in 2 consecutive iterations" in mm  # no clone fraction for matmul
    assert "| met " in rows[("matmul", "cutile", "4096x4096x4096", "bfloat16")]
    assert "| met " in rows[("attention", "triton", "4x32x4096x64x1", "bfloat16")]  # no clone target for it
    # the median over every experiment's wall time: 5, 6, 7, 8, 10, 12, 20, 30, 40, 50
    walls = [20.0, 30.0, 40.0, 10.0, 12.0, 50.0, 5.0, 6.0, 7.0, 8.0]
    assert (f"median seconds per experiment over the suite: {statistics.median(walls):.1f} s over {len(walls)} "
            "experiments (needs <= 30 s: met), from the records' per-experiment wall times") in text
    unfinished = text.split("## Not finished")[1]
    assert "kernels/row_sum/row_sum_triton.py: not run: no records (exit 1)" in unfinished
    assert "kernels/softmax/softmax_cutile.py: no final measurement (report killed)" in unfinished
    assert "kernels/softmax/softmax_cutile.py: unfinished, cut off by --per-run: 4 experiment(s)" in unfinished
    assert "suite-layernorm-triton: started, no entry (killed or still running)" in unfinished
    assert "kernels/rmsnorm/rmsnorm_cutile.py: not started: `suite run --resume` starts it" in unfinished
    assert "vector_add" not in unfinished and "matmul" not in unfinished and "call1" not in unfinished
    assert unfinished.count("\n- ") == 5


def test_a_threshold_missed_says_no_profile_where_the_run_recorded_none(suite_dir, tmp_path):
    va = json.loads((suite_dir / "suite-vector-add-triton.json").read_text())
    va["final"][1]["best, fraction of clone bandwidth"] = "0.94"
    va["final_largest"] = va["final"][1]
    va["stop"] = {"state": "stop", "reason": ""}
    (suite_dir / "suite-vector-add-triton.json").write_text(json.dumps(va))
    path = tmp_path / "u.json"
    assert main(["suite", "summarize", str(suite_dir), "--unattended-json", str(path)]) == 0
    line = next(x for x in path.with_suffix(".md").read_text().splitlines() if "| 268435456" in x)
    assert "not met: clone 0.94 (needs >= 0.95)" in line and line.rstrip(" |").endswith("no profile recorded")
    va["roofline"] = "0.94 of the same-run clone bandwidth (2900 GB/s) at [268435456] float16"
    (suite_dir / "suite-vector-add-triton.json").write_text(json.dumps(va))
    mm = json.loads((suite_dir / "suite-matmul-cutile.json").read_text())
    mm["largest_best"] = {"tflops": 733.2}
    (suite_dir / "suite-matmul-cutile.json").write_text(json.dumps(mm))
    assert main(["suite", "summarize", str(suite_dir), "--unattended-json", str(path)]) == 0
    lines = path.with_suffix(".md").read_text().splitlines()
    line = next(x for x in lines if "| 268435456" in x)
    assert "the run's lever analysis: best version at 0.94 of the same-run clone bandwidth (2900 GB/s)" in line
    assert "no profile recorded" not in line
    line = next(x for x in lines if "| 8192x8192x8192" in x)
    assert "the run's own measurement of the best version: 733 TFLOP/s at the largest shape" in line
    assert "commands: not given" in path.with_suffix(".md").read_text()


def test_median_falls_back_to_wall_time_over_experiments_and_says_so(suite_dir, tmp_path):
    for p in suite_dir.glob("*.json"):
        e = json.loads(p.read_text())
        e.pop("experiment_wall_s", None)
        p.write_text(json.dumps(e))
    path = tmp_path / "u.json"
    assert main(["suite", "summarize", str(suite_dir), "--unattended-json", str(path)]) == 0
    # per run: one value of its wall time over its experiments per experiment; the resumed matmul by its records
    per = {"va": (90.0 + 5.0) / 3, "mm": (22.0 + 3.0) / 2, "att": (50.0 + 5.0) / 1, "sm": (26.0 + 5.0) / 4}
    walls = [per["va"]] * 3 + [per["mm"]] * 2 + [per["att"]] + [per["sm"]] * 4
    assert (f"{statistics.median(walls):.1f} s over 10 experiments (needs <= 30 s: met), from each run's wall_s / "
            "experiments") in path.with_suffix(".md").read_text()


def test_entries_keep_their_records_wall_times_and_roofline(tmp_path):
    """A run's entry keeps each experiment's wall time and its best version's distance to the
    roofline; an older entry without them gets them from the records the suite copied beside it."""
    recs = [Record.from_json(json.loads(line)) for line in RECORDS.read_text().splitlines() if line.strip()]
    run_dir = tmp_path / "softmax"
    run_dir.mkdir()
    shutil.copy(RECORDS, run_dir / "results.jsonl")
    e = entry_from_run(run_dir, None, False, 1.0)
    assert e["experiment_wall_s"] == [r.wall_s for r in recs[1:]] and len(recs) > 2
    assert e["records_wall_s"] == pytest.approx(sum(r.wall_s for r in recs))
    best = next(r for r in reversed(recs) if r.status == "keep")
    assert e["roofline"] == roofline(best, recs[0].target_backend).basis and "clone bandwidth" in e["roofline"]

    from loop.suite.summary import load_entries

    out = tmp_path / "out"
    out.mkdir()
    old = {k: v for k, v in e.items() if k not in ("experiment_wall_s", "records_wall_s", "roofline")}
    (out / f"{e['run']}.json").write_text(json.dumps(old))
    (loaded,) = load_entries([out])
    assert "experiment_wall_s" not in loaded
    shutil.copy(RECORDS, out / f"{e['run']}-results.jsonl")
    (loaded,) = load_entries([out])
    assert loaded["experiment_wall_s"] == e["experiment_wall_s"] and loaded["roofline"] == e["roofline"]


def test_an_experiment_the_stop_interrupted_has_no_wall_time_and_is_not_counted(tmp_path):
    """A run cut off mid-experiment records it as a crash (interrupted) of 0 s, tried again on resume: on
    an H100 suite call, five such zeros made the median of ten experiments 7.4 s where the five that ran
    took 15-121 s."""
    lines = [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]
    cut = {**lines[-1], "iteration": lines[-1]["iteration"] + 1, "status": "crash", "wall_s": 0.0,
           "decision": {"action": "crash", "verdict": "interrupted", "reason": "the run was interrupted at stage measure"}}
    run_dir = tmp_path / "softmax"
    run_dir.mkdir()
    (run_dir / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [*lines, cut]))
    e = entry_from_run(run_dir, None, True, 1.0)
    assert e["experiment_wall_s"] == [x["wall_s"] for x in lines[1:]] and 0.0 not in e["experiment_wall_s"]
    assert e["median_iteration_wall_s"] == pytest.approx(statistics.median(x["wall_s"] for x in lines[1:]))


def test_an_experiment_cut_off_counts_at_the_seconds_it_had_run_and_the_median_says_so(tmp_path, suite_dir):
    """An experiment a --per-run limit cut off counts in the suite's median at the seconds it had run (from
    its start to the record that closed it), a lower bound: on an H200 suite call 13 of 20 experiments were
    cut off after 60-140 s, and a median over the 7 that finished (17 s) read as met."""
    lines = [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]
    cut = {**lines[-1], "iteration": lines[-1]["iteration"] + 1, "status": "crash", "wall_s": 0.0,
           "started": "2026-11-28T07:54:40+00:00", "finished": "2026-11-28T07:56:19+00:00",
           "decision": {"action": "crash", "verdict": "interrupted", "reason": "the run was interrupted at stage measure"}}
    run_dir = tmp_path / "softmax"
    run_dir.mkdir()
    (run_dir / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [*lines, cut]))
    e = entry_from_run(run_dir, None, True, 1.0)
    assert e["cut_experiment_s"] == [99.0] and 0.0 not in e["experiment_wall_s"]
    # killed in a sweep, which leaves no record: counted from the last record to the kill
    (run_dir / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    last = datetime.fromisoformat(lines[-1]["finished"]).timestamp()
    assert entry_from_run(run_dir, None, True, 1.0, cut_at=last + 50.0)["cut_experiment_s"] == [50.0]
    assert entry_from_run(run_dir, None, False, 1.0)["cut_experiment_s"] == []
    for p in suite_dir.glob("*.json"):  # every finished experiment short; three cut off after 99 s ... 101 s
        d = json.loads(p.read_text())
        if "op" in d:
            d["cut_experiment_s"] = [99.0, 100.0, 101.0] * (d["op"] in ("vector_add", "matmul"))
            p.write_text(json.dumps(d))
    path = tmp_path / "u.json"
    assert main(["suite", "summarize", str(suite_dir), "--unattended-json", str(path)]) == 0
    walls = [20.0, 30.0, 40.0, 10.0, 12.0, 50.0, 5.0, 6.0, 7.0, 8.0] + [99.0, 100.0, 101.0] * 2
    text = path.with_suffix(".md").read_text()
    assert (f"{statistics.median(walls):.1f} s over 16 experiments (needs <= 30 s: not met), from the records' "
            "per-experiment wall times, 6 of them cut off (by --per-run or a kill of the suite) counted at the seconds they had run") in text
    for p in suite_dir.glob("*.json"):  # one cut off, the median within the target: not shown, never met
        d = json.loads(p.read_text())
        if "op" in d:
            d["cut_experiment_s"] = [31.0] * (d["op"] == "matmul")
            p.write_text(json.dumps(d))
    assert main(["suite", "summarize", str(suite_dir), "--unattended-json", str(path)]) == 0
    assert "(needs <= 30 s: not shown: cut-off experiments counted at lower bounds)" in path.with_suffix(".md").read_text()


def test_the_suite_keeps_the_list_of_its_targets_over_calls(suite_dir):
    listed = json.loads((suite_dir / TARGETS_FILE).read_text())["targets"]
    assert listed == ["kernels/vector_add/vector_add_triton.py", "kernels/matmul/matmul_cutile.py",
                      "kernels/attention/attention_triton.py", "kernels/softmax/softmax_cutile.py",
                      "kernels/row_sum/row_sum_triton.py", "kernels/rmsnorm/rmsnorm_cutile.py"]


def test_bad_unattended_arguments_are_refused(suite_dir, tmp_path, capsys):
    assert main(["suite", "summarize", str(suite_dir), "--unattended-json", str(tmp_path / "u.md")]) == 2
    assert "needs a .json path" in capsys.readouterr().err
    assert main(["suite", "summarize", str(suite_dir), "--command", "x"]) == 2
    assert "--command goes with --unattended-json" in capsys.readouterr().err


def test_every_fraction_of_the_clone_above_one_is_explained_on_the_page(tmp_path):
    """A best version above 1.0 of the same-run clone bandwidth gets the final measurement's note on why
    (the clone short of the device's copy rate, here); one at or below 1 and a compute-bound op get none."""
    note = ("above 1.0 of the clone (best 1.35; clone 2427 GB/s, skewed): the clone reached 0.58 of the "
            "device's copy rate alone (4219 GB/s); against that rate: best 0.78")
    above = dict(final_row("8192x1024", "float16", "0.010000", "0.050000", "0.010100", "1.35"), **{"clone note": note})
    rms = entry("rmsnorm", "triton", [above, final_row("2048x16384", "float16", "0.036000", "0.220000", "0.036000", "0.92")],
                ("2048x16384", "float16", 1e8, 1.3e8), 2, [20.0, 30.0])
    out = tmp_path / "suite"
    out.mkdir()
    (out / f"{rms['run']}.json").write_text(json.dumps(rms))
    path = tmp_path / "unattended.json"
    assert main(["suite", "summarize", str(out), "--unattended-json", str(path), "--command", "c"]) == 0
    section = path.with_suffix(".md").read_text().split("## Fractions of the clone above 1")[1].split("## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert lines == [f"- rmsnorm triton 8192x1024 float16: 1.35: {note}"]
