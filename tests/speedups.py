"""Every speedup a run publishes, recomputed from its results.jsonl: each iteration's from the
per-shape paired comparisons its decision kept (their geometric mean and interval, as decide.combine
makes them), the cumulative one as the product of the kept iterations' paired speedups. Shared by
the table tests (synthetic records) and the end-to-end runs (real ones)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from loop.decide import Policy, ShapeComparison, combine
from loop.records.results import Record, read_records


def paired(record: Record) -> tuple[float, float, float] | None:
    """(speedup, lo, hi) of an iteration from its decision's per-shape comparisons, or None when it
    was not decided on timing (crash, incorrect, unmeasured, the baseline)."""
    shapes = record.decision.shapes if record.decision else []
    if not shapes:
        return None
    comps = [ShapeComparison(tuple(s["shape"]), s["speedup"], s["lo"], s["hi"], s["log_effect"], s["log_se"], s["n"])
             for s in shapes]
    return combine(comps, Policy())  # the runs checked here use the default policy


def recomputed(records: list[Record]) -> dict[int, dict]:
    """Per iteration: its paired speedup and interval (or None), and the cumulative speedup after it."""
    out, running = {}, 1.0
    for r in records:
        p = paired(r)
        if r.iteration >= 1 and r.status == "keep":
            assert p is not None, f"iteration {r.iteration} was kept without a paired measurement"
            running *= p[0]
        out[r.iteration] = {"paired": p, "cumulative": running}
    return out


def table_rows(text: str) -> list[dict]:
    """The rows of the first markdown table of `text`, as dicts of stripped cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(cols, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def check_perf_results(text: str, records: list[Record]) -> int:
    """Every speedup cell of perf_results.md equals its recomputation; returns how many were checked."""
    want, checked = recomputed(records), 0
    for row in table_rows(text):
        n = int(row["iteration"])
        p = want[n]["paired"]
        assert row["speedup_vs_incumbent"] == (f"{p[0]:.4f}x ({p[1]:.4f}-{p[2]:.4f})" if p else ""), row
        if row["status"] == "keep":
            assert row["cumulative_speedup"] == f"{want[n]['cumulative']:.4f}x", row
            checked += 1
        checked += bool(p)
    return checked


def check_report(text: str, records: list[Record]) -> int:
    """Every `<number>x` in report.md is one of the recomputed speedups, interval ends or cumulative
    products (to the digits shown); returns how many were checked."""
    want = recomputed(records)
    values = []
    for w in want.values():
        values.append(w["cumulative"])
        if w["paired"]:
            values += list(w["paired"])
    found = re.findall(r"(?<![\w.])(\d+\.\d+)x\b", text)
    for number in found:
        digits = len(number.split(".")[1])
        assert any(math.isclose(float(number), round(v, digits), abs_tol=10 ** -digits / 2 + 1e-12) for v in values), \
            f"report.md publishes {number}x, which no paired measurement of results.jsonl gives"
    return len(found)


def check_records_json(payload_records: list[dict], records: list[Record]) -> None:
    """The speedups of a command's JSON record summaries equal their recomputation."""
    want = recomputed(records)
    for rec in payload_records:
        p, n = want[rec["iteration"]]["paired"], rec["iteration"]
        assert (rec["speedup"] is None) == (p is None or records[n].status == "unmeasured")
        if rec["speedup"] is not None:
            assert math.isclose(rec["speedup"], p[0], rel_tol=1e-9)
        assert math.isclose(rec["cumulative_speedup"], want[n]["cumulative"], rel_tol=1e-9)


def check_run(run_dir: Path) -> int:
    """Every speedup of a run's perf_results.md and report.md (when written), from its results.jsonl."""
    records = read_records(run_dir / "results.jsonl")
    n = check_perf_results((run_dir / "perf_results.md").read_text(), records)
    if (run_dir / "report.md").exists():
        n += check_report((run_dir / "report.md").read_text(), records)
    return n
