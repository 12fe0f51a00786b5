"""Commands about a target and its spec before any run: check (every problem at once), spec (a
skeleton to fill in)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loop.cli.common import arch_list, common, emit
from loop.common.errors import UserError
from loop.common import cuda_c
from loop.target import cuda_c as cuda_target
from loop.target.check import check, line_of
from loop.target.skeleton import write_spec


def add_check(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("target", help="the kernel file (spec.py beside it)")
    sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda (default), or cpu: run the checks under the Triton interpreter")
    sp.add_argument("--archs", type=arch_list, default=["sm_90", "sm_100"],
                    help="architectures to build for ahead of time (default sm_90,sm_100; 'none' skips the build)")
    common(sp, run_opt=False)


def add_spec(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("target", help="the kernel file, or a case folder in the seed skill's layout (v0.cu and ref.py "
                                   "with reference(**kwargs)) to make a CUDA C target <case>_cuda.cu and its spec")
    sp.add_argument("--entry", default="run", help="the target's function called with the inputs (default run)")
    sp.add_argument("--force", action="store_true", help="overwrite an existing spec.py")
    common(sp, run_opt=False)


def cmd_check(args, settings) -> int:
    result = check(args.target, device=args.device, archs=args.archs, settings=settings,
                   log=lambda m: print(m, file=sys.stderr))
    kernel_run = result.pop("kernel_run")
    lines = [line_of(p) for p in result["problems"]] + [f"warning: {line_of(p)}" for p in result["warnings"]]
    summary = (f"{len(result['problems'])} problem(s) in {result['target']} and its spec" if not result["ok"] else
               f"ok: {result['target']} and its spec pass every check" if kernel_run else
               f"ok: the spec of {result['target']} passes every check that needs no GPU; the kernel itself was not run")
    if not result["ok"]:  # the error contract's fields too
        result = {**result, "error": f"{summary}: {line_of(result['problems'][0])}",
                  "hint": result["problems"][0]["hint"] or f"tileloop check {args.target} after each fix"}
    emit(args, result, "\n".join(lines + [summary]))
    if not result["ok"]:
        print(f"error: {summary}: {line_of(result['problems'][0])}", file=sys.stderr)
    return 0 if result["ok"] else 2


def cmd_spec(args, settings) -> int:
    target = Path(args.target)
    if target.is_dir():  # a case in the seed skill's layout: its v0.cu made a target, its ref.py the reference
        target, spec = cuda_target.import_case(target, args.force)
        emit(args, {"target": str(target), "spec": str(spec), "entry": cuda_c.ENTRY},
             f"wrote {target} (the case's {cuda_target.CASE_KERNEL}) and {spec} (its reference the case's "
             f"{cuda_target.CASE_REFERENCE}): fill in the spec's TODOs, then tileloop check {target}\n"
             f"{cuda_target.timing_of(target)}")
        return 0
    if not target.is_file():
        raise UserError(f"target {args.target} does not exist")
    cuda = cuda_c.is_cuda_target(target.name)
    spec = cuda_target.write_spec(target, args.force) if cuda else write_spec(target, args.entry, args.force)
    emit(args, {"target": args.target, "spec": str(spec), "entry": cuda_c.ENTRY if cuda else args.entry},
         f"wrote {spec}: fill in its TODOs, then tileloop check {args.target}"
         + (f"\n{cuda_target.timing_of(target)}" if cuda else ""))
    return 0


PARSERS = {"check": add_check, "spec": add_spec}
COMMANDS = {"check": cmd_check, "spec": cmd_spec}
