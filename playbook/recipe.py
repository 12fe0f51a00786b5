"""What a recipe is, and the registry recipes join.

A recipe is a class with `id`, `title`, `languages`, `applies(analysis)` and
`candidates(source, analysis)`; each candidate changes one variable and carries a hypothesis. A
recipe module registers its class with `@register` when it is imported (playbook.base imports
them all). `PatternRecipe` is the base of the recipes that recognise a source pattern and say
why when they do not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Collection, Iterable, Protocol

from playbook.analysis import Analysis
from playbook.cst.source import Skip


@dataclass(frozen=True)
class SweepValue:
    """One value of a swept variable: its source, and the key of the one-step candidate that sets it
    (tried once the value was swept, so no later step measures it again)."""

    value: int
    key: str
    source: str

    @property
    def label(self) -> str:
        """The value's implementation label in the sweep's judged measurement."""
        return f"sweep-{self.value}"


@dataclass(frozen=True)
class Sweep:
    """Several values of a candidate's one numeric variable, timed in one judged measurement beside
    the incumbent; the best is then measured again alone, as an ordinary step (`loop.run.sweep`)."""

    variable: str  # as titles name it: "BLOCK", "softmax_kernel occupancy"
    current: str  # its value in the source: "128", "auto"
    base: str  # the keys' stem, e.g. "launch-param:BLOCK"
    values: tuple[SweepValue, ...]
    hypothesis: str = ""  # what should move over the values (the step's own hypothesis when empty)

    @property
    def key(self) -> str:
        return f"{self.base}=sweep({','.join(str(v.value) for v in self.values)})"

    @property
    def title(self) -> str:
        return f"{self.variable} sweep {self.current} -> {{{','.join(str(v.value) for v in self.values)}}}"

    def named(self, value: int) -> str:
        """The optimization text of the step that keeps `value`: the values tried in parentheses."""
        return f"{self.variable} {self.current} -> {value} (swept {', '.join(str(v.value) for v in self.values)})"

    def untried(self, tried: Collection[str]) -> "Sweep | None":
        """The sweep without the values already tried (or kept) in this run; None when fewer than two
        are left, or when the sweep itself was tried (twice interrupted)."""
        left = tuple(v for v in self.values if v.key not in tried)
        if len(left) < 2 or self.key in tried:
            return None
        rest = replace(self, values=left)
        return None if rest.key in tried else rest


@dataclass(frozen=True)
class Candidate:
    recipe: str  # recipe id
    kind: str  # the variable it changes (for priority and demotion), e.g. "num_warps"
    key: str  # unique within a run: the same key is never tried twice
    title: str  # the optimization text of the record, e.g. "num_warps 1 -> 2"
    hypothesis: str
    source: str  # the whole rewritten target
    tier: int = 0  # 0: first-line moves; 1: second thoughts (e.g. a step back down), tried after every tier-0 move
    # more values of the same variable, this candidate's own first: the unattended loop and `step --recipe`
    # time them in one experiment; `step --key <key>` (and `playbook apply`) take this one value alone
    sweep: Sweep | None = None
    # the versions one measurement of this candidate compiles and times at every key the judge times: an
    # autotune's configs (what the playbook's order charges for it, `playbook.analysis.Experiment`); 1: one
    configs: int = 1


def with_sweep(cand: Candidate, variable: str, current: object, base: str,
               values: list[tuple[int, str, str]], hypothesis: str = "") -> Candidate:
    """`cand` carrying a sweep over `values` ((value, key, source), the candidate's own first); as it
    was when there is only its own."""
    if len(values) < 2:
        return cand
    return replace(cand, sweep=Sweep(variable, str(current), base, tuple(SweepValue(*v) for v in values), hypothesis))


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


def registered() -> dict[str, Recipe]:
    """The recipes registered so far, by id, in the order they registered."""
    return _REGISTRY


def inapplicable(recipe: Recipe, analysis: Analysis) -> str:
    """Why `recipe.applies(analysis)` said no: the recipe's own reason where its test is not the
    kernel class (`inapplicable(analysis)`), else the kernel's language and class."""
    own = getattr(recipe, "inapplicable", None)
    return (own(analysis) if own else None) or f"does not apply to a {analysis.language} {analysis.kernel_class} kernel"


# ----------------------------------------------------------------------------------- pattern recipes


class PatternRecipe:
    """Base for recipes that recognise a source pattern: `propose` raises `Skip` (with the reason)
    where the pattern is absent or unsafe to rewrite; `candidates` then returns [] without error."""

    id: str
    title: str
    languages: tuple[str, ...]

    def applies(self, analysis) -> bool:
        return analysis.language in self.languages

    def propose(self, source: str, analysis) -> list:
        raise NotImplementedError

    def attempt(self, source: str, analysis) -> tuple[list, str | None]:
        """The candidates for `source` and, when there are none, why: one pass of `propose`."""
        try:
            cands = self.propose(source, analysis)
        except Skip as exc:
            return [], str(exc)
        return cands, None if cands else "every candidate is already in place"

    def candidates(self, source: str, analysis) -> list:
        return self.attempt(source, analysis)[0]

    def skip_reason(self, source: str, analysis) -> str | None:
        """Why this recipe proposes nothing for `source` (None when it proposes something)."""
        if not self.applies(analysis):
            return f"{self.id} {inapplicable(self, analysis)}"
        return self.attempt(source, analysis)[1]


def off_path(kernels: Iterable[str], analysis: Analysis | None) -> list[str]:
    """Of `kernels`, those the entry point's forward path cannot launch (none when that is not known)."""
    return [] if analysis is None else [k for k in kernels if not analysis.on_path(k)]


def off_path_reason(left: list[str], analysis: Analysis) -> str:
    """Why a recipe leaves `left` alone: the entry point never runs them."""
    verb = "is" if len(left) == 1 else "are"
    return (f"{', '.join(left)} {verb} not on the forward path of {analysis.entry_text()} (launched only by a "
            f"backward pass, or not at all): left alone")


def on_path(kernels: dict, analysis: Analysis | None) -> dict:
    """`kernels` without those the entry point's forward path cannot launch; Skip with the reason
    when none is left."""
    left = off_path(kernels, analysis)
    if kernels and len(left) == len(kernels):
        raise Skip(off_path_reason(left, analysis))
    return {name: fn for name, fn in kernels.items() if name not in left}


def per_kernel(kernels: dict, attempt: Callable[[str, object], object],
               analysis: Analysis | None = None) -> tuple[list, list[str]]:
    """`attempt(name, fn)` for each kernel on the forward path of the analysis' entry point: the
    candidates it made, and the Skip reasons of the kernels it does not fit (a recipe proposes for
    every kernel that fits) and of those the entry point never launches."""
    out, reasons = [], []
    left = off_path(kernels, analysis)
    for name, fn in kernels.items():
        if name in left:
            continue
        try:
            out.append(attempt(name, fn))
        except Skip as exc:
            reasons.append(str(exc))
    if left:
        reasons.append(off_path_reason(left, analysis))
    return out, reasons


def proposed(out: list, reasons: list[str], nothing: str = "") -> list:
    """`out`, or Skip with every reason (`nothing` when there is none) when it is empty."""
    if not out:
        raise Skip("; ".join(reasons) or nothing)
    return out
