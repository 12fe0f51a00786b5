"""`tileloop playbook list | show <id> | apply <id> <target> --dry-run`: the recipes, their pages, and
the diff each would make (nothing is changed)."""

from __future__ import annotations

import difflib
from pathlib import Path

import playbook
from loop.cli.common import common, emit
from loop.common.errors import UserError
from loop.records.perf_table import markdown_table
from playbook.analysis import analyze
from playbook.base import attempt, inapplicable, page_text


def add_playbook(sub) -> None:
    sp = sub.add_parser("playbook", help="the recipes: list | show <id> | apply <id> <target> --dry-run")
    sp.add_argument("action", choices=["list", "show", "apply"])
    sp.add_argument("recipe", nargs="?", help="recipe id (show, apply)")
    sp.add_argument("target", nargs="?", help="kernel file (apply)")
    sp.add_argument("--dry-run", action="store_true", help="apply: print the diff of each candidate, change nothing")
    common(sp, run_opt=False)


def cmd_playbook(args, settings) -> int:
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


def _apply(args, recipe) -> int:
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
    emit(args, {"recipe": recipe.id, "target": args.target, "kernel_class": an.kernel_class, "note": note, "candidates": diffs},
         note + "".join(f"\n\n# {d['optimization']}: {d['hypothesis']}\n{d['diff']}" for d in diffs))
    return 0


PARSERS = {"playbook": add_playbook}
COMMANDS = {"playbook": cmd_playbook}
