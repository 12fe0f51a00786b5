"""Summary statistics of timing samples (pure Python, shared by worker and orchestrator)."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list."""
    if not sorted_xs:
        raise ValueError("quantile of no samples")
    pos = (len(sorted_xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Stats:
    median_ms: float
    iqr_ms: float
    mean_ms: float
    rel_std: float
    min_ms: float
    max_ms: float
    nrep: int

    def to_json(self) -> dict:
        return asdict(self)


def summarize(samples_ms: list[float]) -> Stats:
    xs = sorted(samples_ms)
    mean = statistics.fmean(xs)
    std = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return Stats(
        median_ms=quantile(xs, 0.5),
        iqr_ms=quantile(xs, 0.75) - quantile(xs, 0.25),
        mean_ms=mean,
        rel_std=std / mean if mean > 0 else 0.0,
        min_ms=xs[0],
        max_ms=xs[-1],
        nrep=len(xs),
    )


def geomean(xs: list[float]) -> float:
    if not xs or any(x <= 0 for x in xs):
        raise ValueError(f"geometric mean needs positive values, got {xs}")
    return math.exp(statistics.fmean(math.log(x) for x in xs))
