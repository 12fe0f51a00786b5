"""A finished suite's wall time on more (or fewer) GPUs, simulated from its entries: each target's
run time as it was measured, scheduled onto N workers longest first (each to the worker that frees
first: greedy list scheduling, LPT), each run lengthened by what one run cost the Ray driver
(bundles made and sent, checkpoints and the result fetched and taken into the repository), and
never shorter than the driver's own work for every run done one after another (the driver takes
in one task's returns at a time). A model, not a measurement: it assumes every worker as fast as
the one that ran each target, and no queueing in Ray itself."""

from __future__ import annotations

import heapq
import statistics

from loop.records.perf_table import markdown_table

GPU_COUNTS = (1, 4, 16, 64)


def schedule(durations: list[float], workers: int) -> float:
    """The makespan of `durations` on `workers` identical workers, longest first, each to the
    worker that frees first (ties: the lowest worker)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    free = [(0.0, k) for k in range(workers)]
    for d in sorted(durations, reverse=True):
        at, k = heapq.heappop(free)
        heapq.heappush(free, (at + d, k))
    return max(at for at, _ in free)


def run_time(entry: dict) -> tuple[float | None, str]:
    """A target's run time and where it comes from: its start to its end (a run made in one call:
    the run and its report), else its records' wall times summed over every session (a resumed
    run: no report), else this call's share; None for an entry with neither (an error)."""
    started, ended = entry.get("started"), entry.get("ended")
    if isinstance(started, (int, float)) and isinstance(ended, (int, float)) and not entry.get("resumed"):
        return float(ended) - float(started), "start to end"
    if isinstance(entry.get("records_wall_s"), (int, float)):
        return float(entry["records_wall_s"]), "records"
    if isinstance(entry.get("suite_wall_s"), (int, float)):
        return float(entry["suite_wall_s"]), "this call's share"
    return None, "no time"


def driver_cost(entries: list[dict]) -> dict | None:
    """The Ray driver's cost per task as the entries of a `--ray` suite recorded it (their median;
    None where no entry did): seconds in all, fetching, taking in, and bytes sent and returned."""
    costs = [e["driver"] for e in entries if isinstance(e.get("driver"), dict) and "error" not in e]
    if not costs:
        return None
    med = {k: statistics.median(float(c[k]) for c in costs)
           for k in ("driver_s", "send_s", "fetch_s", "take_s", "sent_bytes", "checkpoint_bytes", "returned_bytes",
                     "checkpoints")}
    return {"tasks": len(costs), **{k: round(v, 4) for k, v in med.items()}}


def simulate(entries: list[dict], counts: tuple[int, ...] = GPU_COUNTS, per_task_s: float | None = None) -> dict:
    """The suite's simulated wall time for each GPU count: its targets' run times (entries that
    are errors left out), the driver's cost per task (`per_task_s`, else the entries' median, else
    0, said so) and one row per count with the wall time, against one GPU, and what bounds it."""
    timed = [(str(e.get("target") or e.get("run")), *run_time(e)) for e in entries if "error" not in e]
    left_out = [t for t, s, _ in timed if s is None] + [str(e.get("target") or e.get("run")) for e in entries if "error" in e]
    return simulate_runs([(t, s, src) for t, s, src in timed if s is not None], left_out, driver_cost(entries), counts,
                         per_task_s)


def published_runs(rows: list[dict]) -> list[tuple[str, float, str]]:
    """Each target's run time in a published results list (`suite summarize --unattended-json`: a
    row per target, shape and dtype, each with its target's `wall_s`): one per op and language."""
    runs: dict[str, float] = {}
    for r in rows:
        if not isinstance(r, dict) or not {"op", "language", "wall_s"} <= set(r):
            raise ValueError("not a published results list (rows of op, language, wall_s)")
        if isinstance(r["wall_s"], (int, float)):
            runs.setdefault(f"{r['op']} {r['language']}", float(r["wall_s"]))
    return [(t, s, "published wall_s") for t, s in runs.items()]


def simulate_runs(runs: list[tuple[str, float, str]], left_out: list[str], cost: dict | None,
                  counts: tuple[int, ...] = GPU_COUNTS, per_task_s: float | None = None) -> dict:
    """`simulate` of run times given as (target, seconds, where they come from)."""
    c = per_task_s if per_task_s is not None else (cost["driver_s"] if cost else 0.0)
    durations = [s + c for _, s, _ in runs]
    serial = c * len(runs)  # the driver's work for every run, one after another
    one = max(sum(durations), serial)
    rows = []
    for n in counts:
        scheduled = schedule(durations, n) if durations else 0.0
        wall = max(scheduled, serial)
        bound = ("the driver" if serial > scheduled else
                 "the longest target" if durations and scheduled == max(durations) and len(runs) > 1 else "the schedule")
        rows.append({"gpus": n, "wall_s": round(wall, 3), "bound_by": bound,
                     "speedup": round(one / wall, 3) if one and wall else None})
    return {"targets": [{"target": t, "run_s": round(s, 3), "from": src} for t, s, src in runs], "left_out": left_out,
            "driver_s_per_task": round(c, 4), "driver": cost,
            "driver_from": "given" if per_task_s is not None else "entries" if cost else "none",
            "rows": rows}


def markdown(sim: dict) -> list[str]:
    """The summary's section on the simulation."""
    if not sim["targets"]:
        return ["## Simulated wall time on more GPUs", "", "No target has a run time to simulate from.", ""]
    cost = sim["driver"]
    said = (f"{sim['driver_s_per_task']:.3f} s per task, the median over this suite's {cost['tasks']} Ray entries "
            f"(sent {cost['sent_bytes'] / 1024:.0f} KiB, {cost['checkpoints']:.0f} checkpoints, "
            f"{cost['checkpoint_bytes'] / 1024:.0f} KiB in all, returned {cost['returned_bytes'] / 1024:.0f} KiB; fetch "
            f"{cost['fetch_s']:.3f} s, take-in {cost['take_s']:.3f} s)" if sim["driver_from"] == "entries" else
            f"{sim['driver_s_per_task']:.3f} s per task, as given (measured elsewhere)" if sim["driver_from"] == "given" else
            f"{sim['driver_s_per_task']:.3f} s per task (not measured by these entries: none ran through Ray)")
    table = [{"GPUs": str(r["gpus"]), "simulated wall s": f"{r['wall_s']:.0f}",
              "vs 1 GPU": f"{r['speedup']:.2f}x" if r["speedup"] else "", "bound by": r["bound_by"]} for r in sim["rows"]]
    lines = ["## Simulated wall time on more GPUs", "",
             f"From the {len(sim['targets'])} targets' measured run times (" +
             ", ".join(sorted({t['from'] for t in sim['targets']})) + "), scheduled longest first onto N GPUs, "
             f"each run lengthened by the Ray driver's cost: {said}; never shorter than the driver's work for every run "
             "one after another. A model: every GPU as fast as the one each target ran on.", "", markdown_table(table), ""]
    if sim["left_out"]:
        lines += [f"Left out (no run time): {', '.join(sim['left_out'])}.", ""]
    return lines

