"""Commands that examine a kernel or a machine without a run: doctor, compile, profile, compare,
decision-check."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from loop.backends import BACKENDS, gpu_backends
from loop.cli.common import arch_list, common, duration, emit, positive_int, shape_arg
from loop.common.errors import UserError
from loop.common.files import atomic_write_text, scratch
from loop.measure import probe
from loop.records import gitops
from loop.tools import compare, decision_check, doctor, profile
from loop.tools.compile import compile_target


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def add_doctor(sp: argparse.ArgumentParser) -> None:
    common(sp, run_opt=False)


def add_compile(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("target", help="the kernel file (spec.py beside it gives the example inputs)")
    sp.add_argument("--arch", type=arch_list, default=["sm_90", "sm_100"], help="comma-separated, default sm_90,sm_100")
    common(sp, run_opt=False)


def add_profile(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("target", help="the kernel file (spec.py beside it)")
    sp.add_argument("--shape", type=shape_arg, help="e.g. 4096x8192 (default: the spec's largest benchmark shape)")
    sp.add_argument("--dtype", choices=["float16", "bfloat16", "float32", "float64"], help="default: the spec's first dtype")
    sp.add_argument("--backend", choices=gpu_backends(),
                    help="default: tileir if available, else ptx; cutile for cuTile targets")
    sp.add_argument("--launches", type=positive_int, default=3, help="kernel launches profiled (default 3; the median is kept)")
    sp.add_argument("--kernel", action="append", metavar="NAME",
                    help="kernel to profile (repeatable; default: the target's @triton.jit / @ct.kernel functions)")
    sp.add_argument("--ncu", metavar="PATH", help="the ncu executable (default: ncu on PATH)")
    common(sp)


def add_compare(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("op_dir", help="kernels/<op>: a folder with spec.py and <op>_triton.py / <op>_cutile.py")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: Triton interpreter timings only")
    sp.add_argument("--out", type=Path, help="also write the markdown table to this file")
    sp.add_argument("--full-check", action="store_true", help="also check every dtype at the full benchmark shapes")
    common(sp, run_opt=False)


def add_decision_check(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("target", help="the kernel file (spec.py beside it)")
    sp.add_argument("--trials", type=positive_int, default=100, help="trials per scenario (default 100)")
    sp.add_argument("--plant", type=decision_check.plant_fraction,
                    help="plant real extra work worth this fraction of the kernel's time (e.g. 0.03) and add the "
                         "slowdown and speedup scenarios")
    sp.add_argument("--scenarios", type=decision_check.parse_scenarios,
                    help="comma-separated subset of aa,slowdown,speedup,honest (default: aa; aa,slowdown,speedup with "
                         "--plant); honest: the playbook's own candidates for the target in turn, each judged against it")
    sp.add_argument("--method", choices=decision_check.METHODS, default="auto",
                    help="timing method of every measurement on the GPU: graph (CUDA graphs) or eager (events and an L2 "
                         "flush); default auto, the judge's choice; a graph that cannot be captured is timed eagerly and "
                         "counted as such")
    sp.add_argument("--l2-multiples", type=decision_check.parse_multiples, metavar="M,M,...",
                    help="time shapes whose inputs and outputs take these multiples of the device's L2, e.g. "
                         "0.25,1,4,10 (1-D and 2-D specs: n, or rows at the spec's column count; instead of --shapes)")
    sp.add_argument("--shapes", type=decision_check.parse_shape, nargs="+", metavar="SHAPE",
                    help="e.g. 1048576 or 4096x4096x4096 (default: the shapes an iteration times)")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: Triton interpreter timings")
    sp.add_argument("--target-backend", choices=list(BACKENDS),
                    help="backend to time (default: as tileloop init chooses)")
    sp.add_argument("--dtype", help="benchmark dtype (default: the one an iteration times, the spec's first)")
    sp.add_argument("--seed", type=int, default=0, help="base seed for the fresh inputs of every trial")
    sp.add_argument("--timeout", type=duration, help="limit for each judged measurement (default: an iteration's)")
    sp.add_argument("--budget", type=duration, help="end by this long (e.g. 8m): no round of trials starts that the "
                                                   "longest so far would end past it; the report is then incomplete, with "
                                                   "every trial finished (exit 1); a SIGTERM ends it the same way")
    sp.add_argument("--out", type=Path, help="also write the markdown report to this file")
    common(sp, run_opt=False)


def cmd_doctor(args, settings) -> int:
    rep = doctor.report(probe.probe_environment(Path(tempfile.gettempdir()), settings), doctor.interpreter_check(settings),
                        doctor.isolation_check(settings))
    emit(args, rep, doctor.render(rep))
    return 0


def cmd_compile(args, settings) -> int:
    payload, text = compile_target(args.target, args.arch, settings)
    emit(args, payload, text)
    return 0 if payload["ok"] else 1


def cmd_profile(args, settings) -> int:
    payload, code = profile.run(args.target, shape=args.shape, dtype=args.dtype, backend=args.backend,
                                launches=args.launches, kernels=args.kernel, ncu_path=args.ncu, run_id=args.run,
                                settings=settings, log=_stderr)
    emit(args, payload, profile.render(payload))
    if code:  # one line on stderr, as for every error
        print(f"error: {payload['error']}" + (f" (hint: {payload['hint']})" if payload.get("hint") else ""), file=sys.stderr)
    return code


def cmd_compare(args, settings) -> int:
    op_dir = Path(args.op_dir).resolve()
    if not op_dir.is_dir():
        raise UserError(f"{args.op_dir} is not a folder")
    root = gitops.root_or_folder(op_dir.parent)
    env = probe.probe_environment(root, settings)
    if args.device == "cuda" and not env.get("cuda_available"):
        raise UserError(f"no GPU available: {env.get('cuda_reason')}", hint="pass --device cpu")
    with scratch("compare") as tmp:
        result = compare.run_compare(op_dir, root, env, args.device, settings, Path(tmp), log=_stderr,
                                     full_check=args.full_check)
    text = compare.render(result)
    if args.out:
        atomic_write_text(args.out, text + "\n")
    emit(args, result, text)
    return 0


def cmd_decision_check(args, settings) -> int:
    with scratch("decision-check") as tmp:
        result = decision_check.run(args.target, trials=args.trials, plant=args.plant, scenarios=args.scenarios,
                                    shapes=args.shapes, device=args.device, target_backend=args.target_backend,
                                    dtype=args.dtype, seed=args.seed, settings=settings, workdir=Path(tmp),
                                    timeout_s=args.timeout, method=args.method, l2_multiples=args.l2_multiples,
                                    budget_s=args.budget)
    text = decision_check.render(result)
    if args.out:
        atomic_write_text(args.out, text + "\n")
    emit(args, result, text)
    return 0 if result["complete"] else 1


PARSERS = {"doctor": add_doctor, "compile": add_compile, "profile": add_profile, "compare": add_compare,
           "decision-check": add_decision_check}
COMMANDS = {"doctor": cmd_doctor, "compile": cmd_compile, "profile": cmd_profile, "compare": cmd_compare,
            "decision-check": cmd_decision_check}
