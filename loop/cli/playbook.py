"""`tileloop playbook list | show <id> | apply <id> <target> --dry-run | plan <target>`: the recipes,
their pages, the diff each would make, and which of them apply to a target and why the others do
not (nothing is changed).

A target is read from the entry point its spec names (ENTRY, or what an `entry(target, **inputs)`
adapter reads of it: the spec.py beside the target), or `--entry`; recipes change only the kernels
that entry point's forward path launches."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

import playbook
from loop.cli.common import common, emit
from loop.common.errors import UserError
from loop.common.language import language_of_file
from loop.records import gitops
from loop.run import levers
from loop.run.experiment import open_run
from loop.run.init import in_progress
from loop.records.perf_table import markdown_table
from playbook.analysis import Analysis, analyze
from playbook.base import attempt, inapplicable, page_text, ranked_experiments
from playbook.cst.entry import entry_beside


def add_playbook(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("action", choices=["list", "show", "apply", "plan"])
    sp.add_argument("recipe", nargs="?", help="recipe id (show, apply); the kernel file (plan)")
    sp.add_argument("target", nargs="?", help="kernel file (apply)")
    sp.add_argument("--dry-run", action="store_true", help="apply: print the diff of each candidate, change nothing")
    sp.add_argument("--entry", action="append", metavar="NAME",
                    help="apply, plan: the target's entry point (a function or class of it; repeatable); default: "
                         "what the spec beside the target calls, else run or the autograd forwards")
    sp.add_argument("--backend", help="apply, plan: the run's target backend (ptx, tileir, interpreter, cutile)")
    sp.add_argument("--arch", help="apply, plan: the run's GPU architecture, e.g. sm_100")
    sp.add_argument("--roofline-fraction", type=float, metavar="F",
                    help="plan: the kernel's measured fraction of its roofline (e.g. 0.6 of clone bandwidth), to order "
                         "the candidates by expected gain as a run does; default: the best version of this target's "
                         "run in progress, if one is measured, else the playbook's static order")
    common(sp, run_opt=False)


def cmd_playbook(args, settings) -> int:
    if args.action == "plan":
        return _plan(args, settings)
    if args.action == "list":
        rows = [{"id": r.id, "languages": ",".join(r.languages), "title": r.title} for r in playbook.recipes()]
        emit(args, {"recipes": rows}, markdown_table(rows))
        return 0
    if not args.recipe:
        raise UserError(f"playbook {args.action} needs a recipe id; valid: {', '.join(r.id for r in playbook.recipes())}")
    recipe = playbook.get(args.recipe)
    if args.action == "show":
        text = page_text(recipe)
        emit(args, {"id": recipe.id, "title": recipe.title, "languages": list(recipe.languages), "page": text}, text)
        return 0
    return _apply(args, recipe)


def _read(target: str, args) -> tuple[str, Analysis]:
    """The target's source and its analysis from the entry point its spec (or --entry) names."""
    path = Path(target)
    if not path.is_file():
        raise UserError(f"target {target} does not exist", hint="name a kernel file: tileloop playbook plan <target>")
    src = path.read_text()
    language = language_of_file(path.name, src)  # a CUDA C target is read from its parse tree, never as Python
    try:
        an = analyze(src, backend=args.backend, arch=args.arch, entry=tuple(args.entry or entry_beside(path)),
                     language=language)
    except SyntaxError as exc:
        raise UserError(f"target {target} does not parse: line {exc.lineno}: {exc.msg}") from None
    return src, an


def _apply(args, recipe) -> int:
    if not args.target:
        raise UserError("playbook apply needs a target file")
    if not args.dry_run:
        raise UserError("playbook apply only previews (--dry-run); use tileloop run or step to change a kernel")
    src, an = _read(args.target, args)
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
    emit(args, {"recipe": recipe.id, "target": args.target, "kernel_class": an.kernel_class, "note": note, "candidates": diffs},
         note + "".join(f"\n\n# {d['optimization']}: {d['hypothesis']}\n{d['diff']}" for d in diffs))
    return 0


def one_line(reason: str | None, fallback: str) -> str:
    """A reason as one line of text (a recipe's Skip may quote code over several lines)."""
    text = " ".join((reason or "").split())
    return text or fallback


def _plan(args, settings) -> int:
    """Every recipe of the target's language: the ones that apply (their candidates) and, for each
    other one, why not, in one line."""
    target = args.recipe
    if not target:
        raise UserError("playbook plan needs a target file", hint="tileloop playbook plan <kernel file> [--json]")
    src, an = _read(target, args)
    applicable, not_applicable = [], []
    for recipe in playbook.recipes():
        if an.language not in recipe.languages:
            continue
        if not recipe.applies(an):
            not_applicable.append({"id": recipe.id, "reason": one_line(
                inapplicable(recipe, an), "does not apply to this kernel")})
            continue
        cands, why = attempt(recipe, src, an)
        if cands:
            first = cands[0]
            applicable.append({"id": recipe.id, "candidates": len(cands), "optimization": first.title,
                               "hypothesis": first.hypothesis})
        else:
            not_applicable.append({"id": recipe.id, "reason": one_line(
                why, f"does not recognise its pattern in {target}")})
    where = _measured_roofline(args, target, settings, not levers.memory_bound(an))
    an = levers.with_levers(an, where, args.backend or "", args.arch)
    order = levers.order_payload(ranked_experiments(src, an, (), ()), an, where)
    payload = {"target": target, "language": an.language, "kernel_class": an.kernel_class, "entry": list(an.entry),
               "forward_kernels": sorted(an.forward) if an.forward is not None else None,
               "applicable": applicable, "not_applicable": not_applicable, "plan": order}
    lines = [f"{target}: {an.language} {an.kernel_class}; forward path of {an.entry_text()}: "
             + (", ".join(sorted(an.forward)) if an.forward is not None else "every kernel"), "", "applicable:"]
    lines += [f"  {a['id']}: {a['candidates']} candidate(s), first: {a['optimization']}"
              for a in applicable] or ["  none"]
    lines += ["", "not applicable:"] + [f"  {n['id']}: {n['reason']}" for n in not_applicable]
    lines += ["", *levers.order_text(order)]
    emit(args, payload, "\n".join(lines))
    return 0


def _measured_roofline(args, target: str, settings, compute: bool) -> levers.Roofline | None:
    """--roofline-fraction, else the measured best version of this target's run in progress, if any
    (`compute`: a dot kernel's fraction of the device's matmul rate)."""
    if args.roofline_fraction is not None:
        if not 0 < args.roofline_fraction <= 1.5:
            raise UserError(f"--roofline-fraction must be in (0, 1.5], got {args.roofline_fraction}",
                            hint="the kernel's fraction of its roofline, e.g. 0.6 for 60% of clone bandwidth")
        f = args.roofline_fraction
        return levers.Roofline(min(f, 1.0), f"{f:.2f} of the roofline (--roofline-fraction)")
    try:
        root = gitops.find_root(Path.cwd())
        rel = str(Path(target).resolve().relative_to(root))
        live = in_progress(root, rel)
        if live is None:
            return None
        run = open_run(live.run_id, settings)
        return levers.roofline(levers.best_record(run), run.state.target_backend, compute)
    except (UserError, ValueError, OSError):
        return None  # not in a repository, or no run of it: the static order


PARSERS = {"playbook": add_playbook}
COMMANDS = {"playbook": cmd_playbook}
