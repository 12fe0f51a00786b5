"""Trailers written on every experiment commit, and the history rebuilt from git alone."""

from __future__ import annotations

from pathlib import Path

from loop.records import gitops
from loop.records.perf_table import Row
from loop.records.results import Record, fmt_ms


def ref_prefix(run_id: str) -> str:
    return f"refs/tileloop/{run_id}/"


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
    if record.decision:
        t["Tileloop-Decision"] = f"{record.decision.get('verdict')}: {record.decision.get('reason', '')}"
    if record.recipe:
        t["Tileloop-Recipe"] = record.recipe
    t["Tileloop-Timing"] = "interpreter" if record.interpreter else "harness" if record.harness else "gpu"
    if record.harness:  # an external run: the commands that decided, as run settings
        t["Tileloop-Test-Cmd"] = record.harness["test_cmd"]
        t["Tileloop-Bench-Cmd"] = record.harness["bench_cmd"]
        t["Tileloop-Bench-Repeats"] = str(record.harness["bench_repeats"])
    return t


def commit_message(record: Record, pending: bool = False) -> str:
    subject = f"tileloop #{record.iteration}: {record.optimization}"
    body = []
    if record.hypothesis:
        body.append(f"Hypothesis: {record.hypothesis}")
    if record.rationale:
        body.append(f"Rationale: {record.rationale}")
    if record.expected:
        body.append(f"Expected: {record.expected}")
    if record.decision and not pending:
        body.append(f"Decision: {record.status} ({record.decision.get('verdict')}): {record.decision.get('reason', '')}")
    return gitops.format_message(subject, "\n".join(body), trailers_for(record, pending))


def row_from_trailers(t: dict[str, str]) -> Row:
    names = [n for n in t.get("Tileloop-Backends", "").split(",") if n]
    latency = t.get("Tileloop-Latency-Ms", "")
    return Row(int(t["Tileloop-Iteration"]), t.get("Tileloop-Optimization", ""), "" if latency == "n/a" else latency,
               t.get("Tileloop-Correctness", ""), t.get("Tileloop-Status", ""),
               tuple((n, t.get(trailer_key(n), "")) for n in names))


def experiments(root: Path, run_id: str, branch: str) -> list[tuple[str, dict[str, str]]]:
    """(sha, trailers) of every experiment commit of the run: the branch plus its rejected refs."""
    revs = [branch] + list(gitops.refs_under(root, ref_prefix(run_id).rstrip("/")).values())
    found = {}
    for sha, _parent, t in gitops.log_with_trailers(root, revs):
        if t.get("Tileloop-Run") == run_id and t.get("Tileloop-Status") != "pending":
            found[int(t["Tileloop-Iteration"])] = (sha, t)
    return [found[k] for k in sorted(found)]


def rows(root: Path, run_id: str, branch: str) -> list[Row]:
    return [row_from_trailers(t) for _sha, t in experiments(root, run_id, branch)]
