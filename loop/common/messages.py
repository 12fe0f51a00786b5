"""The messages of one iteration, typed once in the shared leaf: the in-flight marker that state.json
keeps, and the parts of a record (its change, decision, stop state and failure). Each is a frozen
dataclass whose `to_json` writes the very dict the run wrote before it was typed (a key left out where
it was left out) and whose `from_json` reads that dict back, from files of earlier runs too.

The orchestrator, the judge and the worker may all import this module: it imports nothing of tileloop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Literal, get_args

# ------------------------------------------------------------------------------ the in-flight marker

# where an iteration is when state.json is written: the baseline starts (init) and is verified and
# measured; a candidate is swept, applied, committed, verified, measured, decided and recorded
Stage = Literal["start", "sweep", "apply", "commit", "verify", "measure", "decide", "record"]


@dataclass(frozen=True)
class Inflight:
    """The iteration in flight and its stage, so that `tileloop resume` after a kill at any point can
    finish or record it exactly once. The baseline's marker (iteration 0) names no candidate: its key,
    hypothesis and recipe are left out of the JSON; a candidate's marker always carries them (null
    where an agent's edit has none). `started` and `kind` are known from the commit stage (a sweep
    knows its kind), `commit` once the candidate is committed, `sweep` where a sweep chose the version."""

    iteration: int
    stage: Stage
    optimization: str = ""
    key: str | None = None
    hypothesis: str | None = None
    recipe: str | None = None
    started: str | None = None
    kind: str | None = None
    commit: str | None = None
    sweep: dict | None = None  # the record's sweep summary (`loop.run.sweep`)

    def at(self, stage: Stage, commit: str | None = None) -> "Inflight":
        """This marker at `stage` (with the candidate's commit, once it is made)."""
        return replace(self, stage=stage, commit=self.commit if commit is None else commit)

    def to_json(self) -> dict:
        d: dict = {"iteration": self.iteration, "stage": self.stage, "optimization": self.optimization}
        if self.iteration >= 1:
            d.update(key=self.key, hypothesis=self.hypothesis, recipe=self.recipe)
        d.update({k: v for k, v in (("started", self.started), ("kind", self.kind), ("commit", self.commit),
                                    ("sweep", self.sweep)) if v is not None})
        return dict(sorted(d.items()))  # state.json's order (it is written with sorted keys)

    @classmethod
    def from_json(cls, d: dict) -> "Inflight":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ------------------------------------------------------------------------------------ the record's parts

# what differs between two versions of the target (`loop.target.change` finds them, `loop.decide.measurable`
# says which can show in a timing mode)
ChangeKind = Literal["formatting", "launch", "cache_hint", "autotune_configs", "persistent", "code"]
CHANGE_KINDS: tuple[str, ...] = get_args(ChangeKind)


@dataclass(frozen=True)
class Change:
    """The kinds of differences between two versions of the target and their details (the launch
    keywords or hints that differ, where a kind has any), e.g. kinds {"launch"}, details ("num_warps",);
    in a record, with whether it can show in the run's timing mode and why (`measurable`, `reason`:
    None and left out of the JSON before that is asked)."""

    kinds: frozenset[str]
    details: tuple[str, ...] = ()
    hint: str = ""  # what the recipe that made the candidate says it changes, where one did
    measurable: bool | None = None
    reason: str = ""

    def __post_init__(self):
        unknown = set(self.kinds) - set(CHANGE_KINDS)
        if unknown:
            raise ValueError(f"unknown change kind(s) {sorted(unknown)}; known: {', '.join(CHANGE_KINDS)}")

    def to_json(self) -> dict:
        d: dict = {"kinds": sorted(self.kinds, key=CHANGE_KINDS.index), "details": list(self.details), "hint": self.hint}
        if self.measurable is not None:
            d.update(measurable=self.measurable, reason=self.reason)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Change":
        return cls(frozenset(d.get("kinds", ())), tuple(d.get("details", ())), d.get("hint", ""), d.get("measurable"),
                   d.get("reason", ""))


Action = Literal["keep", "revert", "crash", "unmeasured", "remeasure"]
Verdict = Literal["baseline", "improved", "low_gain", "marginal", "within_noise", "regression", "incorrect",
                  "uncorroborated", "guard_failed", "unexercised", "suspicious", "compile_error", "runtime_error",
                  "timeout", "oom", "interrupted", "unmeasured", "void"]
Priority = Literal["normal", "low"]


@dataclass(frozen=True)
class Decision:
    """The keep / revert decision on one iteration (`loop.decide.rules`), as its record keeps it. The
    baseline's has no action (nothing was decided: the code as given) and is written as its verdict and
    reason only; `remeasured` is known to an iteration's decision (None and left out before it is)."""

    action: Action | None
    verdict: Verdict
    reason: str
    speedup: float | None = None
    lo: float | None = None
    hi: float | None = None
    priority: Priority = "normal"  # low: a kind kept at a low gain, tried last from now on
    stop_after: bool = False
    shapes: list[dict] = field(default_factory=list)  # the paired comparison of each shape (`ShapeComparison.to_json`)
    remeasured: bool | None = None

    def to_json(self) -> dict:
        if self.action is None:
            return {"verdict": self.verdict, "reason": self.reason}
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "remeasured"}
        d["shapes"] = [dict(s) for s in self.shapes]
        return d if self.remeasured is None else {**d, "remeasured": self.remeasured}

    @classmethod
    def from_json(cls, d: dict) -> "Decision":
        names = {f.name for f in fields(cls)}
        return cls(**{"action": None, **{k: v for k, v in d.items() if k in names}})


StopName = Literal["continue", "stop", "escalate"]
TimingMode = Literal["interpreter", "gpu", "harness"]  # how a run's iterations are timed


@dataclass(frozen=True)
class Stop:
    """Where the stop rules stand after an iteration: continue, stop (a rule fired) or escalate (a person
    is needed), why, and the timings the rules read (interpreter | gpu | harness; None and left out of
    the JSON in stop states written before it was kept)."""

    state: StopName
    reason: str
    timing: TimingMode | None = None

    def to_json(self) -> dict:
        d: dict = {"state": self.state, "reason": self.reason}
        return d if self.timing is None else {**d, "timing": self.timing}

    @classmethod
    def from_json(cls, d: dict) -> "Stop":
        return cls(d["state"], d["reason"], d.get("timing"))


@dataclass(frozen=True)
class Failure:
    """The target backend's failure: its typed status (compile_error, runtime_error, timeout, oom,
    incorrect, uncorroborated, fallback, interrupted, ...: an open set, a worker or harness may name its
    own) and what failed, in words."""

    status: str
    message: str

    def to_json(self) -> dict:
        return {"status": self.status, "message": self.message}

    @classmethod
    def from_json(cls, d: dict) -> "Failure":
        return cls(d["status"], d["message"])
