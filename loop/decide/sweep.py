"""A sweep's choice: several values of one variable timed in one judged measurement beside the
incumbent, each value's paired result against the incumbent, and the value to measure again alone.
Pure functions, no I/O.

Each value's result is the same paired comparison an iteration's decision uses (`rules.comparisons`:
per shape the median of the round-by-round log-ratios, the geometric mean over the shapes, its
interval), read from one measurement in which every value and the incumbent were interleaved. The
best value is the one of highest geometric-mean paired speedup. That is the best of k estimates, so
it is biased upwards (the winner of four noisy draws looks better than it is): the choice only says
which value to try; whether it is kept is decided on a fresh paired measurement of that value alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

from loop.common.messages import Timing
from loop.decide.rules import Policy, combine, compare_shape

NOT_MEASURED = "not_measured"  # a value the sweep could not time (the measurement failed for another reason)
NOT_TIMED = "not_timed"  # a sweep whose variable cannot show in the timing mode: no value is timed


@dataclass(frozen=True)
class ValueResult:
    """One swept value: `status` ok with its paired speedup against the incumbent (interval and per
    shape), or why it has none (a failure status of the judge, not_measured, not_timed)."""

    value: int
    key: str
    status: str
    reason: str = ""
    speedup: float | None = None
    lo: float | None = None
    hi: float | None = None
    shapes: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def value_result(value: int, key: str, label: str, timing: Timing, policy: Policy) -> ValueResult:
    """`label`'s paired result against the incumbent, from one judged measurement's timing result."""
    shapes = [compare_shape(s.shape, s.samples("incumbent"), s.samples(label), policy) for s in timing.shapes]
    speedup, lo, hi = combine(shapes, policy)
    rows = [{"shape": list(s.shape), "speedup": s.speedup, "lo": s.lo, "hi": s.hi} for s in shapes]
    return ValueResult(value, key, "ok", "", speedup, lo, hi, rows)


def failed(value: int, key: str, status: str, reason: str) -> ValueResult:
    return ValueResult(value, key, status, reason)


def choose(results: Sequence[ValueResult]) -> ValueResult | None:
    """The value to measure again alone: the highest geometric-mean paired speedup among the values
    the sweep timed (the first in sweep order on a tie); None when none was timed."""
    timed = [r for r in results if r.status == "ok" and r.speedup is not None]
    return max(timed, key=lambda r: r.speedup) if timed else None


def charged(status: str, failed_impl: str | None, message: str, labels: Sequence[str]) -> str | None:
    """Which of the sweep's `labels` a failed measurement is charged to: the one the judge's reason
    names first (`<label>: ...`, how a refused timing names its implementation), else the judge's
    `failed_impl` when it is one of them; None when the failure is nobody's among them (the
    incumbent's, or the judge's own)."""
    if status == "uncorroborated":
        named = [(message.find(f"{label}:"), label) for label in labels if f"{label}:" in message]
        if named:
            return min(named)[1]
    return failed_impl if failed_impl in labels else None

