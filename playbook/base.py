"""Recipe interface, registry and candidate selection."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from loop.common.errors import UserError
from playbook.analysis import Analysis


@dataclass(frozen=True)
class Candidate:
    recipe: str  # recipe id
    kind: str  # the variable it changes (for priority and demotion), e.g. "num_warps"
    key: str  # unique within a run: the same key is never tried twice
    title: str  # the optimization text of the record, e.g. "num_warps 1 -> 2"
    hypothesis: str
    source: str  # the whole rewritten target
    tier: int = 0  # 0: first-line moves; 1: second thoughts (e.g. a step back down), tried after every tier-0 move


class Recipe(Protocol):
    id: str
    title: str
    languages: tuple[str, ...]

    def applies(self, analysis: Analysis) -> bool: ...
    # optional: `inapplicable(analysis) -> str`, why `applies` said no, where that is not the kernel class

    def candidates(self, source: str, analysis: Analysis) -> list[Candidate]: ...


_REGISTRY: dict[str, Recipe] = {}


def register(cls: type) -> type:
    """Class decorator: registers one instance of the recipe under its id."""
    if cls.id in _REGISTRY:
        raise ValueError(f"recipe id {cls.id!r} registered twice")
    _REGISTRY[cls.id] = cls()
    return cls


def recipes() -> list[Recipe]:
    _load()
    return list(_REGISTRY.values())


def get(recipe_id: str) -> Recipe:
    _load()
    try:
        return _REGISTRY[recipe_id]
    except KeyError:
        raise UserError(f"unknown recipe {recipe_id!r}; valid: {', '.join(sorted(_REGISTRY))}") from None


def _load() -> None:
    from playbook import (autotune, cutile_hints, cutile_knobs, eviction, fastmath, grouped,  # noqa: F401
                          launch, tensor_descriptor)  # (they register on import)
    from playbook import cutile_autotune  # noqa: F401
    from playbook import persistent, tileir_configs  # noqa: F401
    from playbook import cutile_grouped, cutile_schedule, cutile_tf32, cutile_tma  # noqa: F401
    from playbook import cutile_row_chunks, whole_row  # noqa: F401


def next_candidate(source: str, analysis: Analysis, tried: Sequence[str], demoted: Sequence[str],
                   skip: Sequence[str] = ()) -> Candidate | None:
    """The first untried candidate in priority order; kinds kept at low gain go last; recipes in
    `skip` (ids) are never asked."""
    pool: list[Candidate] = []
    for recipe in recipes():
        if recipe.id not in skip and analysis.language in recipe.languages and recipe.applies(analysis):
            pool.extend(c for c in recipe.candidates(source, analysis) if c.key not in tried)
    order = analysis.priority()
    rank = {kind: i for i, kind in enumerate(order)}
    pool.sort(key=lambda c: (c.kind in demoted, c.tier, rank.get(c.kind, len(order))))
    return pool[0] if pool else None


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


def page_text(recipe: Recipe) -> str:
    """The recipe's markdown page (what, when, expected effect, hazards, before/after)."""
    page = Path(__file__).parent / "pages" / f"{recipe.id}.md"
    return page.read_text() if page.exists() else f"# {recipe.id}\n\n{recipe.title}\n"


def inapplicable(recipe: Recipe, analysis: Analysis) -> str:
    """Why `recipe.applies(analysis)` said no: the recipe's own reason where its test is not the
    kernel class (`inapplicable(analysis)`), else the kernel's language and class."""
    own = getattr(recipe, "inapplicable", None)
    return (own(analysis) if own else None) or f"does not apply to a {analysis.language} {analysis.kernel_class} kernel"


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
