"""Experience across runs: one JSON line per finished iteration, in a file that outlives runs
(`TILELOOP_EXPERIENCE`, default ~/.tileloop/experience.jsonl), and what it recommends.

An entry says which change (recipe kind and key) was tried on which kind of kernel (class,
language), backend and architecture, how it was timed (timing mode: interpreter, gpu or harness;
the device) and how it went (keep/revert/crash/unmeasured, speedup). `recommend` ranks change kinds
for a kernel class/backend/arch by their kept fraction and mean speedup, from entries of the same
timing lane only: a GPU backend's ranking never reads interpreter timings (nor entries written
before the timing mode was recorded, read as mode `unknown`), and unmeasured entries, which
measured nothing, are not counted. An experiment that says nothing of its change (interrupted by a
kill, or its measurement void: `learned_from`) is never written. The playbook's ordering uses that
rank before its static priority order.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from loop import backends as backend_registry
from loop.common.settings import experience_file

SCHEMA = "tileloop.experience/1"
UNKNOWN = "unknown"  # the timing mode of entries written before it was recorded


def path() -> Path:
    return experience_file()


@dataclass(frozen=True)
class Entry:
    op: str
    kernel_class: str
    language: str
    backend: str
    arch: str
    kind: str  # the variable changed (block, num_warps, occupancy, ...) or "agent" for hand edits
    key: str
    optimization: str
    outcome: str  # keep | revert | crash | unmeasured
    verdict: str
    speedup: float | None
    run: str
    date: str
    schema: str = SCHEMA
    timing: str = UNKNOWN  # interpreter | gpu | harness: how the outcome was timed
    device: str = ""  # the GPU's name, or CPU


FIELDS = {f.name for f in fields(Entry)}
NOTHING_LEARNED = ("interrupted", "void")  # verdicts of experiments that say nothing of their change


def learned_from(verdict: str | None) -> bool:
    """Whether an experiment of this verdict goes into the experience log."""
    return verdict not in NOTHING_LEARNED


def append(entry: Entry, where: Path | None = None) -> None:
    p = where or path()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as fh:
        fh.write(json.dumps(asdict(entry), sort_keys=True) + "\n")


def load(where: Path | None = None) -> list[Entry]:
    p = where or path()
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line from a kill
        if d.get("schema") == SCHEMA:  # fields are only added within a version: a newer entry's others are skipped
            out.append(Entry(**{k: v for k, v in d.items() if k in FIELDS}))
    return out


def matching(entries: list[Entry], kernel_class: str | None = None, backend: str | None = None,
             arch: str | None = None, language: str | None = None) -> list[Entry]:
    return [e for e in entries if (kernel_class is None or e.kernel_class == kernel_class)
            and (backend is None or e.backend == backend) and (arch is None or e.arch == arch)
            and (language is None or e.language == language)]


def stats(entries: list[Entry]) -> list[dict]:
    """Per change kind: tries, kept fraction, crash fraction, geometric-mean speedup of the kept ones.
    Unmeasured entries are no tries: they measured nothing."""
    entries = [e for e in entries if e.outcome != "unmeasured"]
    groups: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        groups[e.kind].append(e)
    rows = []
    for kind, es in groups.items():
        kept = [e for e in es if e.outcome == "keep" and e.speedup]
        gm = math.exp(sum(math.log(e.speedup) for e in kept) / len(kept)) if kept else None
        rows.append({"kind": kind, "tries": len(es), "kept": len(kept), "kept_fraction": round(len(kept) / len(es), 3),
                     "crash_fraction": round(sum(e.outcome == "crash" for e in es) / len(es), 3),
                     "geomean_speedup_kept": round(gm, 4) if gm else None})
    return sorted(rows, key=lambda r: (-score(r), r["kind"]))


def score(row: dict) -> float:
    """Expected log-gain per try, shrunk towards zero for few tries (a prior of 2 neutral tries)."""
    gain = math.log(row["geomean_speedup_kept"]) if row["geomean_speedup_kept"] else 0.0
    return row["kept"] * gain / (row["tries"] + 2)


def lane(backend: str) -> str:
    """The timing mode a backend's ranking may read: gpu for a GPU backend, else its own (interpreter, harness)."""
    if backend in backend_registry.BACKENDS:
        return backend_registry.get(backend).timing_label
    return backend


@dataclass(frozen=True)
class Recommendation:
    """Change kinds ranked for one kind of kernel, and what the ranking was read from."""

    rows: list[dict]
    lane: str  # the timing mode of the entries used
    used: int  # entries the ranking counted
    scope: str  # which entries: the backend's (and arch's), or the lane's when the backend has none
    left_out: dict[str, int] = field(default_factory=dict)  # entries of the kernel class not counted, by why

    def to_json(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        left = ", ".join(f"{n} {why}" for why, n in self.left_out.items() if n)
        return (f"ranked from {self.used} {self.lane} entr{'y' if self.used == 1 else 'ies'} ({self.scope})"
                + (f"; not counted: {left}" if left else ""))


def recommend(entries: list[Entry], kernel_class: str, backend: str, arch: str | None = None) -> Recommendation:
    """Change kinds ranked for this kind of kernel from entries of the backend's timing lane, decided on
    their timing (not unmeasured); falls back to the lane's other backends when this one has no history."""
    mode = lane(backend)
    same_class = matching(entries, kernel_class)
    usable = [e for e in same_class if e.timing == mode and e.outcome != "unmeasured"]
    left_out = {"of another timing mode": sum(e.timing not in (mode, UNKNOWN) for e in same_class),
                "of unknown timing mode": sum(e.timing == UNKNOWN for e in same_class),
                "unmeasured": sum(e.timing == mode and e.outcome == "unmeasured" for e in same_class)}
    own = matching(usable, kernel_class, backend, arch)
    scope = f"{kernel_class} kernels on {backend}" + (f", {arch}" if arch else "")
    if not own:
        own, scope = usable, f"{kernel_class} kernels on any {mode} backend ({backend} has none)"
    return Recommendation(stats(own), mode, len(own), scope, left_out)
