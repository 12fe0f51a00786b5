"""Experience across runs: one JSON line per finished iteration, in a file that outlives runs
(`TILELOOP_EXPERIENCE`, default ~/.tileloop/experience.jsonl), and what it recommends.

An entry says which change (recipe kind and key) was tried on which kind of kernel (class,
language), backend and architecture, and how it went (keep/revert/crash, speedup). `recommend`
ranks change kinds for a kernel class/backend/arch by their kept fraction and mean speedup;
the playbook's ordering uses that rank before its static priority order.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path

SCHEMA = "tileloop.experience/1"


def path() -> Path:
    return Path(os.environ.get("TILELOOP_EXPERIENCE") or Path.home() / ".tileloop" / "experience.jsonl")


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
    outcome: str  # keep | revert | crash
    verdict: str
    speedup: float | None
    run: str
    date: str
    schema: str = SCHEMA


FIELDS = {f.name for f in fields(Entry)}


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
    """Per change kind: tries, kept fraction, crash fraction, geometric-mean speedup of the kept ones."""
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


def recommend(entries: list[Entry], kernel_class: str, backend: str, arch: str | None = None) -> list[dict]:
    """Change kinds ranked for this kind of kernel; falls back to the class alone when the backend has no history."""
    rows = stats(matching(entries, kernel_class, backend, arch))
    if not rows:
        rows = stats(matching(entries, kernel_class))
    return rows
