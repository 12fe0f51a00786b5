"""perf_results.md, report.md, the suite entry and the history rebuilt from trailers, from synthetic
records: every speedup is a paired one (recomputed from results.jsonl by tests/speedups.py), the
cumulative speedup is the product of the kept ones (never baseline latency over best latency from
other sessions), the header says what the latencies are, each table names its timing method, two
methods that disagree are explained, an interruption is not a correctness FAIL, unchecked dtypes
are listed."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from speedups import check_perf_results, check_records_json, check_report, recomputed, table_rows

from loop.cli.common import record_summary
from loop.common.messages import Decision
from loop.decide import Policy, ShapeComparison, decide
from loop.records import gitops, history, report
from loop.records.perf_table import Row, render_perf_results
from loop.records.results import NOT_CHECKED, BackendResult, Record, append_record, cumulative, read_records
from loop.suite.summary import entry_from_run

RUN = "r1"
BF16 = "bfloat16: the Triton interpreter does not support bf16"


def comparison(speedup: float, shape=(8192,)) -> ShapeComparison:
    half = 0.02
    c = math.log(speedup)
    return ShapeComparison(tuple(shape), speedup, math.exp(c - half), math.exp(c + half), c, half / 2.576, 30)


def timed(latency: float, incumbent: float | None, shapes, method: str, label: str = "candidate") -> BackendResult:
    rows = [{"shape": list(s), "dtype": "float16", "method": method,
             label: {"median_ms": latency, "iqr_ms": latency * 0.01}} for s in shapes]
    return BackendResult("interpreter", True, "ok", "", latency, incumbent, "PASS", "interpreter", None, rows)


def make(n: int, status: str, *, speedups=(), latency=None, incumbent=None, shapes=((8192,),),
         method="interpreter_wallclock", hypothesis="", correctness="PASS", failure=None, cumulative_speedup=None,
         decision=None) -> Record:
    if decision is None and speedups:
        decision = decide(Policy(), shapes=[comparison(s, shape) for s, shape in zip(speedups, shapes)])
    if decision is None:
        decision = Decision(None, failure or ("baseline" if n == 0 else "unmeasured"), "why")
    backend = (timed(latency, incumbent, shapes, method, "baseline" if n == 0 else "candidate") if latency is not None
               else BackendResult("interpreter", True, failure or "unmeasured", "why", correctness=correctness,
                                  timing_label="interpreter"))
    return Record(run=RUN, iteration=n, optimization=f"change {n}", status=status, correctness=correctness,
                  latency_ms=latency, target_backend="interpreter", backends={"interpreter": backend},
                  commit=f"{n:040x}", parent=None, hypothesis=hypothesis, speedup=decision.speedup,
                  cumulative_speedup=cumulative_speedup, timing="interpreter", decision=decision,
                  unchecked=[BF16], env={"triton_version": "3.6.0"})


def session() -> list[Record]:
    """A baseline at 10 ms; #1 kept at 1.5x paired though it measured 9 ms in its own session (the
    incumbent measured 13.5 ms there); #2 reverted within noise; #3 unmeasured; #4 kept at 1.2x
    paired, measured 8 ms. Baseline over best latency would say 1.25x; the paired product is 1.8x."""
    return [
        make(0, "keep", latency=10.0, cumulative_speedup=1.0),
        make(1, "keep", speedups=(1.5,), latency=9.0, incumbent=13.5, hypothesis="fewer programs " * 8,
             cumulative_speedup=1.5),
        make(2, "revert", speedups=(1.001,), latency=9.1, incumbent=9.1, cumulative_speedup=1.5),
        make(3, "unmeasured", cumulative_speedup=1.5),
        make(4, "keep", speedups=(1.2,), latency=8.0, incumbent=9.6, cumulative_speedup=1.8),
    ]


def write_run(tmp_path, records: list[Record]):
    run_dir = tmp_path / "sandbox" / RUN
    for r in records:
        append_record(run_dir / "results.jsonl", r)
    return run_dir, read_records(run_dir / "results.jsonl")


def state_for(tmp_path):
    target = tmp_path / "k.py"
    target.write_text((Path(__file__).parent.parent / "kernels" / "vector_add" / "vector_add_triton.py").read_text())
    return SimpleNamespace(run_id=RUN, target="k.py", language="triton", backends=["interpreter"],
                           availability={"interpreter": {"available": True, "reason": ""}}, target_backend="interpreter",
                           best_commit="f" * 40, branch="tileloop/x", env={})


def test_the_session_is_built_as_its_docstring_says():
    recs = session()
    assert recs[2].decision.verdict == "within_noise" and recs[4].decision.verdict == "improved"
    assert math.isclose(cumulative(recs), 1.8) and recs[-1].cumulative_speedup == 1.8


def test_perf_results_columns_and_a_header_that_needs_no_other_file(tmp_path):
    _dir, recs = write_run(tmp_path, session())
    text = render_perf_results(RUN, {"target": "`k.py`"}, recs, "interpreter")
    header = next(line for line in text.splitlines() if line.startswith("|"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[:5] == ["iteration", "optimization", "latency_ms", "correctness", "status"]
    assert cols[5:] == ["hypothesis", "decision", "speedup_vs_incumbent", "incumbent_ms", "cumulative_speedup", "commit",
                        "ref", "interpreter_ms"]
    assert "the median at one shape (8192 float16); no mean over shapes" in text
    assert "Triton interpreter wall clock" in text and "not comparable; compare within a row" in text
    assert f"unchecked: {BF16}" in text
    assert check_perf_results(text, recs) == 6  # three paired speedups, three cumulative cells (baseline included)
    rows = {r.iteration: r for r in map(Row.from_record, recs)}
    assert rows[3].status == "unmeasured" and rows[3].ref == f"refs/tileloop/{RUN}/3" and rows[3].speedup == ""
    assert rows[2].ref == f"refs/tileloop/{RUN}/2" and rows[1].ref == "" and rows[1].commit == recs[1].commit[:10]
    assert rows[1].incumbent_ms == "13.500000" and rows[4].cumulative == "1.8000x"
    assert rows[1].hypothesis.endswith("...") and len(rows[1].hypothesis) <= 60
    assert "1.2500x" not in text and "1.25x" not in text  # 10 ms / 8 ms from two sessions: never published


def test_several_shapes_are_named_with_their_methods():
    shapes = ((1 << 20,), (1 << 24,))
    recs = [make(0, "keep", latency=1.0, shapes=shapes, method="cuda_graph", cumulative_speedup=1.0)]
    recs[0].backends["interpreter"].shapes[1]["method"] = "cuda_events_l2_flush"
    text = render_perf_results(RUN, {}, recs, "interpreter")
    assert "geometric mean of the per-shape medians over 2 shapes (1048576 float16, 16777216 float16)" in text
    assert "CUDA-graph replay over rotating inputs at 1048576 float16" in text
    assert "eager calls after an L2 flush (CUDA events) at 16777216 float16" in text


def test_history_rebuilds_the_same_rows_from_trailers():
    recs = session() + [make(5, "crash", correctness=NOT_CHECKED, failure="interrupted", cumulative_speedup=1.8)]
    for r in recs:
        t = gitops.parse_trailers(history.commit_message(r))
        assert history.row_from_trailers(r.commit, t) == Row.from_record(r), r.iteration
    interrupted = Row.from_record(recs[-1])
    assert interrupted.correctness == "not checked" and interrupted.status == "crash" and interrupted.decision.startswith("interrupted")


def test_every_speedup_of_the_report_and_the_json_is_paired(tmp_path):
    run_dir, recs = write_run(tmp_path, session())
    text = report.render(state_for(tmp_path), recs, tmp_path, None, "latency.png")
    assert check_report(text, recs) >= 8
    assert "1.8000x, the kept paired speedups multiplied: #1 1.5000 x #4 1.2000" in text
    assert "1.25x" not in text and "1.2500x" not in text
    assert f"Unchecked: {BF16}" in text
    assert table_rows(text[text.index("## Optimization path"):])[3]["status"] == "unmeasured"
    check_records_json([record_summary(r) for r in recs], recs)
    entry = entry_from_run(run_dir, None, False, 1.0)
    assert math.isclose(entry["speedup"], recomputed(recs)[4]["cumulative"])
    assert entry["outcomes"] == {"keep": 2, "revert": 1, "crash": 0, "unmeasured": 1}


def test_a_planted_wrong_speedup_is_caught():
    """The checks above can fail: a report or table that divides latencies of two sessions is refused."""
    recs = session()
    bad = replace(recs[4], cumulative_speedup=recs[0].latency_ms / recs[4].latency_ms)
    text = render_perf_results(RUN, {}, recs[:4] + [bad], "interpreter")
    with pytest.raises(AssertionError):
        check_perf_results(text, recs)
    with pytest.raises(AssertionError, match="1.25x"):
        check_report("best against baseline: 1.25x", recs)


def test_two_timing_methods_that_disagree_are_explained(tmp_path):
    best = make(1, "keep", speedups=(1.1,), latency=0.091, incumbent=0.1, shapes=((4096, 16384),), method="cuda_graph")
    far = [{"shape": "4096x16384", "dtype": "float16", "method": "cuda_events_l2_flush", "best (ms)": "0.128000"}]
    (line,) = report.disagreements(best, "interpreter", far)
    assert "0.091000 ms by CUDA-graph replay" in line and "0.128000 ms by eager calls after an L2 flush" in line
    assert "41% apart" in line and "launch and host-side cost" in line
    near = [{**far[0], "best (ms)": "0.093000"}]
    assert report.disagreements(best, "interpreter", near) == []
    same = [{**far[0], "method": "cuda_graph"}]
    assert "run-to-run variation" in report.disagreements(best, "interpreter", same)[0]
    state = state_for(tmp_path)
    recs = [make(0, "keep", latency=0.1, shapes=((4096, 16384),), method="cuda_graph", cumulative_speedup=1.0),
            replace(best, cumulative_speedup=1.1)]
    text = report.render(state, recs, tmp_path, {"rows": [{**far[0], "torch eager (ms)": "0.2"}]}, "latency.png")
    assert "## Where two timings of the best version disagree" in text
    roofline = text[text.index("## Roofline"):]
    assert "CUDA-graph replay over rotating inputs" in roofline.split("\n\n")[1]


def test_records_written_before_the_new_fields_still_read(tmp_path):
    old = session()[1].to_json()
    for key in ("cumulative_speedup", "timing", "change", "unchecked"):
        old.pop(key)
    (tmp_path / "results.jsonl").write_text(json.dumps(old) + "\n")
    (rec,) = read_records(tmp_path / "results.jsonl")
    assert rec.timing_mode == "interpreter" and rec.unchecked == [] and rec.cumulative_speedup is None
    assert re.match(r"1\.5000x \(", Row.from_record(rec).speedup)


def test_the_suite_summary_names_methods_and_explains_a_disagreement():
    from loop.suite.summary import method_notes, target_rows

    final = {"shape": "4096x16384", "dtype": "bfloat16", "method": "cuda_events_l2_flush", "best (ms)": "0.128000",
             "torch eager (ms)": "0.2", "torch.compile (ms)": "0.2", "best, fraction of clone bandwidth": "0.71"}
    e = {"op": "rmsnorm", "language": "triton", "final": [final], "final_largest": final, "largest_method": "cuda_graph",
         "largest_shape": {"flops": 1e8, "bytes": 3e8}, "largest_best": {"median_ms": 0.091, "frac_clone_bw": 1.0}}
    (note,) = method_notes([e])
    assert "0.128000 ms by eager calls after an L2 flush" in note and "0.091000 ms by CUDA-graph replay" in note
    assert "41% apart" in note and "launch and host-side cost" in note
    clone = target_rows([e])[0]
    assert clone["methods (measured / loop's)"] == ("eager calls after an L2 flush (CUDA events) / "
                                                    "CUDA-graph replay over rotating inputs")
    assert method_notes([dict(e, largest_best={"median_ms": 0.127})]) == []
