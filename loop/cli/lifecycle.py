"""Commands that start, step and continue a run: init, step, run, resume, demo."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from loop import decide
from loop.backends import BACKENDS
from loop.cli.common import (
    arch_list,
    common,
    duration,
    emit,
    finish_run,
    policy_of,
    positive_int,
    record_summary,
    status_payload,
)
from loop.common.errors import UserError
from loop.measure import external, probe
from loop.records import gitops
from loop.run import iteration, resume, suggest, unattended
from loop.run.demo import demo_ops, make_demo_repository
from loop.run.experiment import open_run
from loop.run.init import describe, in_progress, init_run
from loop.run.levers import order_text, run_order
from loop.target.contract import resolve_target


def _start_options(sp) -> None:
    sp.add_argument("target", help="the kernel file to tune (spec.py must sit beside it)")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda (default) or cpu: run under the Triton interpreter; its timings are interpreter timings")
    sp.add_argument("--branch", help="branch to create (default tileloop/<op>-<yyyymmdd-hhmm>)")
    sp.add_argument("--target-backend", choices=list(BACKENDS),
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


def add_init(sp: argparse.ArgumentParser) -> None:
    _start_options(sp)
    common(sp, run_opt=False)


def add_step(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--optimization", "-m", help="what this change is, one line (required without --recipe)")
    sp.add_argument("--hypothesis", default=None, help="what should move, and by how much")
    sp.add_argument("--recipe", metavar="ID", help="apply this playbook recipe's candidate to the target as the step "
                                                   "(its first untried one; the tree must hold no other edit); "
                                                   "--optimization and --hypothesis default to the candidate's")
    sp.add_argument("--key", metavar="KEY", help="with --recipe: the candidate to apply (a `key` of step's suggestions "
                                                 "or of playbook apply --dry-run)")
    sp.add_argument("--rationale", default="", help="why: the evidence (profile, roofline, earlier results)")
    sp.add_argument("--expected", default="", help="the expected outcome, e.g. '1.2-1.5x on the wide shapes'")
    sp.add_argument("--allow-unchanged", action="store_true", help="evaluate an unchanged target (an A/A check)")
    common(sp)


def add_run(sp: argparse.ArgumentParser) -> None:
    _start_options(sp)
    sp.add_argument("--max-iters", type=positive_int, default=25, help="experiments after the baseline (default 25)")
    sp.add_argument("--no-early-stop", action="store_true",
                    help="overnight exploration: do not stop after two non-improvements or a sub-2%% gain; only "
                         "--max-iters, --time-budget, an exhausted playbook or an escalation stop the run")
    common(sp, run_opt=False)


def add_resume(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--max-iters", type=positive_int, help="raise the run's iteration limit")
    sp.add_argument("--no-continue", action="store_true", help="only repair; do not continue the loop")
    common(sp)


def add_demo(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--op", choices=demo_ops(), default="vector_add", help="which included Triton kernel")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu runs under the Triton interpreter")
    sp.add_argument("--max-iters", type=positive_int, default=3, help="experiments after the baseline (default 3)")
    sp.add_argument("--dir", type=Path, help="where to make the demo repository (default: a new temporary folder)")
    common(sp, run_opt=False)


def _harness(args):
    return external.from_options(args.test_cmd, args.bench_cmd, args.bench_repeats)


def _init(args, settings, mode: str = "agent"):
    return init_run(args.target, device=args.device, branch=args.branch, target_backend=args.target_backend,
                    seed=args.seed, policy=policy_of(args), settings=settings, archs=args.archs,
                    worker_timeout_s=args.iteration_timeout, harness=_harness(args), skip_recipes=args.skip_recipe,
                    mode=mode)


def cmd_init(args, settings) -> int:
    exp = _init(args, settings)
    rec = exp.records()[0]
    label = " (Triton interpreter timing, not a GPU number)" if rec.interpreter else ""
    order = run_order(exp)
    emit(args, {**status_payload(exp), "baseline": record_summary(rec), "suggestions": suggest.suggestions(exp), "plan": order},
         f"run {exp.state.run_id} on branch {exp.state.branch}: baseline {rec.latency_ms:.6f} ms{label}\n"
         + "\n".join(order_text(order)) + "\n"
         f"next: edit {exp.state.target}, then tileloop step --optimization '...' --hypothesis '...'; "
         f"or tileloop step --recipe ID")
    return 0


def cmd_step(args, settings) -> int:
    if args.key and not args.recipe:
        raise UserError("--key names a candidate of a recipe: pass --recipe ID with it", hint="tileloop step --help")
    if not (args.optimization or args.recipe):
        raise UserError("step needs --optimization (what your edit of the target is) or --recipe ID",
                        hint="tileloop step --optimization 'BLOCK 128 -> 256' --hypothesis '...'")
    exp = open_run(args.run, settings)
    if args.recipe:  # the playbook's candidate proposed, on a tree that holds no other edit
        cand = suggest.recipe_candidate(exp, args.recipe, args.key)
        suggest.require_no_edit(exp)
        it = iteration.candidate(exp, cand, args.optimization, args.hypothesis, rationale=args.rationale,
                                 expected=args.expected)
    else:  # the agent's own edit of the target
        it = iteration.edit(exp, args.optimization, args.hypothesis or "", allow_unchanged=args.allow_unchanged,
                            rationale=args.rationale, expected=args.expected)
    rec, stop = iteration.evaluate(exp, it)
    payload = {**record_summary(rec), "run": exp.state.run_id, "stop": stop.to_json(),
               "noise_band": {"lo": rec.decision.lo, "hi": rec.decision.hi, "per_shape": rec.decision.shapes},
               "best_commit": exp.state.best_commit, "best_latency_ms": exp.state.best_latency_ms,
               "suggestions": suggest.suggestions(exp)}
    band = rec.decision.lo, rec.decision.hi
    text = (f"#{rec.iteration} {rec.optimization}: {rec.status} ({rec.verdict}) {rec.decision.reason}\n"
            f"noise band: {band[0]}-{band[1]}; stop state: {stop.state} {stop.reason}")
    emit(args, payload, text)
    return 0


def cmd_run(args, settings) -> int:
    live = None if args.branch else _run_in_progress(args)
    if live is None:
        exp = _init(args, settings, mode="run")
        return finish_run(args, exp, unattended.run_loop(exp))
    exp = open_run(live.run_id, settings)
    exp.log(f"a run of {live.target} is in progress ({describe(live)}): continuing it unattended")
    policy = policy_of(args)
    exp.state.policy.update(max_iters=policy.max_iters, time_budget_s=policy.time_budget_s, early_stop=policy.early_stop)
    exp.state.mode = "run"
    return _go_on(args, exp, settings, go_on=True)


def _run_in_progress(args):
    """The run of `tileloop run`'s target still in progress, when it can be continued with these options."""
    root = gitops.find_root(Path.cwd())
    live = in_progress(root, str(resolve_target(args.target, root)[1]))
    if live is None:
        return None
    # an option left out asks for nothing: `run` without --test-cmd continues a harness run with its own commands
    asked = {"--device": (args.device, live.device), "--target-backend": (args.target_backend, live.target_backend),
             "--test-cmd": (True if _harness(args) is not None else None, live.harness is not None)}
    differ = [flag for flag, (mine, theirs) in asked.items() if mine is not None and mine != theirs]
    if differ:
        raise UserError(f"a run of {live.target} is in progress ({describe(live)}) with another {differ[0]}",
                        hint=f"tileloop resume --run {live.run_id} continues it; pass --branch NAME to start another run")
    return live


