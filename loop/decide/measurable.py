"""Whether a change can show in a timing mode: a pure function over a description of the change.

A change between the incumbent and the candidate source is described by the kinds of differences
it makes (`loop.target.change` computes them from the two sources):

    formatting        comments, whitespace, docstrings, names of constants: nothing that runs differs
    launch            launch settings: num_warps, num_stages, num_ctas, maxnreg, occupancy
    cache_hint        eviction_policy / cache_modifier arguments of loads and stores
    autotune_configs  an autotuner's configs beyond its first (or the autotuner itself, where its first
                      config is the launch it replaces)
    persistent        a persistent-grid rewrite: programs that loop over the work, a grid sized by the SMs
    code              anything else: the computed code

A timing mode is how the iteration is timed: `interpreter` (the Triton interpreter's wall clock on
the CPU), `gpu` (a GPU backend: CUDA-graph replay or events), `harness` (a repository's own bench
command). The interpreter runs each program one after another in numpy: it ignores launch settings
and cache hints, runs an autotuner's first config only (tileloop pins it there), and times a
persistent grid by how its Python loop runs, which says nothing about how the GPU schedules it.

A change can show when some part of it can change the timing and no part of it distorts the timing
into something else: `code` shows everywhere; launch, cache and autotune changes show on a GPU and in
a harness, not under the interpreter; a persistent rewrite shows on a GPU and distorts interpreter
timings; a formatting change shows nowhere. An empty change (an A/A check) is timed: measuring the
noise is its purpose.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from loop.common.messages import CHANGE_KINDS as KINDS
from loop.common.messages import Change

MODES = ("interpreter", "gpu", "harness")

# what each kind is, for reasons a person reads
KIND_TEXT = {
    "formatting": "comments, whitespace or docstrings",
    "launch": "launch settings",
    "cache_hint": "cache hints",
    "autotune_configs": "autotune configs beyond the first",
    "persistent": "a persistent grid",
    "code": "computed code",
}
MODE_TEXT = {"interpreter": "Triton interpreter timings", "gpu": "GPU timings",
             "harness": "the bench command's timings"}
# why a kind cannot show in a mode (absent: it can)
WHY_NOT = {
    ("formatting", "interpreter"): "nothing that runs differs",
    ("formatting", "gpu"): "nothing that runs differs",
    ("formatting", "harness"): "nothing that runs differs",
    ("launch", "interpreter"): "the interpreter ignores launch settings",
    ("cache_hint", "interpreter"): "the interpreter has no caches to hint",
    ("autotune_configs", "interpreter"): "the interpreter runs an autotuner's first config only",
    ("persistent", "interpreter"): "the interpreter runs programs one after another, so its time says "
                                   "nothing about how a GPU schedules the grid",
}
DISTORTS = {("persistent", "interpreter")}  # kinds whose timing in a mode measures something else


@dataclass(frozen=True)
class Measurability:
    measurable: bool
    reason: str
    mode: str
    kinds: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def _describe(kind: str, change: Change) -> str:
    text = KIND_TEXT[kind]
    if kind in ("launch", "cache_hint") and change.details:
        words = [d for d in change.details if (d in ("eviction_policy", "cache_modifier")) == (kind == "cache_hint")]
        if words:
            text += f" ({', '.join(words)})"
    return text


def measurability(change: Change, mode: str) -> Measurability:
    """Whether `change` can show in timings of `mode`, and why (a reason naming the kind and the mode)."""
    if mode not in MODES:
        raise ValueError(f"unknown timing mode {mode!r}; known: {', '.join(MODES)}")
    kinds = [k for k in KINDS if k in change.kinds]
    where = MODE_TEXT[mode]
    if not kinds:
        return Measurability(True, f"identical sources (an A/A check): timed to measure the noise of {where}", mode)
    distorting = [k for k in kinds if (k, mode) in DISTORTS]
    if distorting:
        k = distorting[0]
        return Measurability(False, f"a change to {_describe(k, change)} cannot show in {where}: {WHY_NOT[(k, mode)]}",
                             mode, kinds)
    showing = [k for k in kinds if (k, mode) not in WHY_NOT]
    hidden = [k for k in kinds if (k, mode) in WHY_NOT]
    why = "; ".join(dict.fromkeys(WHY_NOT[(k, mode)] for k in hidden))
    if not showing:
        return Measurability(False, f"a change to {' and '.join(_describe(k, change) for k in hidden)} cannot show in "
                             f"{where}: {why}", mode, kinds)
    reason = f"a change to {' and '.join(_describe(k, change) for k in showing)} can show in {where}"
    if hidden:
        reason += f" (not its part in {' and '.join(_describe(k, change) for k in hidden)}: {why})"
    return Measurability(True, reason, mode, kinds)
