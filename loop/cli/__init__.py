"""Command line: `tileloop <command>`; `main(argv) -> int` so tests call it directly.

Every command takes --json and then prints exactly one JSON object on stdout (schema
`tileloop.cli/1`); progress goes to stderr. A user error is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from loop import __version__, decide
from loop.records import gitops, history
from loop.common import settings as settings_mod
from loop.run import state as st
from loop.common.errors import UserError
from loop.records.results import Row, markdown_table, render_table

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tileloop",
        description="Tune one GPU kernel by disciplined experiment: one change per iteration, committed on a git "
                    "branch, checked for correctness, timed against the current best, kept or reverted by explicit rules.")
    p.add_argument("--version", action="version", version=f"tileloop {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp, run_opt=True):
        sp.add_argument("--json", action="store_true", help="print one JSON object (schema tileloop.cli/1) on stdout")
        if run_opt:
            sp.add_argument("--run", metavar="RUN_ID", help="run to act on (default: the latest run in this repository)")

    def start_opts(sp):
        sp.add_argument("target", help="the kernel file to tune (spec.py must sit beside it)")
        sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (default) or cpu: run under the Triton interpreter; its timings are interpreter timings")
        sp.add_argument("--branch", help="branch to create (default tileloop/<op>-<yyyymmdd-hhmm>)")
        sp.add_argument("--target-backend", choices=["ptx", "tileir", "cutile", "interpreter"],
                        help="backend whose latency decides (default: tileir if available, else ptx; cutile for cuTile)")
        sp.add_argument("--seed", type=int, default=0, help="base seed for the fresh random inputs of every check")
        sp.add_argument("--time-budget", type=duration, help="stop after this much iteration time (e.g. 45m, 8h)")
        sp.add_argument("--iteration-timeout", type=duration, default=None,
                        help="hard limit per worker process of an iteration (compile, each backend); default 10m")
        sp.add_argument("--archs", type=arch_list, default=None,
                        help="architectures every candidate must compile for before it is measured "
                             "(default sm_90,sm_100; 'none' turns the gate off)")
        sp.add_argument("--skip-recipe", metavar="ID", action="append", default=[],
                        help="never propose this playbook recipe in this run (repeatable; e.g. triton-autotune to keep "
                             "fixed launch configs); `tileloop playbook list` names them")
        sp.add_argument("--test-cmd", metavar="CMD",
                        help="external harness: a shell command run in the repository root; exit 0 = correct "
                             "(with --bench-cmd, replaces spec.py and the worker; see docs/harness.md)")
        sp.add_argument("--bench-cmd", metavar="CMD",
                        help="external harness: a shell command that emits performance records, printed one per line "
                             "or in pytest junitxml written to {junitxml}")
        sp.add_argument("--bench-repeats", type=positive_int, default=None,
                        help="external harness: rounds of the bench command per measurement, incumbent and candidate "
                             "interleaved (default 3, at least 2)")

    sp = sub.add_parser("init", help="create the run branch and measure the baseline (iteration 0)")
    start_opts(sp)
    common(sp, run_opt=False)

    sp = sub.add_parser("step", help="commit the working-tree edit of the target and evaluate it (agent mode)")
    sp.add_argument("--optimization", "-m", required=True, help="what this change is, one line")
    sp.add_argument("--hypothesis", default="", help="what should move, and by how much")
    sp.add_argument("--rationale", default="", help="why: the evidence (profile, roofline, earlier results)")
    sp.add_argument("--expected", default="", help="the expected outcome, e.g. '1.2-1.5x on the wide shapes'")
    sp.add_argument("--allow-unchanged", action="store_true", help="evaluate an unchanged target (an A/A check)")
    common(sp)

    sp = sub.add_parser("run", help="unattended: init, then one playbook candidate per iteration until a stop rule fires")
    start_opts(sp)
    sp.add_argument("--max-iters", type=positive_int, default=25, help="experiments after the baseline (default 25)")
    sp.add_argument("--no-early-stop", action="store_true",
                    help="overnight exploration: do not stop after two non-improvements or a sub-2%% gain; only "
                         "--max-iters, --time-budget, an exhausted playbook or an escalation stop the run")
    common(sp, run_opt=False)

    sp = sub.add_parser("resume", help="repair an interrupted iteration and, for unattended runs, continue the loop")
    sp.add_argument("--max-iters", type=positive_int, help="raise the run's iteration limit")
    sp.add_argument("--no-continue", action="store_true", help="only repair; do not continue the loop")
    common(sp)

    sp = sub.add_parser("doctor", help="GPU, driver, CUDA, torch, triton, nvtriton, cuda-tile, tileiras, ncu; per-backend availability")
    common(sp, run_opt=False)

    sp = sub.add_parser("compile", help="compile a target ahead of time for GPUs that are not here (no GPU needed)")
    sp.add_argument("target", help="the kernel file (spec.py beside it gives the example inputs)")
    sp.add_argument("--arch", type=arch_list, default=["sm_90", "sm_100"], help="comma-separated, default sm_90,sm_100")
    common(sp, run_opt=False)

    sp = sub.add_parser("profile", help="Nsight Compute metrics of one shape and dtype, and the bottleneck class they imply")
    sp.add_argument("target", help="the kernel file (spec.py beside it)")
    sp.add_argument("--shape", type=shape_arg, help="e.g. 4096x8192 (default: the spec's largest benchmark shape)")
    sp.add_argument("--dtype", choices=["float16", "bfloat16", "float32", "float64"], help="default: the spec's first dtype")
    sp.add_argument("--backend", choices=["ptx", "tileir", "cutile"],
                    help="default: tileir if available, else ptx; cutile for cuTile targets")
    sp.add_argument("--launches", type=positive_int, default=3, help="kernel launches profiled (default 3; the median is kept)")
    sp.add_argument("--kernel", action="append", metavar="NAME",
                    help="kernel to profile (repeatable; default: the target's @triton.jit / @ct.kernel functions)")
    sp.add_argument("--ncu", metavar="PATH", help="the ncu executable (default: ncu on PATH)")
    common(sp)

    sp = sub.add_parser("compare", help="every implementation of an op, in every backend, against torch eager and torch.compile")
    sp.add_argument("op_dir", help="kernels/<op>: a folder with spec.py and <op>_triton.py / <op>_cutile.py")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: Triton interpreter timings only")
    sp.add_argument("--out", type=Path, help="also write the markdown table to this file")
    sp.add_argument("--full-check", action="store_true", help="also check every dtype at the full benchmark shapes")
    common(sp, run_opt=False)

    sp = sub.add_parser("demo", help="copy an included kernel into a fresh git repository and run the loop there")
    sp.add_argument("--op", choices=["vector_add", "softmax"], default="vector_add", help="which included kernel")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu runs under the Triton interpreter")
    sp.add_argument("--max-iters", type=positive_int, default=3, help="experiments after the baseline (default 3)")
    sp.add_argument("--dir", type=Path, help="where to make the demo repository (default: a new temporary folder)")
    common(sp, run_opt=False)

    sp = sub.add_parser("report", help="sandbox/<run>/report.md and latency.png: path, backends, roofline, PyTorch")
    sp.add_argument("--measure", action="store_true", help="measure the best version against torch eager and torch.compile (GPU)")
    common(sp)

    sp = sub.add_parser("experience", help="what worked before, across runs: list | recommend | stats")
    sp.add_argument("action", choices=["list", "recommend", "stats"])
    sp.add_argument("--kernel-class", choices=["dot", "norm-like", "reduction", "element-wise"])
    sp.add_argument("--backend", choices=["ptx", "tileir", "cutile", "interpreter"])
    sp.add_argument("--arch", help="e.g. sm_90")
    common(sp, run_opt=False)

    sp = sub.add_parser("playbook", help="the recipes: list | show <id> | apply <id> <target> --dry-run")
    sp.add_argument("action", choices=["list", "show", "apply"])
    sp.add_argument("recipe", nargs="?", help="recipe id (show, apply)")
    sp.add_argument("target", nargs="?", help="kernel file (apply)")
    sp.add_argument("--dry-run", action="store_true", help="apply: print the diff of each candidate, change nothing")
    common(sp, run_opt=False)

    sp = sub.add_parser("suite", help="tune many targets unattended, one after another (run), or summarise such runs (summarize)")
    sp.add_argument("action", choices=["run", "summarize"])
    sp.add_argument("paths", nargs="+", help="run: target files; summarize: suite output folders or entry files")
    sp.add_argument("--out-dir", default="sandbox/suite", help="run: where entries, reports and plots go (default sandbox/suite)")
    sp.add_argument("--per-run", type=duration, help="run: wall-clock limit per target (the run is then repaired and marked cut off)")
    sp.add_argument("--archs", type=arch_list, default=None, help="run: ahead-of-time compile gate architectures passed to each run")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="run: passed to each run (cpu: interpreter timings)")
    sp.add_argument("--gpus", type=lambda t: [g.strip() for g in t.split(",") if g.strip()],
                    help="run: device ids, e.g. 0,1,2,3: one target per GPU at a time, each GPU in its own git worktree "
                         "under sandbox/suite-worktrees/ (with CUDA_VISIBLE_DEVICES set)")
    sp.add_argument("--max-iters", type=positive_int, help="run: passed to each run (default: tileloop run's default)")
    sp.add_argument("--resume", action="store_true",
                    help="run: continue a suite that was stopped: a target whose run exists goes on with tileloop resume "
                         "(on the GPU whose worktree holds it), a finished one keeps its entry (measured again only if the entry "
                         "lacks its final measurement), the others start")
    sp.add_argument("--restart", action="append", metavar="TARGET", default=[],
                    help="run, with --resume: forget this target's run (branch, records, entry) so it starts anew, "
                         "e.g. after its playbook changed; repeatable")
    sp.add_argument("--out", help="summarize: write the markdown here (default: print it)")
    sp.add_argument("--title", default="tileloop suite results", help="summarize: the document title")
    common(sp, run_opt=False)

    from loop.tools.decision_check import parse_scenarios, parse_shape, plant_fraction

    sp = sub.add_parser("decision-check", help="measure the keep/revert decision itself: A/A false keeps and the "
                                               "detection of a planted slowdown or speedup, in one worker")
    sp.add_argument("target", help="the kernel file (spec.py beside it)")
    sp.add_argument("--trials", type=positive_int, default=100, help="trials per scenario (default 100)")
    sp.add_argument("--plant", type=plant_fraction, help="plant real extra work worth this fraction of the kernel's "
                                                         "time (e.g. 0.03) and add the slowdown and speedup scenarios")
    sp.add_argument("--scenarios", type=parse_scenarios,
                    help="comma-separated subset of aa,slowdown,speedup (default: aa; all three with --plant)")
    sp.add_argument("--shapes", type=parse_shape, nargs="+", metavar="SHAPE",
                    help="e.g. 1048576 or 4096x4096x4096 (default: the smallest and largest shape an iteration times)")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: Triton interpreter timings")
    sp.add_argument("--target-backend", choices=["ptx", "tileir", "cutile", "interpreter"],
                    help="backend to time (default: as tileloop init chooses)")
    sp.add_argument("--dtype", help="benchmark dtype (default: the one an iteration times, the spec's first)")
    sp.add_argument("--seed", type=int, default=0, help="base seed for the fresh inputs of every trial")
    sp.add_argument("--timeout", type=duration, help="limit for the worker (default: estimated from the trials)")
    sp.add_argument("--out", type=Path, help="also write the markdown report to this file")
    common(sp, run_opt=False)

    for name, text in (("status", "where the run stands: best, iterations, stop state"),
                       ("history", "the run's experiments rebuilt from git alone (trailers)"),
                       ("results", "perf_results.md (or the records, with --json)")):
        sp = sub.add_parser(name, help=text)
        common(sp)
        if name == "history":
            sp.add_argument("--branch", help="rebuild from this run branch instead of the current run's")
    return p


def _emit(args, payload: dict, text: str) -> None:
    if args.json:
        print(json.dumps({"schema": CLI_SCHEMA, "command": args.command, **payload}, indent=1, default=str))
    else:
        print(text)


def _policy(args) -> decide.Policy:
    return decide.Policy(max_iters=getattr(args, "max_iters", None) or 25, time_budget_s=getattr(args, "time_budget", None),
                         early_stop=not getattr(args, "no_early_stop", False))


def _record_summary(rec) -> dict:
    return {
        "iteration": rec.iteration, "optimization": rec.optimization, "hypothesis": rec.hypothesis,
        "rationale": rec.rationale, "expected": rec.expected, "kind": rec.kind,
        "status": rec.status, "correctness": rec.correctness, "latency_ms": rec.latency_ms, "speedup": rec.speedup,
        "commit": rec.commit, "decision": rec.decision, "failure": rec.failure,
        "backends": {k: {"available": v.available, "status": v.status, "latency_ms": v.latency_ms,
                         "incumbent_ms": v.incumbent_ms, "reason": v.reason, "timing": v.timing_label,
                         "shapes": v.shapes} for k, v in rec.backends.items()},
    }


def _status_payload(exp) -> dict:
    from playbook.hazards import scan

    s = exp.state
    return {"run": s.run_id, "branch": s.branch, "target": s.target, "device": s.device,
            "target_backend": s.target_backend, "backends": s.availability, "best_commit": s.best_commit,
            "best_latency_ms": s.best_latency_ms, "iterations": max(s.last_iteration, 0),
            "outcomes": s.outcomes, "inflight": s.inflight, "stopped": s.stopped,
            "stop": exp.stop_state().to_json(), "perf_results": str(exp.perf_path.relative_to(exp.root)),
            "timings": "harness" if s.harness else "interpreter" if s.device == "cpu" else "gpu", "archs": s.archs, "skip_recipes": s.skip_recipes,
            "harness": s.harness,
            "hazards": [h.to_json() for h in scan((exp.root / s.target).read_text(), s.language)]}


def _harness(args):
    from loop.measure import external

    return external.from_options(args.test_cmd, args.bench_cmd, args.bench_repeats)


def cmd_init(args, settings) -> int:
    from loop.run.experiment import init_run

    exp = init_run(args.target, device=args.device, branch=args.branch, target_backend=args.target_backend,
                   seed=args.seed, policy=_policy(args), settings=settings, archs=args.archs,
                   worker_timeout_s=args.iteration_timeout, harness=_harness(args), skip_recipes=args.skip_recipe)
    rec = exp.records()[0]
    label = " (Triton interpreter timing, not a GPU number)" if rec.interpreter else ""
    _emit(args, {**_status_payload(exp), "baseline": _record_summary(rec)},
          f"run {exp.state.run_id} on branch {exp.state.branch}: baseline {rec.latency_ms:.6f} ms{label}\n"
          f"next: edit {exp.state.target}, then tileloop step --optimization '...' --hypothesis '...'")
    return 0


def cmd_step(args, settings) -> int:
    from loop.run.experiment import open_run

    exp = open_run(args.run, settings)
    rec, stop = exp.evaluate(args.optimization, args.hypothesis, allow_unchanged=args.allow_unchanged,
                             rationale=args.rationale, expected=args.expected)
    payload = {**_record_summary(rec), "run": exp.state.run_id, "stop": stop.to_json(),
               "noise_band": {"lo": rec.decision.get("lo"), "hi": rec.decision.get("hi"),
                              "per_shape": rec.decision.get("shapes", [])},
               "best_commit": exp.state.best_commit, "best_latency_ms": exp.state.best_latency_ms,
               "suggestions": exp.suggestions()}
    band = rec.decision.get("lo"), rec.decision.get("hi")
    text = (f"#{rec.iteration} {rec.optimization}: {rec.status} ({rec.decision.get('verdict')}) {rec.decision.get('reason', '')}\n"
            f"noise band: {band[0]}-{band[1]}; stop state: {stop.state} {stop.reason}")
    _emit(args, payload, text)
    return 0


def cmd_run(args, settings) -> int:
    from loop.run.experiment import init_run

    exp = init_run(args.target, device=args.device, branch=args.branch, target_backend=args.target_backend,
                   seed=args.seed, policy=_policy(args), settings=settings, archs=args.archs,
                   worker_timeout_s=args.iteration_timeout, harness=_harness(args), skip_recipes=args.skip_recipe,
                   mode="run")
    stop = exp.run_loop()
    return _finish_run(args, exp, stop)


def _finish_run(args, exp, stop) -> int:
    recs = exp.records()
    _emit(args, {**_status_payload(exp), "stop": stop.to_json(), "records": [_record_summary(r) for r in recs]},
          exp.perf_path.read_text() + f"\nstopped: {stop.state}: {stop.reason}")
    return 0


def cmd_resume(args, settings) -> int:
    from loop.run.experiment import open_run, probe_environment

    exp = open_run(args.run, settings)
    exp.check_environment(probe_environment(exp.root, settings))
    repaired = exp.repair()
    if args.max_iters:
        exp.state.policy["max_iters"] = args.max_iters
        exp.policy = decide.Policy(**exp.state.policy)
    exp.state.stopped = None
    exp.save()
    exp.render()  # perf_results.md from the records: a kill can land between a record and its rendering
    if exp.state.mode == "run" and not args.no_continue:
        stop = exp.run_loop()
    else:
        stop = exp.stop_state()
    if repaired is not None:
        exp.log(f"repaired iteration {repaired.iteration}: {repaired.status}")
    return _finish_run(args, exp, stop)


def cmd_status(args, settings) -> int:
    from loop.run.experiment import open_run

    exp = open_run(args.run, settings)
    p = _status_payload(exp)
    text = "\n".join(f"{k}: {v}" for k, v in p.items() if k != "backends")
    _emit(args, {**p, "runs": st.list_runs(exp.root)}, text)
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
        s = st.load(root, st.current(root, args.run))
        branch, run_id = s.branch, s.run_id
    rows = history.rows(root, run_id, branch)
    _emit(args, {"run": run_id, "branch": branch, "rows": [_row_json(r) for r in rows]}, render_table(rows))
    return 0


def _row_json(r: Row) -> dict:
    return {"iteration": r.iteration, "optimization": r.optimization, "latency_ms": r.latency_ms,
            "correctness": r.correctness, "status": r.status, "backends": dict(r.backends)}


def cmd_results(args, settings) -> int:
    from loop.run.experiment import open_run

    exp = open_run(args.run, settings)
    recs = exp.records()
    _emit(args, {"run": exp.state.run_id, "perf_results": str(exp.perf_path.relative_to(exp.root)),
                 "rows": [_row_json(Row.from_record(r)) for r in recs], "records": [_record_summary(r) for r in recs]},
          exp.perf_path.read_text() if exp.perf_path.exists() else "(no results yet)")
    return 0


def cmd_demo(args, settings) -> int:
    import os
    import shutil
    import subprocess
    import tempfile

    from loop.common.files import SOURCE_ROOT
    from loop.run.experiment import init_run

    source = SOURCE_ROOT / "kernels" / args.op
    if not source.is_dir():
        raise UserError(f"the demo kernel {source} is missing", hint="run the demo from a tileloop source checkout")
    where = args.dir or Path(tempfile.mkdtemp(prefix="tileloop-demo-"))
    if where.exists() and any(where.iterdir()):
        raise UserError(f"demo folder {where} is not empty")
    shutil.copytree(source, where / "kernels" / args.op)
    env = {**os.environ, **gitops.FALLBACK_IDENTITY}
    for cmd in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-q", "-m", f"{args.op}: first version"]):
        subprocess.run(cmd, cwd=where, check=True, env=env)
    print(f"demo repository: {where}", file=sys.stderr)
    os.chdir(where)
    exp = init_run(f"kernels/{args.op}/{args.op}_triton.py", device=args.device, branch=None, target_backend=None, seed=0,
                   policy=decide.Policy(max_iters=args.max_iters), settings=settings, mode="run")
    stop = exp.run_loop()
    return _finish_run(args, exp, stop)


def cmd_doctor(args, settings) -> int:
    import tempfile

    from loop.tools import doctor
    from loop.run.experiment import probe_environment

    rep = doctor.report(probe_environment(Path(tempfile.gettempdir()), settings))
    _emit(args, rep, doctor.render(rep))
    return 0


def cmd_compile(args, settings) -> int:
    import tempfile

    from loop.target.contract import load_kernel, spec_dtypes
    from loop.measure.evaluate import compile_gate, compile_summary
    from playbook.hazards import scan

    target = Path(args.target).resolve()
    try:
        root = gitops.find_root(target.parent)
    except UserError:
        root = target.parent
    kernel = load_kernel(target, root)
    hazards = scan(kernel.target_abs.read_text(), kernel.language)
    with tempfile.TemporaryDirectory(prefix="tileloop-compile-") as tmp:
        raw = compile_gate(workdir=Path(tmp), spec_path=kernel.spec_abs, target_dir=kernel.target_abs.parent,
                           target=kernel.target_abs, language=kernel.language, archs=args.arch, settings=settings,
                           cache_root=Path(tmp), dtypes=spec_dtypes(kernel.spec_abs))
    rows = compile_summary(raw)
    ok = raw["status"] == "ok"
    from loop.records.results import markdown_table

    text = markdown_table(rows) + "\n" + "\n".join(str(h) for h in hazards)
    text += f"\n{'ok' if ok else 'FAILED'}: {kernel.target} ({kernel.language}) for {', '.join(args.arch)}"
    if not ok:
        text += f"\n{raw.get('message', '')}"
    _emit(args, {"target": str(kernel.target), "language": kernel.language, "archs": args.arch, "ok": ok,
                 "status": raw["status"], "message": raw.get("message"), "kernels": rows,
                 "hazards": [h.to_json() for h in hazards]}, text)
    return 0 if ok else 1


def cmd_compare(args, settings) -> int:
    import tempfile

    from loop.tools import compare
    from loop.run.experiment import probe_environment

    op_dir = Path(args.op_dir).resolve()
    if not op_dir.is_dir():
        raise UserError(f"{args.op_dir} is not a folder")
    try:
        root = gitops.find_root(op_dir)
    except UserError:
        root = op_dir.parent
    probe = probe_environment(root, settings)
    if args.device == "cuda" and not probe.get("cuda_available"):
        raise UserError(f"no GPU available: {probe.get('cuda_reason')}", hint="pass --device cpu")
    with tempfile.TemporaryDirectory(prefix="tileloop-compare-") as tmp:
        result = compare.run_compare(op_dir, root, probe, args.device, settings, Path(tmp),
                                     log=lambda m: print(m, file=sys.stderr), full_check=args.full_check)
    text = compare.render(result)
    if args.out:
        from loop.common.files import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    _emit(args, result, text)
    return 0


def cmd_report(args, settings) -> int:
    from loop.records import report
    from loop.run.experiment import open_run
    from loop.common.files import atomic_write_text

    exp = open_run(args.run, settings)
    recs = exp.records()
    if not recs:
        raise UserError(f"run {exp.state.run_id} has no records yet")
    final = None
    if args.measure:
        if exp.state.device != "cuda":
            raise UserError("--measure needs a GPU run (this run used --device cpu)")
        final = report.measure_final(exp, settings)
    png = exp.dir / "latency.png"
    report.plot(recs, png, any(r.interpreter for r in recs))
    text = report.render(exp.state, recs, exp.root, final, png.name)
    path = exp.dir / "report.md"
    atomic_write_text(path, text)
    _emit(args, {"run": exp.state.run_id, "report": str(path.relative_to(exp.root)), "plot": str(png.relative_to(exp.root)),
                 "final": final}, text)
    return 0


def cmd_experience(args, settings) -> int:
    from loop.records import experience

    entries = experience.matching(experience.load(), args.kernel_class, args.backend, args.arch)
    if args.action == "list":
        rows = [{k: v for k, v in e.__dict__.items() if k != "schema"} for e in entries]
        _emit(args, {"path": str(experience.path()), "entries": rows}, markdown_table(rows) if rows else "(no experience yet)")
    elif args.action == "stats":
        rows = experience.stats(entries)
        _emit(args, {"path": str(experience.path()), "stats": rows}, markdown_table(rows) if rows else "(no experience yet)")
    else:
        if not (args.kernel_class and args.backend):
            raise UserError("experience recommend needs --kernel-class and --backend")
        rows = experience.recommend(experience.load(), args.kernel_class, args.backend, args.arch)
        _emit(args, {"recommend": rows}, markdown_table(rows) if rows else "(no experience for this kind of kernel yet)")
    return 0


def cmd_playbook(args, settings) -> int:
    import difflib

    import playbook
    from playbook.analysis import analyze
    from playbook.base import attempt, inapplicable, page_text

    if args.action == "list":
        rows = [{"id": r.id, "languages": ",".join(r.languages), "title": r.title} for r in playbook.recipes()]
        _emit(args, {"recipes": rows}, markdown_table(rows))
        return 0
    if not args.recipe:
        raise UserError(f"playbook {args.action} needs a recipe id; valid: {', '.join(r.id for r in playbook.recipes())}")
    recipe = playbook.get(args.recipe)
    if args.action == "show":
        text = page_text(recipe)
        _emit(args, {"id": recipe.id, "title": recipe.title, "languages": list(recipe.languages), "page": text}, text)
        return 0
    if not args.target:
        raise UserError("playbook apply needs a target file")
    if not args.dry_run:
        raise UserError("playbook apply only previews (--dry-run); use tileloop run or step to change a kernel")
    path = Path(args.target)
    if not path.is_file():
        raise UserError(f"target {args.target} does not exist")
    src = path.read_text()
    an = analyze(src)
    if an.language not in recipe.languages or not recipe.applies(an):
        cands = []
        note = f"{recipe.id} {inapplicable(recipe, an)}"
    else:
        cands, why = attempt(recipe, src, an)
        note = (f"{len(cands)} candidate(s)" if cands else
                f"{recipe.id} did not recognise its pattern in {args.target}" + (f": {why}" if why else ""))
    diffs = [{"key": c.key, "optimization": c.title, "hypothesis": c.hypothesis,
              "diff": "".join(difflib.unified_diff(src.splitlines(True), c.source.splitlines(True),
                                                   f"a/{args.target}", f"b/{args.target}"))} for c in cands]
    _emit(args, {"recipe": recipe.id, "target": args.target, "kernel_class": an.kernel_class, "note": note, "candidates": diffs},
          note + "".join(f"\n\n# {d['optimization']}: {d['hypothesis']}\n{d['diff']}" for d in diffs))
    return 0


def cmd_suite(args, settings) -> int:
    from loop.suite import runner as suite
    from loop.common.files import atomic_write_text

    if args.action == "run":
        extra = ["--device", args.device] + (["--archs", ",".join(args.archs)] if args.archs else [])
        extra += ["--max-iters", str(args.max_iters)] if args.max_iters else []
        log = (lambda m: print(m, file=sys.stderr)) if args.json else print
        entries = suite.run_suite(Path.cwd(), args.paths, Path(args.out_dir), args.per_run, extra, log=log, gpus=args.gpus,
                                  resume=args.resume, restart=args.restart)
        _emit(args, {"out_dir": args.out_dir, "entries": entries}, f"{len(entries)} entries in {args.out_dir}")
        return 0
    entries = suite.load_entries([Path(p) for p in args.paths])
    text = suite.summarize(entries, args.title)
    if args.out:
        atomic_write_text(Path(args.out), text + "\n")
    _emit(args, {"entries": len(entries), "out": args.out, "markdown": text}, text)
    return 0

def cmd_profile(args, settings) -> int:
    from loop.tools import profile

    payload, code = profile.run(args.target, shape=args.shape, dtype=args.dtype, backend=args.backend,
                                launches=args.launches, kernels=args.kernel, ncu_path=args.ncu, run_id=args.run,
                                settings=settings, log=lambda m: print(m, file=sys.stderr))
    _emit(args, payload, profile.render(payload))
    if code:  # one line on stderr, as for every error
        print(f"error: {payload['error']}" + (f" (hint: {payload['hint']})" if payload.get("hint") else ""), file=sys.stderr)
    return code


def cmd_decision_check(args, settings) -> int:
    import tempfile

    from loop.tools import decision_check
    from loop.common.files import atomic_write_text

    with tempfile.TemporaryDirectory(prefix="tileloop-decision-check-") as tmp:
        result = decision_check.run(args.target, trials=args.trials, plant=args.plant, scenarios=args.scenarios,
                                    shapes=args.shapes, device=args.device, target_backend=args.target_backend,
                                    dtype=args.dtype, seed=args.seed, settings=settings, workdir=Path(tmp),
                                    timeout_s=args.timeout)
    text = decision_check.render(result)
    if args.out:
        atomic_write_text(args.out, text + "\n")
    _emit(args, result, text)
    return 0 if result["complete"] else 1


COMMANDS = {"experience": cmd_experience, "playbook": cmd_playbook, "report": cmd_report, "compare": cmd_compare, "doctor": cmd_doctor, "compile": cmd_compile, "demo": cmd_demo, "init": cmd_init, "step": cmd_step, "run": cmd_run, "resume": cmd_resume,
            "status": cmd_status, "history": cmd_history, "results": cmd_results, "profile": cmd_profile, "suite": cmd_suite}

COMMANDS["decision-check"] = cmd_decision_check

def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_mod.load()
        return COMMANDS[args.command](args, settings)
    except UserError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"schema": CLI_SCHEMA, "command": args.command, "error": exc.message, "hint": exc.hint}))
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted: tileloop resume finishes or records the iteration in flight", file=sys.stderr)
        return 130
