"""What a measurement's correctness checks ran (the kernels launched, the host functions called) is
part of its typed record: read from the judge's result once, written in results.jsonl, and what the
screen of suggestions reads for the best version (the judge's result file only for older records)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from loop.measure.evaluate import to_backend_result
from loop.records.results import BackendResult, Record, append_record, read_records
from loop.run.suggest import incumbent_coverage

BACKEND = "ptx"


def judge_result(label: str, launched: list[str], called: list[str]) -> dict:
    """A judge's result that timed `label` beside the incumbent, with what its checks ran per label."""
    impls = {label: {"median_ms": 1.0, "samples_ms": [1.0] * 3}, "incumbent": {"median_ms": 2.0, "samples_ms": [2.0] * 3}}
    return {"status": "ok", "timing": {"dtype": "float32", "shapes": [{"shape": [64], "impls": impls}]},
            "correctness": {"passed": True, "checks": [],
                            "launched": {label: launched, "incumbent": ["old_kernel"]},
                            "called": {label: called, "incumbent": ["old_host"]}}}


def record(iteration: int, result: BackendResult, commit: str = "c1") -> Record:
    return Record(run="r", iteration=iteration, optimization="o", status="keep", correctness="PASS", latency_ms=1.0,
                  target_backend=BACKEND, backends={BACKEND: result}, commit=commit, parent="p")


def test_the_result_carries_what_the_checks_of_its_own_implementation_ran(tmp_path):
    for label in ("candidate", "baseline"):
        r = to_backend_result(BACKEND, judge_result(label, ["k_fwd"], ["run"]), label, tmp_path / "w", tmp_path)
        assert (r.status, r.launched, r.called) == ("ok", ["k_fwd"], ["run"]), label
    failed = {"status": "incorrect", "message": "mismatch",
              "correctness": {"passed": False, "launched": {"candidate": ["k_fwd"]}, "called": {"candidate": []}}}
    r = to_backend_result(BACKEND, failed, "candidate", tmp_path / "w", tmp_path)
    assert (r.status, r.launched, r.called) == ("incorrect", ["k_fwd"], [])
    bare = to_backend_result(BACKEND, {"status": "compile_error", "message": "boom"}, "candidate", tmp_path / "w", tmp_path)
    assert (bare.launched, bare.called) == (None, None)  # no checks ran: nothing says


def test_the_fields_round_trip_through_the_record_and_old_records_still_read(tmp_path):
    ran = BackendResult(BACKEND, True, "ok", "", 1.0, 2.0, "PASS", launched=["k_fwd"], called=["run", "helper"])
    path = tmp_path / "results.jsonl"
    append_record(path, record(1, ran))
    written = json.loads(path.read_text())["backends"][BACKEND]
    assert (written["launched"], written["called"]) == (["k_fwd"], ["run", "helper"])
    assert read_records(path)[0].backends[BACKEND] == ran
    assert ran.unmeasured("cannot show").launched == ["k_fwd"]  # the checks ran though the timing is left out
    unknown = record(1, BackendResult(BACKEND, True, "ok", "", 1.0)).to_json()["backends"][BACKEND]
    assert "launched" not in unknown and "called" not in unknown  # written as records were before the fields
    old = json.loads(path.read_text())
    for key in ("launched", "called"):
        del old["backends"][BACKEND][key]
    back = Record.from_json(old).backends[BACKEND]
    assert (back.launched, back.called) == (None, None) and back == replace(ran, launched=None, called=None)


def stand_in_run(tmp_path: Path, records: list[Record]) -> SimpleNamespace:
    """What `incumbent_coverage` reads of a run: its records, its state and its iterations' folders."""
    state = SimpleNamespace(best_commit="c1", harness=None, target_backend=BACKEND)
    return SimpleNamespace(records=lambda: records, state=state, iter_dir=lambda n: tmp_path / f"iter-{n:03d}")


def write_result_file(tmp_path: Path, n: int, label: str, launched: list[str], called: list[str]) -> Path:
    path = tmp_path / f"iter-{n:03d}" / f"worker-{BACKEND}.result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(judge_result(label, launched, called)))
    return path


def test_incumbent_coverage_reads_the_best_record_not_the_judges_file(tmp_path):
    best = record(2, BackendResult(BACKEND, True, "ok", "", 1.0, launched=["k_fwd"], called=["run"]))
    run = stand_in_run(tmp_path, [record(0, BackendResult(BACKEND, True, "ok", ""), commit="c0"), best])
    assert not (tmp_path / "iter-002").exists()  # no result file: the record alone says
    assert incumbent_coverage(run) == (["k_fwd"], ["run"])
    write_result_file(tmp_path, 2, "candidate", ["k_other"], ["other"])
    assert incumbent_coverage(run) == (["k_fwd"], ["run"])  # the record wins over a file that differs
    run.state.harness = {"test_cmd": "t", "bench_cmd": "b"}
    assert incumbent_coverage(run) == (None, None)  # an external harness: no checks of the judge


def test_a_record_before_the_fields_falls_back_to_its_judges_result_file(tmp_path):
    run = stand_in_run(tmp_path, [record(0, BackendResult(BACKEND, True, "ok", ""), commit="c1")])
    assert incumbent_coverage(run) == (None, None)  # neither the record nor a file says
    path = write_result_file(tmp_path, 0, "baseline", ["k_base"], ["run_base"])
    assert incumbent_coverage(run) == (["k_base"], ["run_base"])
    path.unlink()
    assert incumbent_coverage(run) == (None, None)
