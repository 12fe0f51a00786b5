"""Decisions: keep, revert or stop, as pure functions over measurements (no I/O, no clock).

rules       the policy, the paired comparison per shape, the keep/revert verdict and the stop rules
measurable  whether a change (its kinds of differences) can show in a timing mode
check       decision-check's verdicts: each trial of a planted or A/A scenario decided by the rules

The names below are the package's interface: `decide.Policy`, `decide.decide(...)`, ...
"""

from loop.decide.measurable import Change, Measurability, measurability
from loop.decide.rules import (
                               CRASH_STATUSES,
                               VOID,
                               Action,
                               Decision,
                               Outcome,
                               Policy,
                               Progress,
                               ShapeComparison,
                               Stop,
                               combine,
                               compare_shape,
                               comparisons,
                               decide,
                               judged_decision,
                               stop_state,
                               stopping,
                               void,
)

__all__ = ["CRASH_STATUSES", "VOID", "Action", "Change", "Decision", "Measurability", "Outcome", "Policy", "Progress", "ShapeComparison",
           "Stop", "combine", "compare_shape", "comparisons", "decide", "judged_decision", "measurability", "stop_state",
           "stopping", "void"]
