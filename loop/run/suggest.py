"""The screen every playbook proposer shares, and what an agent's step asks of the playbook: the
next candidates worth a step (`suggestions`), and one recipe's candidate proposed as the step
(`tileloop step --recipe ID [--key KEY]`, `recipe_candidate`); the unattended loop proposes through
the same screen (`loop.run.unattended`).

A candidate is worth a step when this run has not tried it: its key is not among the run's tried
keys (`state.tried`: the candidates evaluated, and the values the kept versions already have), and
its source is not a version the run already measured (an agent's hand edit that made the same
change has no key, but it has its source hash in the records; an interrupted or void measurement
measured nothing, and its key is tried again once). And when the checks can see it: a
change that touches only code no checked shape ran in the best version's last measurement (the
kernels it launched, the host functions it called) is `unexercised` and reverted unmeasured, so it
is never suggested (`loop.target.coverage`).

`step --recipe ID` applies the recipe's first candidate worth a step with its sweep, where it carries
one (several values of its variable in one experiment, `loop.run.sweep`); `--key` with the
candidate's own key applies that value alone, with the sweep's key (`<stem>=sweep(<values>)`) the sweep.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import playbook
from loop import decide
from loop.common.errors import UserError
from loop.records import experience, gitops
from loop.records.results import Record
from loop.run.core import Run
from loop.run.integrity import violations
from loop.run.levers import analysis_of, best_record
from loop.target.contract import source_hash
from loop.target.coverage import unexercised
from playbook import Candidate
from playbook.analysis import Analysis
from playbook.base import attempt, inapplicable, ranked

UNDECIDED = ("interrupted", decide.VOID)  # verdicts that say nothing about the candidate's source


class Screen:
    """Why a candidate is not worth a step in this run, or None: what the run has tried and measured,
    and what the checks of the best version ran."""

    def __init__(self, tried: list[str], records: list[Record], incumbent_src: str,
                 launched: list[str] | None, called: list[str] | None):
        self.tried, self.incumbent_src, self.launched, self.called = set(tried), incumbent_src, launched, called
        self.measured = {r.source_hash: r.iteration for r in records
                         if r.source_hash and r.verdict not in UNDECIDED}

    def why_not(self, cand: Candidate) -> str | None:
        if cand.key in self.tried:
            return "already tried in this run"
        seen = self.measured.get(source_hash(cand.source))
        if seen is not None:
            return f"its source is the version iteration {seen} measured"
        if self.launched is not None:
            missed = unexercised(self.incumbent_src, cand.source, self.launched, self.called)
            if missed:
                return f"it touches only {', '.join(missed)}, which no checked shape runs (unexercised)"
        return None


def screen(run: Run, incumbent_src: str) -> Screen:
    """The run's screen of candidates for `incumbent_src` (the best version)."""
    return Screen(run.state.tried, run.records(), incumbent_src, *incumbent_coverage(run))


def incumbent_coverage(run: Run) -> tuple[list[str] | None, list[str] | None]:
    """(kernels launched, host functions called) by the checks of the best version's last
    measurement, from its record's target-backend result; (None, None) where there is none (an
    external harness). A record written before results carried them: from its judge's result file
    (`worker-<backend>.result.json` beside its logs), the one place such a run kept them."""
    rec = best_record(run)
    if rec is None or run.state.harness:
        return None, None
    result = rec.backends.get(run.state.target_backend)
    if result is not None and result.launched is not None:
        return result.launched, result.called
    return _coverage_on_disk(run, rec)


def _coverage_on_disk(run: Run, rec: Record) -> tuple[list[str] | None, list[str] | None]:
    """What `incumbent_coverage` returns, read from the judge's result file of `rec`'s measurement
    (for records written before `BackendResult.launched`); (None, None) where it is gone."""
    path = run.iter_dir(rec.iteration) / f"worker-{run.state.target_backend}.result.json"
    try:
        seen = json.loads(path.read_text()).get("correctness", {})
    except (OSError, ValueError):
        return None, None
    label = "baseline" if rec.iteration == 0 else "candidate"
    return seen.get("launched", {}).get(label), seen.get("called", {}).get(label)


def _best(run: Run) -> tuple[str, Analysis]:
    src = gitops.show_file(run.root, run.state.best_commit, run.state.target)
    return src, analysis_of(run, src)[0]  # with the best version's distance to its roofline: by expected gain per expected second


