"""Which implementations of a judged measurement no CUDA graph may capture, read by the judge from
their sources (never from what a kernel process says about itself): a CUDA C target whose solve
synchronises (`loop.common.cuda_c.timed_form`). A capture of such a solve fails or, worse, records
a graph that does not do the work, so the judge times every implementation of that shape eagerly
(`loop.judge.bench.choose_method`) and says why."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from loop.common import cuda_c
from loop.common.messages import JobImpl


def eager_only(impls: Iterable[JobImpl]) -> dict[str, str]:
    """label -> why, for each implementation that must be timed eagerly: a `.cu` target of the
    synchronising form (one the judge cannot read counts as one)."""
    out: dict[str, str] = {}
    for impl in impls:
        path = Path(impl.path)
        if not cuda_c.is_cuda_target(path.name):
            continue
        try:
            form = cuda_c.timed_form(path.read_text(), path.name)
        except (OSError, UnicodeDecodeError):
            form = cuda_c.SYNCHRONISING
        if form == cuda_c.SYNCHRONISING:
            out[impl.label] = cuda_c.TIMING[cuda_c.SYNCHRONISING]
    return out
