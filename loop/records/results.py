"""Records: one schema-versioned JSON line per iteration in `sandbox/<run>/results.jsonl`,
append-only (a torn last line from a kill is ignored on read). `loop.records.perf_table` renders
perf_results.md from them; `loop.records.history` rebuilds the same rows from git trailers alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from loop.common.messages import Change, Decision, Failure, Stop

RECORD_SCHEMA = "tileloop.record/1"
Status = Literal["keep", "revert", "crash", "unmeasured"]
NOT_CHECKED = "not checked"  # the correctness of an experiment that never reached its checks (an interruption)


def fmt_ms(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def ref_of(run_id: str, iteration: int) -> str:
    """Where an experiment that is not kept lives on: refs/tileloop/<run>/<iteration>."""
    return f"refs/tileloop/{run_id}/{iteration}"


@dataclass(frozen=True)
class BackendResult:
    """What one backend said about one iteration. `cell` is its perf_results.md column text."""

    name: str
    available: bool
    status: str  # ok | unavailable | compile_error | runtime_error | timeout | oom | incorrect | not_run | unmeasured
    reason: str = ""
    latency_ms: float | None = None  # candidate: geometric mean over benchmark shapes of the medians
    incumbent_ms: float | None = None
    correctness: str | None = None  # PASS | FAIL | None when not run
    timing_label: str = "gpu"  # gpu | interpreter
    proof: dict | None = None
    shapes: list[dict] = field(default_factory=list)
    worker_dir: str | None = None
    # the judge's drawn checks ({draws: [{index, shape, dtype, seed, transform, labels, skipped?}], notes, bounds}):
    # a failure replays from its seed, shape, dtype and transform (`loop.judge.drawn`); None before they existed
    drawn: dict | None = None
    # the target implementation's kernels the correctness checks launched and host functions they called
    # (`loop.target.coverage`); None where nothing says (no checks ran, an external harness, a record before them)
    launched: list[str] | None = None
    called: list[str] | None = None

    @property
    def cell(self) -> str:
        if not self.available:
            return f"unavailable: {self.reason}"
        if self.status == "ok" and self.latency_ms is not None:
            return fmt_ms(self.latency_ms)
        if self.status == "unmeasured":
            return "unmeasured"
        if self.status == "not_run":
            return f"not run: {self.reason}" if self.reason else "not run"
        return self.status

    def to_json(self) -> dict:
        """Its record JSON: `launched` and `called` only where known (a record is written as it was before them)."""
        d = asdict(self)
        for key in ("launched", "called"):
            if d[key] is None:
                del d[key]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "BackendResult":
        return cls(**d)

    def unmeasured(self, why: str) -> "BackendResult":
        """This result with its timing left out: correct, but the change cannot show in these timings
        (the worker's own result file keeps what it timed); what its checks ran is kept."""
        if self.status != "ok":
            return self
        return replace(self, status="unmeasured", reason=why, latency_ms=None, incumbent_ms=None, shapes=[])


@dataclass(frozen=True)
class Record:
    run: str
    iteration: int
    optimization: str
    status: Status
    correctness: str  # PASS | FAIL | not checked (an interrupted experiment)
    latency_ms: float | None
    target_backend: str
    backends: dict[str, BackendResult]
    commit: str | None
    parent: str | None
    hypothesis: str = ""
    rationale: str = ""
    expected: str = ""
    kind: str = ""  # the variable the change touched (recipe kind), "agent" for hand edits
    recipe: str | None = None
    speedup: float | None = None  # paired, from this iteration's own measurement (the decision's)
    cumulative_speedup: float | None = None  # the best version after this iteration vs the baseline: kept speedups multiplied
    timing: str = ""  # interpreter | gpu | harness: how this iteration was timed
    change: Change | None = None  # what the change is and whether it can show ({} in the JSON: the baseline's)
    unchecked: list[str] = field(default_factory=list)  # dtypes the correctness checks could not run, with why
    decision: Decision | None = None  # {} in the JSON where a record has none
    stop: Stop | None = None  # the stop state after it ({} in the JSON: the baseline's)
    failure: Failure | None = None  # the target backend's failure
    compile: dict = field(default_factory=dict)  # the ahead-of-time gate: status and per-arch registers/spills
    harness: dict | None = None  # an external run's commands ({test_cmd, bench_cmd, bench_repeats}), else None
    sweep: dict | None = None  # the sweep that chose this version: every value's paired result (`loop.run.sweep`)
    env: dict = field(default_factory=dict)
    source_hash: str = ""
    started: str = ""
    finished: str = ""
    wall_s: float = 0.0
    schema: str = RECORD_SCHEMA

    def to_json(self) -> dict:
        d = asdict(self)
        d["backends"] = {k: v.to_json() for k, v in self.backends.items()}
        d.update(change=self.change.to_json() if self.change else {},
                 decision=self.decision.to_json() if self.decision else {},
                 stop=self.stop.to_json() if self.stop else {},
                 failure=self.failure.to_json() if self.failure else None)
        if d["sweep"] is None:  # a record without a sweep is written as it was before sweeps
            del d["sweep"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Record":
        if d.get("schema") != RECORD_SCHEMA:
            raise ValueError(f"record schema {d.get('schema')!r} is not {RECORD_SCHEMA!r}")
        d = dict(d)
        d["backends"] = {k: BackendResult.from_json(v) for k, v in d["backends"].items()}
        d.update(change=Change.from_json(d["change"]) if d.get("change") else None,
                 decision=Decision.from_json(d["decision"]) if d.get("decision") else None,
                 stop=Stop.from_json(d["stop"]) if d.get("stop") else None,
                 failure=Failure.from_json(d["failure"]) if d.get("failure") else None)
        return cls(**d)

    @property
    def interpreter(self) -> bool:
        tb = self.backends.get(self.target_backend)
        return tb is not None and tb.timing_label == "interpreter"

    @property
    def timing_mode(self) -> str:
        """interpreter | gpu | harness (records written before the field: from the backend and harness)."""
        if self.timing:
            return self.timing
        return "harness" if self.harness else "interpreter" if self.interpreter else "gpu"

    @property
    def lo(self) -> float | None:
        return self.decision.lo if self.decision and self.speedup is not None else None

    @property
    def hi(self) -> float | None:
        return self.decision.hi if self.decision and self.speedup is not None else None

    @property
    def verdict(self) -> str | None:
        """The decision's verdict (None in a record without a decision)."""
        return self.decision.verdict if self.decision else None


def cumulative(records: list[Record]) -> float:
    """The product of the kept experiments' paired speedups: the best version against the baseline,
    from the iterations' own measurements (never one session's latency over another's)."""
    out = 1.0
    for r in records:
        if r.iteration >= 1 and r.status == "keep" and r.speedup is not None:
            out *= r.speedup
    return out


def append_record(path: Path, record: Record) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record.to_json(), sort_keys=True, default=str)
    with open(path, "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_records(path: Path) -> list[Record]:
    """All complete records; a torn final line (a kill mid-write) is skipped, any other bad line raises."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(Record.from_json(json.loads(line)))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
    return out
