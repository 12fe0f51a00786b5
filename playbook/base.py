"""Candidate selection over the registered recipes, and what a person reads about them.

`recipes()` loads every recipe module (each registers its recipes on import) in the order the
playbook lists them; `next_candidate` picks the first untried candidate in priority order,
`why_nothing` says why each recipe has none left; a recipe's page lies beside its module.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Collection, Sequence

from loop.common.errors import UserError
from playbook.analysis import Analysis, Experiment
from playbook.recipe import Candidate, Recipe, inapplicable, registered

__all__ = ["attempt", "current_keys", "experiment", "get", "inapplicable", "next_candidate", "page_path", "page_text",
           "ranked", "ranked_experiments", "recipes", "why_nothing"]


# The recipe modules, in the order the playbook lists their recipes (`tileloop playbook list`,
# `why_nothing`) and offers candidates of equal priority: an order of its own, not the order in which
# something happened to import them.
RECIPE_MODULES = (
    "playbook.triton.eviction_policy", "playbook.triton.autotune", "playbook.cutile.autotune",
    "playbook.triton.launch_param", "playbook.cutile.hint", "playbook.cutile.latency", "playbook.cutile.store_no_tma",
    "playbook.cutile.approx", "playbook.cutile.num_ctas", "playbook.triton.fast_math",
    "playbook.triton.grouped_ordering", "playbook.triton.tensor_descriptor", "playbook.triton.whole_row",
    "playbook.triton.persistent", "playbook.triton.tileir_configs", "playbook.cutile.persistent",
    "playbook.cutile.grouped", "playbook.cutile.tf32", "playbook.cutile.gather_to_tma", "playbook.cutile.row_chunks",
    "playbook.tilelang.block_size", "playbook.tilelang.num_stages", "playbook.tilelang.threads",
    "playbook.tilelang.swizzle", "playbook.tilelang.pass_configs",
    "playbook.cuda.threads_per_block", "playbook.cuda.vectorize", "playbook.cuda.warp_shuffle", "playbook.cuda.restrict",
    "playbook.cuda.grid_stride", "playbook.cuda.launch_bounds", "playbook.cuda.unroll",
)


def recipes() -> list[Recipe]:
    _load()
    rank = {name: i for i, name in enumerate(RECIPE_MODULES)}
    found = list(registered().values())
    return sorted(found, key=lambda r: (rank.get(type(r).__module__, len(rank)), found.index(r)))


def get(recipe_id: str) -> Recipe:
    _load()
    try:
        return registered()[recipe_id]
    except KeyError:
        raise UserError(f"unknown recipe {recipe_id!r}; valid: {', '.join(sorted(registered()))}") from None


def _load() -> None:
    """Imports every recipe module (each registers its recipes on import)."""
    for name in RECIPE_MODULES:
        importlib.import_module(name)


def next_candidate(source: str, analysis: Analysis, tried: Sequence[str], demoted: Sequence[str],
                   skip: Sequence[str] = ()) -> Candidate | None:
    """The first untried candidate in priority order; kinds kept at low gain go last; recipes in
    `skip` (ids) are never asked."""
    pool = ranked(source, analysis, tried, demoted, skip)
    return pool[0] if pool else None


def ranked(source: str, analysis: Analysis, tried: Sequence[str], demoted: Sequence[str],
           skip: Sequence[str] = ()) -> list[Candidate]:
    """Every untried candidate in the order `next_candidate` offers them, from one pass over the recipes:
    kinds kept at low gain last, then by tier, then by expected gain per expected second of the
    experiment (`Analysis.rank_key`; the static priority where no headroom is measured)."""
    return [c for c, _ in ranked_experiments(source, analysis, tried, demoted, skip)]


def ranked_experiments(source: str, analysis: Analysis, tried: Sequence[str], demoted: Sequence[str],
                       skip: Sequence[str] = ()) -> list[tuple[Candidate, Experiment]]:
    """`ranked`'s candidates in its order, each with the experiment its place was computed from
    (what the order's reasons cost out: `loop.run.levers.order_payload`)."""
    pool: list[tuple[Candidate, Experiment]] = []
    for recipe in recipes():
        if recipe.id not in skip and analysis.language in recipe.languages and recipe.applies(analysis):
            pool.extend((c, experiment(c, tried)) for c in recipe.candidates(source, analysis) if c.key not in tried)
    pool.sort(key=lambda ce: (ce[0].kind in demoted, ce[0].tier, *analysis.rank_key(ce[0].kind, ce[1])))
    return pool


def experiment(cand: Candidate, tried: Collection[str] = ()) -> Experiment:
    """What the unattended loop measures when it takes `cand`: its sweep's untried values (timed
    together, the best then alone) where it carries a sweep with two or more left, else its configs."""
    sweep = cand.sweep.untried(tried) if cand.sweep is not None else None
    return Experiment(len(sweep.values), swept=True) if sweep is not None else Experiment(cand.configs)


def why_nothing(source: str, analysis: Analysis, tried: Sequence[str], skip: Sequence[str] = ()) -> dict[str, str]:
    """For each recipe of the kernel's language, why it has no untried candidate for `source`: what
    a person reads when the playbook is exhausted, to see where a new recipe (or an edit) would go."""
    out: dict[str, str] = {}
    for recipe in recipes():
        if analysis.language not in recipe.languages:
            continue
        if recipe.id in skip:
            out[recipe.id] = "skipped (--skip-recipe)"
        elif not recipe.applies(analysis):
            out[recipe.id] = inapplicable(recipe, analysis)
        else:
            cands, reason = attempt(recipe, source, analysis)
            left = [c for c in cands if c.key not in tried]
            out[recipe.id] = (reason or "proposes nothing for this kernel" if not cands else
                              f"{len(cands)} candidate(s), all tried" if not left else
                              f"{len(left)} of {len(cands)} candidate(s) untried")
    return out


def page_path(recipe: Recipe) -> Path:
    """Where the recipe's page lies: beside the module that defines it, `<module>.md`."""
    return Path(sys.modules[type(recipe).__module__].__file__).with_suffix(".md")


def page_text(recipe: Recipe) -> str:
    """The recipe's markdown page (what, when, expected effect, hazards, before/after)."""
    page = page_path(recipe)
    return page.read_text() if page.exists() else f"# {recipe.id}\n\n{recipe.title}\n"


def attempt(recipe: Recipe, source: str, analysis: Analysis) -> tuple[list[Candidate], str | None]:
    """A recipe's candidates for `source` and, when there are none, its reason if it gives one
    (pattern recipes do, from the same pass that looked for candidates)."""
    if hasattr(recipe, "attempt"):
        return recipe.attempt(source, analysis)
    return recipe.candidates(source, analysis), None


def current_keys(source: str) -> list[str]:
    """Candidate keys that describe the source as it is (recipes that offer `current_keys`)."""
    keys: list[str] = []
    for recipe in recipes():
        fn = getattr(recipe, "current_keys", None)
        if fn is not None:
            try:
                keys.extend(fn(source))
            except Exception:  # a recipe that cannot parse this source proposes nothing for it either
                continue
    return keys
