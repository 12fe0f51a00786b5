"""Trailers written on every experiment commit, and the history rebuilt from git alone: every column
of perf_results.md has a trailer (the commit and the ref from git itself), so `tileloop history`
rebuilds the same rows as the records do."""

from __future__ import annotations

from pathlib import Path

from loop.records import gitops
from loop.records.perf_table import DECISION_CHARS, HYPOTHESIS_CHARS, Row, decision_text, one_line, short, speedup_cell
from loop.records.results import Record, fmt_ms, ref_of


def ref_prefix(run_id: str) -> str:
    return ref_of(run_id, 0)[:-1]


def trailer_key(backend: str) -> str:
    return f"Tileloop-{backend.capitalize()}-Ms"


def trailers_for(record: Record, pending: bool = False) -> dict[str, str]:
    t = {
        "Tileloop-Run": record.run,
        "Tileloop-Iteration": str(record.iteration),
        "Tileloop-Optimization": record.optimization,
        "Tileloop-Status": "pending" if pending else record.status,
        "Tileloop-Correctness": record.correctness,
        "Tileloop-Latency-Ms": fmt_ms(record.latency_ms) or "n/a",
        "Tileloop-Target-Backend": record.target_backend,
        "Tileloop-Backends": ",".join(record.backends),
    }
    for name, b in record.backends.items():
        t[trailer_key(name)] = b.cell
    t["Tileloop-Speedup"] = f"{record.speedup:.4f}" if record.speedup is not None else "n/a"
    if record.lo is not None and record.hi is not None:
        t["Tileloop-Speedup-Interval"] = f"{record.lo:.4f}-{record.hi:.4f}"
    target = record.backends.get(record.target_backend)
    if target is not None and target.incumbent_ms is not None:
        t["Tileloop-Incumbent-Ms"] = fmt_ms(target.incumbent_ms)
    if record.cumulative_speedup is not None:
        t["Tileloop-Cumulative-Speedup"] = f"{record.cumulative_speedup:.4f}"
    if record.hypothesis:
        t["Tileloop-Hypothesis"] = one_line(record.hypothesis)
    if record.decision:
        t["Tileloop-Decision"] = decision_text(record.decision)
    if record.change and record.change.kinds:
        change = record.change.to_json()
        details = change["details"]
        t["Tileloop-Change"] = ",".join(change["kinds"]) + (f" ({','.join(details)})" if details else "")
    if record.unchecked:
        t["Tileloop-Unchecked"] = "; ".join(record.unchecked)
    if record.recipe:
        t["Tileloop-Recipe"] = record.recipe
    if record.sweep:  # every value the sweep tried, with its paired speedup in the sweep's measurement
        t["Tileloop-Sweep"] = sweep_text(record.sweep["values"])
        t["Tileloop-Sweep-Chosen"] = "none" if record.sweep.get("chosen") is None else str(record.sweep["chosen"])
    t["Tileloop-Timing"] = record.timing_mode
    if record.harness:  # an external run: the commands that decided, as run settings
        t["Tileloop-Test-Cmd"] = record.harness["test_cmd"]
        t["Tileloop-Bench-Cmd"] = record.harness["bench_cmd"]
        t["Tileloop-Bench-Repeats"] = str(record.harness["bench_repeats"])
    return t


def sweep_text(values: list[dict]) -> str:
    """A sweep's values as its trailer carries them: `512=1.4512x 1024=1.6203x 2048=incorrect`."""
    return " ".join(f"{v['value']}={v['speedup']:.4f}x" if v.get("status") == "ok" and v.get("speedup") is not None
                    else f"{v['value']}={v.get('status')}" for v in values)


def commit_message(record: Record, pending: bool = False) -> str:
    subject = f"tileloop #{record.iteration}: {record.optimization}"
    body = []
    if record.hypothesis:
        body.append(f"Hypothesis: {record.hypothesis}")
    if record.rationale:
        body.append(f"Rationale: {record.rationale}")
    if record.expected:
        body.append(f"Expected: {record.expected}")
    if record.sweep:
        body.append(f"Sweep: {record.sweep['variable']} from {record.sweep['from']} over "
                    f"{', '.join(str(v['value']) for v in record.sweep['values'])}: {record.sweep.get('reason', '')}")
    if record.decision and not pending:
        body.append(f"Decision: {record.status} ({record.verdict}): {record.decision.reason}")
    return gitops.format_message(subject, "\n".join(body), trailers_for(record, pending))


def row_from_trailers(sha: str, t: dict[str, str]) -> Row:
    """The perf_results.md row of an experiment commit, from its sha and trailers alone."""
    names = [n for n in t.get("Tileloop-Backends", "").split(",") if n]
    latency, speedup = t.get("Tileloop-Latency-Ms", ""), t.get("Tileloop-Speedup", "")
    status, n = t.get("Tileloop-Status", ""), int(t["Tileloop-Iteration"])
    cumulative = t.get("Tileloop-Cumulative-Speedup", "")
    return Row(n, t.get("Tileloop-Optimization", ""), "" if latency == "n/a" else latency,
               t.get("Tileloop-Correctness", ""), status, short(t.get("Tileloop-Hypothesis", ""), HYPOTHESIS_CHARS),
               short(t.get("Tileloop-Decision", ""), DECISION_CHARS),
               speedup_cell("" if speedup == "n/a" else speedup, t.get("Tileloop-Speedup-Interval", "")),
               t.get("Tileloop-Incumbent-Ms", ""), f"{cumulative}x" if cumulative and status == "keep" else "",
               sha[:10], ref_of(t.get("Tileloop-Run", ""), n) if status != "keep" else "",
               tuple((name, t.get(trailer_key(name), "")) for name in names))


def experiments(root: Path, run_id: str, branch: str) -> list[tuple[str, dict[str, str]]]:
    """(sha, trailers) of every experiment commit of the run: the branch plus its rejected refs."""
    revs = [branch] + list(gitops.refs_under(root, ref_prefix(run_id).rstrip("/")).values())
    found = {}
    for sha, _parent, t in gitops.log_with_trailers(root, revs):
        if t.get("Tileloop-Run") == run_id and t.get("Tileloop-Status") != "pending":
            found[int(t["Tileloop-Iteration"])] = (sha, t)
    return [found[k] for k in sorted(found)]


def rows(root: Path, run_id: str, branch: str) -> list[Row]:
    return [row_from_trailers(sha, t) for sha, t in experiments(root, run_id, branch)]
