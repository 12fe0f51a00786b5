"""Statistics of timing samples, pure Python, shared by worker and orchestrator: summaries of one
implementation's samples, and the paired comparison of two implementations timed interleaved."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Sequence


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


@dataclass(frozen=True)
class ShapeComparison:
    shape: tuple
    speedup: float
    lo: float
    hi: float
    log_effect: float
    log_se: float
    n: int

    def to_json(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def median_interval(xs: Sequence[float], z: float) -> tuple[float, float]:
    """A distribution-free interval for the median of `xs`: the order statistics k and n-1-k, with
    k = floor((n - z*sqrt(n)) / 2) (the sign test's binomial, normal approximation), at least 0. It
    assumes nothing of the spread: a few samples taken while other work shared the host (a load that
    comes and goes in bursts) widen it, where a spread estimated from the middle samples (MAD) would
    call a burst that hit most pairs alike an effect. Under about z*z samples it is min..max."""
    ys = sorted(xs)
    if not ys:
        raise ValueError("an interval of no samples")
    n = len(ys)
    k = max(0, math.floor((n - z * math.sqrt(n)) / 2))
    return ys[k], ys[n - 1 - k]


def _mad(xs: Sequence[float], center: float) -> float:
    return statistics.median(abs(x - center) for x in xs)


def paired(shape, incumbent_ms: Sequence[float], candidate_ms: Sequence[float], z: float, floor: float) -> ShapeComparison:
    """Paired comparison of interleaved samples at one shape (speedup > 1: candidate faster).

    Sample i of each implementation comes from the same round, so the log-ratios d_i =
    log(t_incumbent / t_candidate) pair up; their median is the effect, its robust standard error
    1.2533 * 1.4826 * MAD / sqrt(n), and the interval +- z * se, never narrower than +- `floor`."""
    if len(incumbent_ms) != len(candidate_ms):
        raise ValueError(f"interleaved samples must pair up: {len(incumbent_ms)} vs {len(candidate_ms)} at shape {shape}")
    n = len(incumbent_ms)
    if n == 0:
        raise ValueError(f"no samples to compare at shape {shape}")
    if min(incumbent_ms) <= 0 or min(candidate_ms) <= 0:
        raise ValueError(f"timings must be positive at shape {shape}")
    d = [math.log(a / b) for a, b in zip(incumbent_ms[:n], candidate_ms[:n])]
    center = statistics.median(d)
    sigma = 1.4826 * _mad(d, center)
    if sigma == 0.0 and n > 1:
        sigma = statistics.stdev(d)
    se = 1.2533 * sigma / math.sqrt(n) if n > 1 else math.inf
    half = max(z * se, math.log1p(floor))
    return ShapeComparison(tuple(shape), math.exp(center), math.exp(center - half), math.exp(center + half), center, se, n)

