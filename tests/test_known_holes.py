"""Holes the judge is known to have, kept as tests so that they are neither forgotten nor mistaken for
closed (docs/architecture.md, "What this does not catch"). `tests/known_holes/skip_when_sampled.py`
rewrites tileloop's sampler in its kernel process to skip the call whenever it takes a timed sample:
the replay the judge checks outputs at still does the work, and its claims agree with the judge's
clock. On a GPU a bound from physics refuses it (bytes moved faster than twice the copy bandwidth the
judge measured); under the interpreter nothing does yet (strict xfail: it fails once the hole closes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.judge.corroborate import BEYOND_COPY, beyond_copy
from test_judge import judged

HOLE = Path(__file__).parent / "known_holes" / "skip_when_sampled.py"


def test_a_claim_beyond_the_copy_bandwidth_is_refused():
    assert beyond_copy({"candidate": 2900.0}, 3000.0) is None  # an honest memory-bound kernel near the roofline
    assert beyond_copy({"candidate": None}, 3000.0) is None  # no bytes model
    assert beyond_copy({"candidate": 10 * 3000.0}, None) is None  # no reference (the CPU, tiny shapes)
    why = beyond_copy({"candidate": BEYOND_COPY * 3000.0 * 1.01}, 3000.0)
    assert why and why.startswith("candidate: claimed 6060 GB/s") and "copy bandwidth" in why


@pytest.mark.xfail(strict=True, reason="known hole: under the interpreter a sampler that skips timed calls is not caught")
def test_a_sampler_that_skips_timed_calls_is_refused_under_the_interpreter(tmp_path, env):
    raw = judged(tmp_path, HOLE)
    assert raw["status"] != "ok", raw["timing"]["shapes"][0]["corroboration"]


@pytest.mark.gpu
def test_a_sampler_that_skips_timed_calls_is_refused_on_a_gpu(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    raw = judged(tmp_path, HOLE, device="cuda")
    assert raw["status"] == "uncorroborated" and raw["failed_impl"] == "candidate", raw
    assert "copy bandwidth" in raw["message"]