def cmd_resume(args, settings) -> int:
    exp = open_run(args.run, settings)
    if args.max_iters:
        exp.state.policy["max_iters"] = args.max_iters
    return _go_on(args, exp, settings, go_on=exp.state.mode == "run" and not args.no_continue)


def _go_on(args, exp, settings, go_on: bool) -> int:
    """Continue a run: end its leftover workers, refuse another machine, repair an interrupted
    iteration exactly once, and, `go_on`, go on with the playbook unattended."""
    exp.policy = decide.Policy(**exp.state.policy)
    resume.end_leftover_workers(exp)
    resume.check_environment(exp, probe.probe_environment(exp.root, settings))
    exp.check_records()  # the records are tileloop's: refused when something else rewrote them
    repaired = resume.repair(exp)
    exp.state.stopped = None
    exp.save()
    exp.render()  # perf_results.md from the records: a kill can land between a record and its rendering
    stop = unattended.run_loop(exp) if go_on else exp.stop_state()
    if repaired is not None:
        exp.log(f"repaired iteration {repaired.iteration}: {repaired.status}")
    return finish_run(args, exp, stop)


def cmd_demo(args, settings) -> int:
    where = make_demo_repository(args.op, args.dir)
    print(f"demo repository: {where}", file=sys.stderr)
    os.chdir(where)
    exp = init_run(f"kernels/{args.op}/{args.op}_triton.py", device=args.device, branch=None, target_backend=None, seed=0,
                   policy=decide.Policy(max_iters=args.max_iters), settings=settings, mode="run")
    return finish_run(args, exp, unattended.run_loop(exp), repository=str(Path(where).resolve()))


PARSERS = {"init": add_init, "step": add_step, "run": add_run, "resume": add_resume, "demo": add_demo}
COMMANDS = {"init": cmd_init, "step": cmd_step, "run": cmd_run, "resume": cmd_resume, "demo": cmd_demo}
