"""`tileloop suite run | summarize | simulate`: many targets tuned unattended, one table of them all, and
the suite's wall time on more GPUs simulated from their run times."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loop.cli.common import arch_list, common, duration, emit, positive_int
from loop.common.files import atomic_write_text
from loop.common.errors import UserError
from loop.suite import nodes, runner, simulate, summary, unattended


def add_suite(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("action", choices=["run", "summarize", "simulate"])
    sp.add_argument("paths", nargs="+", help="run: target files; summarize: suite output folders or entry files; simulate: "
                                             "those, or a published results list (--unattended-json's .json)")
    sp.add_argument("--out-dir", default="sandbox/suite", help="run: where entries, reports and plots go (default sandbox/suite)")
    sp.add_argument("--per-run", type=duration, help="run: wall-clock limit per target (the run is then repaired and marked cut off); each run also "
                    "gets a --time-budget below it (unless the run arguments give one), so that it starts no "
                    "experiment it is not expected to finish")
    sp.add_argument("--archs", type=arch_list, default=None, help="run: ahead-of-time compile gate architectures passed to each run")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="run: passed to each run (cpu: interpreter timings)")
    sp.add_argument("--gpus", type=lambda t: [g.strip() for g in t.split(",") if g.strip()],
                    help="run: device ids, e.g. 0,1,2,3: one target per GPU at a time, each GPU in its own git worktree "
                         "under sandbox/suite-worktrees/ (with CUDA_VISIBLE_DEVICES set)")
    sp.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                    help="run: each target's run a Ray task, on any node (pip install -e \".[ray]\"): with no ADDRESS (and no "
                         "RAY_ADDRESS) a local cluster started and stopped for the suite, else the cluster there; the runs' "
                         "branches and records come back into this repository. Put it after the targets, or write --ray=ADDRESS")
    sp.add_argument("--no-profile", action="store_true",
                    help="run: no Nsight Compute profile of a best version that misses an unattended target (by default, on a "
                         "GPU, each such version is profiled at its largest shape once its run is reported, and the results "
                         "page quotes its bottleneck as that row's why)")
    sp.add_argument("--max-iters", type=positive_int, help="run: passed to each run (default: tileloop run's default)")
    sp.add_argument("--resume", action="store_true",
                    help="run: continue a suite that was stopped: a target whose run exists goes on with tileloop resume "
                         "(on the GPU whose worktree holds it), a finished one keeps its entry (measured again only if the entry "
                         "lacks its final measurement), the others start")
    sp.add_argument("--restart", action="append", metavar="TARGET", default=[],
                    help="run, with --resume: forget this target's run (branch, records, entry) so it starts anew, "
                         "e.g. after its playbook changed; repeatable")
    sp.add_argument("--out", help="summarize: write the markdown here (default: print it); the plot of where and when each "
                                  "target ran goes beside it (<name>-nodes.png), else into the first suite folder given")
    sp.add_argument("--title", default="tileloop suite results", help="summarize: the document title")
    sp.add_argument("--unattended-json", metavar="PATH",
                    help="summarize: also write the unattended results list here (e.g. "
                         "docs/results/unattended-<device>-<date>.json: one object per target, benchmark shape and dtype of "
                         "its final measurement with op, language, shape, dtype, best_ms, eager_ms, compile_ms (null where "
                         "torch.compile was unavailable), clone_fraction, experiments, wall_s) and beside it PATH with .md: "
                         "the same table with a verdict per row, the median seconds per experiment, the device, the commands")
    sp.add_argument("--command", action="append", default=[], dest="commands", metavar="CMD",
                    help="summarize, with --unattended-json: a command that made the results, shown on the page; repeatable")
    sp.add_argument("--driver-s", type=float, metavar="S",
                    help="simulate: the Ray driver's seconds per task (default: the median of the entries' own, else 0), e.g. "
                         "a --ray suite's median driver_s for runs that did not go through Ray")
    common(sp, run_opt=False)


def cmd_suite(args, settings) -> int:
    if args.action == "run":
        # --archs none is an empty list: passed on as "none" (gate off), not dropped (the runs' default gate)
        extra = ["--device", args.device] + (["--archs", ",".join(args.archs) or "none"] if args.archs is not None else [])
        extra += ["--max-iters", str(args.max_iters)] if args.max_iters else []
        log = (lambda m: print(m, file=sys.stderr)) if args.json else print
        entries = runner.run_suite(Path.cwd(), args.paths, Path(args.out_dir), args.per_run, extra, log=log, gpus=args.gpus,
                                   resume=args.resume, restart=args.restart, engine=_engine(args), profile=not args.no_profile)
        emit(args, {"out_dir": args.out_dir, "entries": entries}, f"{len(entries)} entries in {args.out_dir}")
        return 0
    paths = [Path(p) for p in args.paths]
    if args.action == "simulate":
        return _simulate(args, paths)
    entries = summary.load_entries(paths)
    plot, link = _plot_path(args.out, paths)
    plot_note, drawn = (nodes.plot(entries, plot, args.title, link) if plot else
                        ("No plot: give --out or a suite output folder.", False))
    text = summary.summarize(entries, args.title, plot_note)
    if args.out:
        atomic_write_text(Path(args.out), text + "\n")
    if args.unattended_json:
        target = Path(args.unattended_json)
        if target.suffix != ".json":
            raise UserError(f"--unattended-json needs a .json path, got {target}", hint="its page goes beside it, with .md")
        data, _ = unattended.write(target, entries, args.commands, summary.started_runs(paths),
                                  summary.suite_targets(paths), args.title)
        note = f"{len(data)} rows in {target}, its page in {target.with_suffix('.md')}"
        if args.json:
            print(note, file=sys.stderr)
        else:
            text = f"{text}\n\n{note}"
    elif args.commands:
        raise UserError("--command goes with --unattended-json (it is shown on that page)")
    emit(args, {"entries": len(entries), "out": args.out, "markdown": text, "nodes": nodes.node_rows(entries),
                "plot": str(plot) if drawn else None, "simulation": simulate.simulate(entries)}, text)
    return 0


def _simulate(args, paths: list[Path]) -> int:
    """`suite simulate`: the simulation's table of a suite's entries, or of a published results list."""
    if args.driver_s is not None and args.driver_s < 0:
        raise UserError(f"--driver-s must be >= 0, got {args.driver_s}")
    lists = [_json_or_none(p) for p in paths if p.is_file() and p.suffix == ".json"]
    if lists and len(lists) == len(paths) and all(isinstance(d, list) for d in lists):
        try:
            runs = [run for d in lists for run in simulate.published_runs(d)]
        except ValueError as exc:
            raise UserError(str(exc)) from None
        sim = simulate.simulate_runs(runs, [], None, per_task_s=args.driver_s)
    else:
        sim = simulate.simulate(summary.load_entries(paths), per_task_s=args.driver_s)
    text = "\n".join(simulate.markdown(sim))
    emit(args, {"markdown": text, "simulation": sim}, text)
    return 0


def _json_or_none(path: Path):
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None


def _plot_path(out: str | None, paths: list[Path]) -> tuple[Path | None, str | None]:
    """Where the plot of where and when each target ran goes, and the link the page gives it:
    beside --out (`<name>-nodes.png`), else in the first suite output folder given; none else."""
    if out:
        return Path(out).with_name(f"{Path(out).stem}-nodes.png"), None
    folder = next((p for p in paths if p.is_dir()), None)
    return (folder / "suite-nodes.png", str(folder / "suite-nodes.png")) if folder else (None, None)


def _engine(args) -> runner.Engine | None:
    """`--ray [ADDRESS]`: the Ray engine (Ray imported only now); else the local one (None)."""
    if args.ray is None:
        return None
    if args.gpus is not None:
        raise UserError("--ray and --gpus do not go together: Ray gives each run a GPU of the cluster")
    if args.ray and Path(args.ray).is_file():
        raise UserError(f"--ray took {args.ray} as the cluster's address", hint="put --ray after the targets, or write --ray=ADDRESS")
    from loop.suite.ray_engine import RayEngine

    return RayEngine(args.ray)


PARSERS = {"suite": add_suite}
COMMANDS = {"suite": cmd_suite}
