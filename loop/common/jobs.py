"""The worker protocol, shared by both sides: the orchestrator writes a job file and starts
`python -m loop.worker --job JOB.json --result RESULT.json`; the worker writes one result file
(schema RESULT_SCHEMA) atomically. Nothing else crosses the boundary.

Also here: the seeds of fresh inputs (derived the same way on both sides) and the constants of
the decision-check job that the orchestrator needs to size its time limit.
"""

from __future__ import annotations

import hashlib

RESULT_SCHEMA = "tileloop.worker/1"
MAX_PROBES = 8  # decision-check calibration measurements per shape (the first is the one-element floor)
VERIFY_ROUNDS = {"cuda": 10, "cpu": 3}  # separate plain-vs-planted measurements pooled into the planted ratio
TIMING_METHODS = ("graph", "eager")  # what a judge's job may ask for (`method`); absent: the judge chooses


def seed_for(base: int, *parts) -> int:
    digest = hashlib.sha256(repr((base,) + parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def shape_text(shape) -> str:
    return "all" if shape == "all" else "x".join(str(d) for d in shape)