def suggestions(run: Run, limit: int = 3) -> list[dict]:
    """Next candidates from the playbook for the current best version, experience first; none
    that this run tried or measured, none the checks could not see."""
    src, an = _best(run)
    ranked_kinds = experience.recommend(experience.load(), an.kernel_class, run.state.target_backend, run.arch).rows
    order = {r["kind"]: i for i, r in enumerate(ranked_kinds) if r["kept"]}
    seen = screen(run, src)
    pool = ranked(src, an, run.state.tried, run.state.demoted, run.state.skip_recipes)
    out = []
    for c in pool:
        if len(out) >= 3 * limit:
            break
        if seen.why_not(c) is None:
            hist = next((r for r in ranked_kinds if r["kind"] == c.kind), None)
            out.append({"recipe": c.recipe, "kind": c.kind, "key": c.key, "optimization": c.title,
                        "hypothesis": c.hypothesis, "experience": hist,
                        "apply": shlex.join(["tileloop", "step", "--recipe", c.recipe, "--key", c.key]),
                        **_sweep_suggestion(run, c)})
    out.sort(key=lambda c: order.get(c["kind"], len(order)))  # stable: playbook order within equal rank
    return out[:limit]


def _sweep_suggestion(run: Run, cand: Candidate) -> dict:
    """{"sweep": ...} for a candidate that carries a sweep of values this run has not tried: its
    values in one experiment, and the command that takes them; {} otherwise."""
    sweep = cand.sweep.untried(run.state.tried) if cand.sweep is not None and not run.state.harness else None
    if sweep is None:
        return {}
    return {"sweep": {"key": sweep.key, "optimization": sweep.title, "values": [v.value for v in sweep.values],
                      "apply": shlex.join(["tileloop", "step", "--recipe", cand.recipe, "--key", sweep.key])}}


def recipe_candidate(run: Run, recipe_id: str, key: str | None = None) -> Candidate:
    """The candidate `step --recipe` proposes: the named one, or the recipe's first worth a step."""
    recipe = playbook.get(recipe_id)
    src, an = _best(run)
    if recipe.id in run.state.skip_recipes:
        raise UserError(f"recipe {recipe.id} is skipped in this run (--skip-recipe)", hint="pick another recipe")
    if an.language not in recipe.languages or not recipe.applies(an):
        raise UserError(f"recipe {recipe.id} {inapplicable(recipe, an)}", hint="tileloop playbook list; or edit the "
                        "target yourself and step with --optimization")
    cands, why = attempt(recipe, src, an)
    if not cands:
        raise UserError(f"recipe {recipe.id} proposes nothing for {run.state.target}" + (f": {why}" if why else ""),
                        hint="pick another recipe, or edit the target yourself and step with --optimization")
    seen = screen(run, src)
    if key is not None:
        cand = next((replace(c, sweep=None) for c in cands if c.key == key), None)  # this value alone
        cand = cand or next((c for c in cands if c.sweep is not None
                             and key in (c.sweep.key, getattr(c.sweep.untried(run.state.tried), "key", None))), None)
        if cand is None:
            raise UserError(f"recipe {recipe.id} has no candidate {key!r} for the best version; its candidates: "
                            f"{', '.join(c.key for c in cands)}", hint=f"tileloop playbook apply {recipe.id} "
                            f"{run.state.target} --dry-run shows them")
        reason = seen.why_not(cand)
        if reason:
            raise UserError(f"candidate {key} of recipe {recipe.id}: {reason}", hint="pick another candidate")
        return cand
    reasons = [(c, seen.why_not(c)) for c in sorted(cands, key=lambda c: c.tier)]
    first = next((c for c, reason in reasons if reason is None), None)
    if first is None:
        raise UserError(f"recipe {recipe.id} has no candidate left worth a step: "
                        + "; ".join(f"{c.key}: {reason}" for c, reason in reasons[:4]),
                        hint="pick another recipe (step --json lists suggestions)")
    return first


def require_no_edit(run: Run) -> None:
    """Before a recipe's candidate is applied as the step: the run at its best commit and the tree
    holding no other edit (which the candidate would overwrite or mix with its own)."""
    run.check_position()
    others, new = violations(run)
    best = gitops.show_file(run.root, run.state.best_commit, run.state.target)
    edited = [run.state.target] if (run.root / run.state.target).read_text() != best else []
    if edited or others or new:
        raise UserError(f"the tree has edits a recipe step would mix with its own: {', '.join((edited + others + new)[:8])}",
                        hint="step your edit with tileloop step --optimization, or undo it (git checkout -- FILE)")
