"""What every command shares: argument types, the --json/--run options, the one JSON object a
command prints (schema `tileloop.cli/1`), and the summaries of a record and of a run's status."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import re
import tempfile
import traceback
from pathlib import Path

from loop import decide
from loop.records import gitops
from loop.records.perf_table import Row, one_line
from loop.records.results import Record
from loop.run import state as st
from loop.run.progress import latency_text

CLI_SCHEMA = "tileloop.cli/1"


def duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a duration like 900, 900s, 45m or 8h, got {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def arch_list(text: str) -> list[str]:
    if text.strip().lower() == "none":
        return []
    archs = [a.strip() for a in text.split(",") if a.strip()]
    for a in archs:
        if not re.fullmatch(r"sm_\d+a?", a):
            raise argparse.ArgumentTypeError(f"architectures look like sm_90,sm_100; got {a!r}")
    if not archs:
        raise argparse.ArgumentTypeError("give at least one architecture, or 'none'")
    return archs


def shape_arg(text: str) -> list[int]:
    dims = [d.strip() for d in re.split(r"[x,]", text.strip().lower())]
    if not dims or not all(d.isdigit() and int(d) > 0 for d in dims):
        raise argparse.ArgumentTypeError(f"a shape looks like 4096x8192 or 4096,8192 (positive integers), got {text!r}")
    return [int(d) for d in dims]


def common(sp: argparse.ArgumentParser, run_opt: bool = True) -> None:
    """--json on every command; --run on those that act on an existing run."""
    sp.add_argument("--json", action="store_true", help="print one JSON object (schema tileloop.cli/1) on stdout")
    if run_opt:
        sp.add_argument("--run", metavar="RUN_ID", help="run to act on (default: the latest run in this repository)")


def print_json(obj: dict) -> None:
    """The one place a JSON object reaches stdout (a command's output or the error object); the tests
    check each against its schema in loop/cli/schema/ here."""
    print(json.dumps(obj, indent=1, default=str))


def emit(args, payload: dict, text: str) -> None:
    """The command's output: one JSON object with --json, else the text. A command with actions
    (playbook, experience, suite) names the action too."""
    if args.json:
        action = {"action": args.action} if getattr(args, "action", None) else {}
        print_json({"schema": CLI_SCHEMA, "command": args.command, **action, **payload})
    else:
        print(text)


def policy_of(args) -> decide.Policy:
    return decide.Policy(max_iters=getattr(args, "max_iters", None) or 25, time_budget_s=getattr(args, "time_budget", None),
                         early_stop=not getattr(args, "no_early_stop", False))


def record_summary(rec: Record) -> dict:
    return {
        "iteration": rec.iteration, "optimization": rec.optimization, "hypothesis": rec.hypothesis,
        "rationale": rec.rationale, "expected": rec.expected, "kind": rec.kind,
        "status": rec.status, "correctness": rec.correctness, "latency_ms": rec.latency_ms, "speedup": rec.speedup,
        "cumulative_speedup": rec.cumulative_speedup, "timing": rec.timing_mode, "change": rec.change.to_json() if rec.change else {},
        "unchecked": rec.unchecked, "commit": rec.commit, "key": rec.recipe, "decision": rec.decision.to_json() if rec.decision else {},
        "failure": rec.failure.to_json() if rec.failure else None,
        "backends": {k: {"available": v.available, "status": v.status, "latency_ms": v.latency_ms,
                         "incumbent_ms": v.incumbent_ms, "reason": v.reason, "timing": v.timing_label,
                         "shapes": v.shapes} for k, v in rec.backends.items()},
        **({"sweep": rec.sweep} if rec.sweep else {}),  # only an experiment a sweep chose
    }


def row_json(r: Row) -> dict:
    """A perf_results.md row: latencies as numbers (null where the table's cell is empty), the other
    cells (speedups with their interval, the decision, the backends) as the table shows them."""
    def number(cell: str) -> float | None:
        return float(cell) if cell else None

    return {**r.to_json(), "latency_ms": number(r.latency_ms), "incumbent_ms": number(r.incumbent_ms)}


def uncut(row: Row, hypothesis: str, decision: str) -> Row:
    """`row` with its hypothesis and decision whole (on one line): the table shortens them to fit its
    columns, JSON never cuts."""
    return dataclasses.replace(row, hypothesis=one_line(hypothesis), decision=one_line(decision))


def status_payload(exp) -> dict:
    """Where a run stands (init, status, run, resume, demo)."""
    s = exp.state
    kernel_class, reasons = classify(exp)
    return {"run": s.run_id, "branch": s.branch, "target": s.target, "device": s.device,
            "target_backend": s.target_backend, "backends": s.availability, "best_commit": s.best_commit,
            "best_latency_ms": s.best_latency_ms, "iterations": max(s.last_iteration, 0),
            "outcomes": s.outcomes, "inflight": s.inflight.to_json() if s.inflight else None, "stopped": s.stopped,
            "stop": exp.stop_state().to_json(), "perf_results": str(exp.perf_path.relative_to(exp.root)),
            "timings": "harness" if s.harness else "interpreter" if s.device == "cpu" else "gpu", "archs": s.archs,
            "skip_recipes": s.skip_recipes, "harness": s.harness, "kernel_class": kernel_class,
            "kernel_class_reasons": reasons, "runs": st.list_runs(exp.root), "hazards": hazards(exp)}


def hazards(exp) -> list[dict]:
    """The Tile IR hazards of the target as it is now; none while an edit in progress does not parse."""
    from playbook.hazards import scan  # the source analysis (libcst) only where a status is printed, not in every command

    try:
        return [h.to_json() for h in scan((exp.root / exp.state.target).read_text(), exp.state.language)]
    except SyntaxError:
        return []


def classify(exp) -> tuple[str | None, list[str]]:
    """The kernel class of the run's best version (the working tree's target before a baseline) and
    why, as the playbook classifies it; (None, [why not]) when it does not parse."""
    from playbook.analysis import analyze  # as in hazards: imported where a status is printed

    s = exp.state
    source = (gitops.show_file(exp.root, s.best_commit, s.target) if s.best_commit
              else (exp.root / s.target).read_text())
    try:
        an = analyze(source, entry=exp.entry())
    except SyntaxError as exc:
        return None, [f"{s.target} does not parse: {exc.msg} (line {exc.lineno})"]
    return an.kernel_class, an.reasons()


def stop_line(stop: dict, run_id: str, mode: str) -> str:
    """Where the stop rules stand, in one line: why the run stopped, or, when no rule fires, how it goes on."""
    if stop["state"] != "continue":
        return f"stopped: {stop['state']}: {stop['reason']}"
    how = f"tileloop resume --run {run_id}" if mode == "run" else "an edit of the target, then tileloop step"
    return f"not stopped: no stop rule fires yet; {how} goes on"


def status_text(p: dict, mode: str) -> str:
    """`tileloop status` for a person: one line per fact, no Python dicts."""
    backends = "; ".join(name if b.get("available") else f"{name} unavailable ({b.get('reason') or 'no reason given'})"
                         for name, b in p["backends"].items())
    counts = {o: p["outcomes"].count(o) for o in dict.fromkeys(p["outcomes"])}
    inflight = p["inflight"]
    lines = [f"run: {p['run']} on branch {p['branch']}" + (f" (runs here: {', '.join(p['runs'])})" if len(p["runs"]) > 1 else ""),
             f"target: {p['target']} (kernel class: {p['kernel_class'] or 'unknown'}"
             + (f"; {'; '.join(p['kernel_class_reasons'])})" if p["kernel_class_reasons"] else ")"),
             f"device: {p['device']}; timings: {p['timings']}; target backend: {p['target_backend']}; backends: {backends}",
             "architectures compiled for: " + (", ".join(p["archs"]) or "none"),
             "best: " + (f"{p['best_commit'][:12]} at {latency_text(p['best_latency_ms'])}" if p["best_latency_ms"] is not None
                         else f"{p['best_commit'][:12]} (not timed)" if p["best_commit"] else "no baseline yet"),
             f"iterations: {p['iterations']}" + (" (" + ", ".join(f"{n} {o}" for o, n in counts.items()) + ")" if counts else ""),
             "in flight: " + (f"iteration {inflight.get('iteration')} at stage {inflight.get('stage')}: {inflight.get('optimization', '')}"
                              if inflight else "nothing"),
             stop_line(p["stop"], p["run"], mode)]
    if p["skip_recipes"]:
        lines.append("recipes skipped: " + ", ".join(p["skip_recipes"]))
    if p["harness"]:
        lines.append("harness: " + "; ".join(f"{k}: {v}" for k, v in p["harness"].items()))
    lines += [f"hazard: line {h['line']}: {h['message']} ({h['severity']}, {h['code']})" for h in p["hazards"]]
    lines.append(f"perf_results: {p['perf_results']}")
    return "\n".join(lines)


def finish_run(args, exp, stop, **extra) -> int:
    """What `run`, `resume` and `demo` print when the loop stops: the status, the stop and every record."""
    recs = exp.records()
    emit(args, {**status_payload(exp), "stop": stop.to_json(), **extra, "records": [record_summary(r) for r in recs]},
         exp.perf_path.read_text() + "\n" + stop_line(stop.to_json(), exp.state.run_id, exp.state.mode))
    return 0


def write_traceback(exc: BaseException, args) -> Path:
    """The traceback of a failure, appended to the current run's errors.log (sandbox/<run>/), or, outside
    a run, to a file of its own in the temporary folder; returns the file."""
    try:
        root = gitops.find_root(Path.cwd())
        path = st.run_dir(root, st.current(root, getattr(args, "run", None))) / "errors.log"
    except Exception:  # noqa: BLE001 - no run to hold the log: any failure here means there is none
        path = Path(tempfile.gettempdir()) / "tileloop-errors" / f"{dt.datetime.now():%Y%m%d-%H%M%S-%f}-{args.command}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(f"[{dt.datetime.now().isoformat(timespec='seconds')}] tileloop {args.command}\n")
        fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + "\n")
    return path
