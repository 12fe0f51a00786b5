"""`suite summarize --unattended-json`: the suite tuned unattended, as one list of numbers and a page.

One object per (target, benchmark shape, dtype) that the target's final measurement (`tileloop
report --measure`) timed: the tuned kernel's time, torch eager's and torch.compile's (null where the
final measurement had torch.compile `unavailable`: never the time of an eager fallback), its
fraction of the same-run clone bandwidth (null for a compute-bound op), torch.matmul's time for
matmul (the matmul spec's torch eager is `a @ b`), the run's experiment count and wall time. Every
ratio is within that one measurement. The page beside it holds the same table with a verdict per row
against the unattended targets, the median seconds per experiment, the device and the commands.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from loop.common.files import atomic_write_text
from loop.records.perf_table import markdown_table
from loop.suite.profiles import note as profile_note
from loop.suite.summary import compute_bound as flop_bound
from loop.suite.worktrees import run_id_of

CLONE_TARGET = 0.95  # memory-bound ops: of the same-run clone bandwidth, at the largest benchmark shape
COMPILE_TARGET = 1.0  # every op: torch.compile's time over ours, at every benchmark shape
MATMUL_TARGET = 1.0  # matmul: torch.matmul's time over ours, at every benchmark shape
EXPERIMENT_S_TARGET = 30.0  # median wall seconds per experiment over the suite
MATMUL_OP = "matmul"


@dataclass(frozen=True)
class Row:
    """One object of the published list (its first ten fields are the issue's, in its order)."""

    op: str
    language: str
    shape: list[int]
    dtype: str
    best_ms: float
    eager_ms: float | None
    compile_ms: float | None
    clone_fraction: float | None
    experiments: int
    wall_s: float | None
    matmul_ms: float | None  # matmul only: torch.matmul, the matmul spec's torch eager
    memory_bound: bool  # the clone target applies (not matmul, not above the suite summary's COMPUTE_BOUND_FLOP_PER_BYTE)
    largest: bool  # the benchmark shape (and dtype) that moves the most bytes: where the clone target applies
    finished: bool  # the run's stop rule fired (not cut off, not stopped mid-way)

    def to_json(self) -> dict:
        out = asdict(self)
        if self.op != MATMUL_OP:
            del out["matmul_ms"]
        return out


def _number(cell, positive: bool = True) -> float | None:
    """A final measurement's cell as a number (a time: `positive`); None where it says why there is none."""
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and (value > 0 or not positive) else None


def _shape(text: str) -> list[int]:
    return [int(x) for x in str(text).split("x")]


def compute_bound(entry: dict) -> bool:
    """Matmul, or an op whose largest benchmark shape does more FLOPs per byte than a copy can say anything of."""
    return entry.get("op") == MATMUL_OP or flop_bound(entry)


def finished(entry: dict) -> bool:
    return (entry.get("stop") or {}).get("state") in ("stop", "escalate") and not entry.get("cut_off")


def experiments(entry: dict) -> int:
    """The experiments the run made: those with a wall time of their own (not one a stop interrupted),
    else, for an entry without them, every iteration after the baseline."""
    walls = entry.get("experiment_wall_s")
    return len(walls) if isinstance(walls, list) else int(entry["iterations"])


def wall_s(entry: dict) -> tuple[float | None, str]:
    """The run's wall time and what it is: the `tileloop run` process's (init to stop) where the
    suite ran it in one call; the sum of its records' wall times (baseline and experiments, over
    every session) where it was resumed, the suite's clock having seen only the last call."""
    if not entry.get("resumed") and isinstance(entry.get("suite_wall_s"), (int, float)):
        return float(entry["suite_wall_s"]), "run"
    if isinstance(entry.get("records_wall_s"), (int, float)):
        return float(entry["records_wall_s"]), "records"
    return None, "unknown"


def rows(entries: list[dict]) -> list[Row]:
    """The published list: one row per final-measurement row of each entry that has one."""
    out = []
    for e in sorted((e for e in entries if "error" not in e), key=lambda e: (e["op"], e["language"])):
        big = e.get("final_largest") or {}
        dense = compute_bound(e)
        for r in e.get("final") or []:
            best = _number(r.get("best (ms)"))
            if best is None:
                continue
            eager = _number(r.get("torch eager (ms)"))
            frac = r.get("best, fraction of clone bandwidth")
            out.append(Row(
                op=e["op"], language=e["language"], shape=_shape(r["shape"]), dtype=r["dtype"], best_ms=best,
                eager_ms=eager, compile_ms=_number(r.get("torch.compile (ms)")),
                clone_fraction=None if dense else _number(frac, positive=False), experiments=experiments(e),
                wall_s=wall_s(e)[0], matmul_ms=eager if e["op"] == MATMUL_OP else None, memory_bound=not dense,
                largest=(r["shape"], r["dtype"]) == (big.get("shape"), big.get("dtype")), finished=finished(e)))
    return out


def checks(row: Row) -> list[tuple[str, bool | None]]:
    """Each target that applies to the row: (what was measured against what, met; None: no value to judge)."""
    out = []
    if row.memory_bound and row.largest:
        frac = row.clone_fraction
        out.append((f"clone {frac:.2f} (needs >= {CLONE_TARGET:.2f})" if frac is not None else "clone fraction not measured",
                    None if frac is None else frac >= CLONE_TARGET))
    if row.op == MATMUL_OP:
        ratio = row.matmul_ms / row.best_ms if row.matmul_ms else None
        out.append((f"torch.matmul {ratio:.3f}x (needs >= {MATMUL_TARGET:.1f}x)" if ratio else "torch.matmul not timed",
                    None if ratio is None else ratio >= MATMUL_TARGET))
    ratio = row.compile_ms / row.best_ms if row.compile_ms else None
    out.append((f"torch.compile {ratio:.3f}x (needs >= {COMPILE_TARGET:.1f}x)" if ratio else "torch.compile unavailable",
                None if ratio is None else ratio >= COMPILE_TARGET))
    return out


def verdict(row: Row) -> str:
    """`met`, or `not met: ...` naming each target missed, or `not judged: ...` where a value is missing."""
    results = checks(row)
    missed = [what for what, ok in results if ok is False]
    unjudged = [what for what, ok in results if ok is None]
    if missed:
        return "not met: " + "; ".join(missed + unjudged)
    return "not judged: " + "; ".join(unjudged) if unjudged else "met"


def why(entry: dict) -> str:
    """Why a row misses a target: first the Nsight Compute profile of its best version that the
    suite took (`loop.suite.profiles`: bottleneck class, cause and metrics, or why there is none),
    then what the run recorded of where that version stands (the distance to its roofline that its
    lever analysis ordered candidates by; for a compute-bound op, its FLOP rate at the largest
    shape) and why it stopped. "no profile recorded" where there is neither a profile nor such a distance."""
    profiled = profile_note(entry.get("profile"))
    notes = [profiled] if profiled else []
    rate = (entry.get("largest_best") or {}).get("tflops")
    if compute_bound(entry) and rate:
        notes.append(f"the run's own measurement of the best version: {rate:.0f} TFLOP/s at the largest shape")
    elif entry.get("roofline") and not compute_bound(entry):
        notes.append(f"the run's lever analysis: best version at {entry['roofline']}")
    elif not notes:
        notes = ["no profile recorded"]
    reason = (entry.get("stop") or {}).get("reason")
    if reason:
        notes.append(f"stopped: {reason}")
    if entry.get("cut_off"):
        notes.append("cut off by --per-run")
    return "; ".join(notes)


def experiment_seconds(entries: list[dict]) -> tuple[float | None, int, str, int]:
    """The median wall seconds per experiment over the suite, how many experiments, from what, and
    how many of them were cut off: the records' own per-experiment wall times where every entry has
    them, else each run's wall time over its experiments (one value per experiment). An experiment a
    `--per-run` limit cut off counts at the seconds it had run (a lower bound of its time): leaving it
    out would report the median of the experiments short enough to finish."""
    live = [e for e in entries if "error" not in e and (e.get("iterations") or e.get("cut_experiment_s"))]
    if not live:
        return None, 0, "no experiments", 0
    cut = [float(s) for e in live for s in e.get("cut_experiment_s") or []]
    if all(isinstance(e.get("experiment_wall_s"), list) for e in live):
        walls = [float(w) for e in live for w in e["experiment_wall_s"]] + cut
        basis = "the records' per-experiment wall times"
        if cut:
            basis += f", {len(cut)} of them cut off (by --per-run or a kill of the suite) counted at the seconds they had run (lower bounds)"
        return (statistics.median(walls) if walls else None), len(walls), basis, len(cut)
    walls = []
    for e in live:
        total, _ = wall_s(e)
        if total is not None and e.get("iterations"):
            walls += [total / e["iterations"]] * e["iterations"]
    return (statistics.median(walls) if walls else None), len(walls), \
        "each run's wall_s / experiments (no per-experiment wall times beside every entry)", 0


def experiment_verdict(median: float, cut: int) -> str:
    """Whether the median meets EXPERIMENT_S_TARGET: with cut-off experiments counted at lower bounds,
    a median above it is not met, one within it is not shown (the cut ones may have taken longer)."""
    if median > EXPERIMENT_S_TARGET:
        return "not met"
    return "not shown: cut-off experiments counted at lower bounds" if cut else "met"


def not_finished(entries: list[dict], started: list[str], targets: list[str]) -> list[str]:
    """Targets of the suite with no whole result: failed, cut off, stopped mid-way, without a final
    measurement, started (a log) and never given an entry (killed, or still running), or, of the
    targets `suite run` was given (`targets`), never started."""
    out = []
    runs = {e.get("run") for e in entries}
    for e in sorted(entries, key=lambda e: str(e.get("target") or e.get("run"))):
        name = e.get("target") or e.get("run")
        if "error" in e:
            out.append(f"{name}: not run: {e['error']}")
        elif not e.get("final"):
            out.append(f"{name}: no final measurement" + (f" ({str(e.get('final_error'))[-160:].strip()})"
                                                         if e.get("final_error") else ""))
        if "error" not in e and not finished(e):
            state = "cut off by --per-run" if e.get("cut_off") else f"stopped without a stop rule ({(e.get('stop') or {}).get('state') or 'unknown'})"
            out.append(f"{name}: unfinished, {state}: {e.get('iterations', 0)} experiment(s); "
                       "`suite run --resume` continues it")
    named = {run_id_of(t): t for t in targets}
    for run in sorted(set(started) | set(named)):
        if run in runs:
            continue
        if run in started:
            out.append(f"{named.get(run, run)}: started, no entry (killed or still running): `suite run --resume` continues it")
        else:
            out.append(f"{named[run]}: not started: `suite run --resume` starts it")
    return out


def page(entries: list[dict], table: list[Row], commands: list[str], started: list[str], targets: list[str],
         title: str) -> str:
    """The markdown page beside the JSON list: the same table with verdicts, and how it was made."""
    live = [e for e in entries if "error" not in e]
    devices = sorted({str(e.get("device")) for e in live}) or ["unknown"]
    median, count, basis, cut = experiment_seconds(entries)
    by_run = {(e["op"], e["language"]): e for e in live}
    bases = sorted({wall_s(e)[1] for e in live})
    lines = [f"# {title}", "", f"- device: {', '.join(devices)}",
             "- commands:" if commands else "- commands: not given (`suite summarize --command '...'`, repeatable)"]
    lines += [f"  - `{c}`" for c in commands]
    lines += [f"- median seconds per experiment over the suite: "
              + (f"{median:.1f} s over {count} experiments (needs <= {EXPERIMENT_S_TARGET:.0f} s: "
                 f"{experiment_verdict(median, cut)}), from {basis}" if median is not None else basis),
              "- every time in a row is from the target's final measurement (`tileloop report --measure`): the tuned "
              "kernel, torch eager and torch.compile timed interleaved in one judged measurement; torch.compile is "
              "empty where that measurement had it unavailable (it fell back to eager or did not compile)",
              f"- targets: memory-bound ops >= {CLONE_TARGET:.2f} of the same-run clone bandwidth at the largest benchmark "
              f"shape; every op >= {COMPILE_TARGET:.1f}x torch.compile at every benchmark shape; matmul >= "
              f"{MATMUL_TARGET:.1f}x torch.matmul (its torch eager) at every benchmark shape",
              "- wall_s: " + "; ".join({"run": "the `tileloop run` process, init to stop (a run the suite ran in one call)",
                                        "records": "the sum of the run's records' wall times over its sessions (a resumed run)",
                                        "unknown": "not recorded"}[b] for b in bases), ""]
    shown = []
    for r in table:
        v = verdict(r)
        shown.append({"op": r.op, "language": r.language, "shape": "x".join(map(str, r.shape)), "dtype": r.dtype,
                      "best_ms": f"{r.best_ms:.6f}", "eager_ms": _cell(r.eager_ms), "compile_ms": _cell(r.compile_ms),
                      "clone_fraction": "" if r.clone_fraction is None else f"{r.clone_fraction:.2f}",
                      "matmul_ms": _cell(r.matmul_ms), "experiments": r.experiments,
                      "wall_s": "" if r.wall_s is None else f"{r.wall_s:.0f}",
                      "largest": "yes" if r.largest else "", "verdict": v,
                      "why (its profile, the run's records)": "" if v == "met" else why(by_run[(r.op, r.language)])})
    lines += [markdown_table(shown) if shown else "(no final measurement in any entry)", ""]
    above = above_clone(entries)
    if above:
        lines += ["## Fractions of the clone above 1", "", "What the final measurement says of each (the clone short of "
                  "the device's copy rate, or bytes the spec counts that never reached DRAM):", ""]
        lines += [f"- {a}" for a in above] + [""]
    missing = not_finished(entries, started, targets)
    lines += ["## Not finished", ""] + ([f"- {m}" for m in missing] or ["- none"]) + [""]
    return "\n".join(lines)


def above_clone(entries: list[dict]) -> list[str]:
    """One line per final-measurement row whose best version ran above 1.0 of the clone bandwidth:
    the op, language, shape and dtype, and the final measurement's note on why (`timing.above_one`)."""
    out = []
    for e in sorted((e for e in entries if "error" not in e), key=lambda e: (e["op"], e["language"])):
        for r in e.get("final") or []:
            frac = _number(r.get("best, fraction of clone bandwidth"), positive=False)
            if frac is not None and frac > 1.0 and not compute_bound(e):
                out.append(f"{e['op']} {e['language']} {r['shape']} {r['dtype']}: {frac:.2f}: "
                           + (r.get("clone note") or "no note in the final measurement"))
    return out


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def write(path: Path, entries: list[dict], commands: list[str], started: list[str], targets: list[str],
          title: str) -> tuple[list[dict], str]:
    """The JSON list at `path` and its page at `path` with `.md`; both returned. `started`: the runs
    with a log, `targets`: the targets the suite was given (both to name those without an entry)."""
    table = rows(entries)
    data = [r.to_json() for r in table]
    text = page(entries, table, commands, started, targets, title)
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")
    atomic_write_text(path.with_suffix(".md"), text + "\n")
    return data, text
