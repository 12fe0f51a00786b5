"""Commands that read a run back: status, history (from git alone), results, report, experience."""

from __future__ import annotations

import argparse
from pathlib import Path

from loop.backends import BACKENDS
from loop.cli.common import common, emit, record_summary, row_json, status_payload, status_text, uncut
from loop.common.errors import UserError
from loop.common.files import atomic_write_text
from loop.records import experience, gitops, history, report
from loop.records.perf_table import Row, decision_text, markdown_table, render_table
from loop.run import state as st
from loop.run.experiment import open_run
from loop.tools.final import measure_final


def add_run_reader(sp: argparse.ArgumentParser) -> None:
    """status, results: the run to read, and --json."""
    common(sp)


def add_history(sp: argparse.ArgumentParser) -> None:
    common(sp)
    sp.add_argument("--branch", help="rebuild from this run branch instead of the current run's")


def add_report(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--measure", action="store_true", help="measure the best version against torch eager and torch.compile (GPU)")
    common(sp)


def add_experience(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("action", choices=["list", "recommend", "stats"])
    sp.add_argument("--kernel-class", choices=["dot", "norm-like", "reduction", "element-wise"])
    sp.add_argument("--backend", choices=list(BACKENDS))
    sp.add_argument("--arch", help="e.g. sm_90")
    common(sp, run_opt=False)


def cmd_status(args, settings) -> int:
    exp = open_run(args.run, settings)
    p = status_payload(exp)
    emit(args, p, status_text(p, exp.state.mode))
    return 0


def cmd_history(args, settings) -> int:
    root = gitops.find_root(Path.cwd())
    if args.branch:
        branch = args.branch
        found = gitops.log_with_trailers(root, [branch])
        if not found:
            raise UserError(f"branch {branch!r} has no tileloop experiments")
        run_id = found[-1][2]["Tileloop-Run"]
    else:
        s = _run_state(root, args.run)
        branch, run_id = s.branch, s.run_id
    found = history.experiments(root, run_id, branch)
    rows = [history.row_from_trailers(sha, t) for sha, t in found]
    whole = [uncut(r, t.get("Tileloop-Hypothesis", ""), t.get("Tileloop-Decision", "")) for r, (_, t) in zip(rows, found)]
    emit(args, {"run": run_id, "branch": branch, "rows": [row_json(r) for r in whole]}, render_table(rows))
    return 0


def _run_state(root: Path, run_id: str | None) -> st.RunState:
    """The run's state in sandbox/; where there is none (a clone: sandbox/ is never committed), an error
    that says how to read a run from its branch, naming the run branches git has."""
    try:
        return st.load(root, st.current(root, run_id))
    except UserError as exc:
        if st.list_runs(root):
            raise
        heads = gitops.refs_under(root, "refs/heads/tileloop") | gitops.refs_under(root, "refs/remotes")
        names = [ref.split("/", 2)[2] for ref in heads if ref.startswith("refs/heads/tileloop/") or "/tileloop/" in ref]
        found = f" (run branches here: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})" if names else ""
        raise UserError(f"{exc.message}: sandbox/ is never committed, so a clone has none; a run's history is "
                        f"rebuilt from its branch: tileloop history --branch tileloop/<run>{found}",
                        hint="the reverted experiments live under refs/tileloop/<run>/; fetch them too with "
                             "git fetch origin 'refs/tileloop/*:refs/tileloop/*'") from None


def cmd_results(args, settings) -> int:
    exp = open_run(args.run, settings)
    recs = exp.records()
    emit(args, {"run": exp.state.run_id, "perf_results": str(exp.perf_path.relative_to(exp.root)),
                "rows": [row_json(uncut(Row.from_record(r), r.hypothesis, decision_text(r.decision))) for r in recs],
                "records": [record_summary(r) for r in recs]},
         exp.perf_path.read_text() if exp.perf_path.exists() else "(no results yet)")
    return 0


def cmd_report(args, settings) -> int:
    exp = open_run(args.run, settings)
    recs = exp.records()
    if not recs:
        raise UserError(f"run {exp.state.run_id} has no records yet")
    final = None
    if args.measure:
        if exp.state.device != "cuda":
            raise UserError("--measure needs a GPU run (this run used --device cpu)")
        final = measure_final(exp, settings)
    png = exp.dir / "latency.png"
    report.plot(recs, png, any(r.interpreter for r in recs))
    text = report.render(exp.state, recs, exp.root, final, png.name, exp.entry())
    path = exp.dir / "report.md"
    atomic_write_text(path, text)
    emit(args, {"run": exp.state.run_id, "report": str(path.relative_to(exp.root)), "plot": str(png.relative_to(exp.root)),
                "final": final}, text)
    return 0


def cmd_experience(args, settings) -> int:
    entries = experience.matching(experience.load(), args.kernel_class, args.backend, args.arch)
    if args.action == "list":
        rows = [{k: v for k, v in e.__dict__.items() if k != "schema"} for e in entries]
        emit(args, {"path": str(experience.path()), "entries": rows}, markdown_table(rows) if rows else "(no experience yet)")
    elif args.action == "stats":
        rows = experience.stats(entries)
        emit(args, {"path": str(experience.path()), "stats": rows}, markdown_table(rows) if rows else "(no experience yet)")
    else:
        if not (args.kernel_class and args.backend):
            raise UserError("experience recommend needs --kernel-class and --backend")
        rec = experience.recommend(experience.load(), args.kernel_class, args.backend, args.arch)
        emit(args, {"recommend": rec.rows, "lane": rec.lane, "rows_used": rec.used, "scope": rec.scope,
                    "left_out": rec.left_out},
             (markdown_table(rec.rows) if rec.rows else "(no experience for this kind of kernel yet)") + "\n" + rec.text())
    return 0


PARSERS = {"report": add_report, "experience": add_experience, "status": add_run_reader, "history": add_history,
           "results": add_run_reader}
COMMANDS = {"status": cmd_status, "history": cmd_history, "results": cmd_results, "report": cmd_report,
            "experience": cmd_experience}
