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
STAGES: tuple[str, ...] = get_args(Stage)


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
