"""`suite summarize` turns entries (from one or several `suite run` calls) into one markdown file:
per op and implementation, baseline and final latency (each from its own measurement), speedup (the
product of the kept experiments' paired speedups, never baseline over final latency), fraction of same-run clone
bandwidth (memory-bound ops) or of torch.matmul's rate (matmul), torch eager and torch.compile,
iterations, wall time per iteration and the recipes kept; then Triton/PTX against cuTile per op.
Its rows per node and plot come from `nodes`, its wall time simulated on more GPUs from `simulate`.
"""

from __future__ import annotations

import json
import math
import statistics
from datetime import datetime
from pathlib import Path

from loop.common.errors import UserError
from loop.common.files import atomic_write_text
from loop.records import methods
from loop.records.perf_table import markdown_table
from loop.records.results import Record, cumulative
from loop.run.levers import roofline
from loop.suite import nodes, simulate

ENTRY_SCHEMA = "tileloop.suite-entry/1"


def _size(shape) -> int:
    return math.prod(int(x) for x in shape)


def largest(shapes: list[dict]) -> dict | None:
    """The benchmark shape that moves the most bytes (then the most elements); first wins ties."""
    if not shapes:
        return None
    return max(shapes, key=lambda s: (s.get("bytes") or 0, _size(s["shape"])))


def _stats(entry_shape: dict, *labels: str) -> dict:
    for label in labels:
        if isinstance(entry_shape.get(label), dict):
            return entry_shape[label]
    return {}


def entry_from_run(run_dir: Path, final: dict | None, cut_off: bool, wall_s: float, cut_at: float | None = None) -> dict:
    """One suite entry from a run's records (results.jsonl) and its final measurement. `cut_at`: when
    the `--per-run` limit killed the run (epoch seconds), for the experiment it killed."""
    recs = [Record.from_json(json.loads(line)) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()]
    if not recs:
        raise UserError(f"{run_dir} has no records")
    state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").is_file() else {}
    base = recs[0]
    backend = base.target_backend
    best = next(r for r in reversed(recs) if r.status == "keep")
    b0, b1 = base.backends[backend], best.backends[backend]
    s0 = largest(b0.shapes)
    s1 = next((s for s in b1.shapes if s0 and s["shape"] == s0["shape"] and s["dtype"] == s0["dtype"]), None)
    base_l = _stats(s0 or {}, "baseline", "candidate")
    best_l = _stats(s1 or {}, "candidate", "baseline") if best.iteration else base_l
    final_rows = (final or {}).get("rows", [])
    key = "x".join(map(str, s0["shape"])) if s0 else None
    final_large = next((r for r in final_rows if s0 and r["shape"] == key and r["dtype"] == s0["dtype"]), None)
    experiments = recs[1:]
    of_records = from_records(recs, cut_at)
    return {
        "schema": ENTRY_SCHEMA, "run": base.run, "op": run_dir.name, "target": None, "target_backend": backend,
        "device": base.env.get("gpu") or "CPU (Triton interpreter)", "timing": b0.timing_label,
        "baseline_ms": base.latency_ms, "best_ms": best.latency_ms, "best_iteration": best.iteration,
        "speedup": cumulative(recs),  # the kept paired speedups multiplied: each from one measurement, incumbent and candidate interleaved
        "largest_method": (s1 or s0 or {}).get("method"),
        "methods": methods.methods_used(methods.timed_points(recs, backend)),  # what timed the latencies of the loop
        "largest_shape": {"shape": s0["shape"], "dtype": s0["dtype"], "flops": s0.get("flops"), "bytes": s0.get("bytes")} if s0 else None,
        "largest_baseline": base_l, "largest_best": best_l,
        "final": final_rows, "final_largest": final_large,
        "iterations": len(experiments),
        "outcomes": {k: sum(r.status == k for r in experiments) for k in ("keep", "revert", "crash", "unmeasured")},
        "median_iteration_wall_s": statistics.median(walls) if (walls := of_records["experiment_wall_s"]) else None,
        "kept": [f"#{r.iteration} {r.optimization} ({r.speedup:.2f}x)" for r in experiments if r.status == "keep" and r.speedup],
        "stop": state.get("stopped") or (recs[-1].stop.to_json() if recs[-1].stop else {}), "availability": state.get("availability", {}),
        "cut_off": cut_off, "suite_wall_s": wall_s,
        **of_records,
    }


def write_entry(out_dir: Path, entry: dict) -> None:
    """A suite entry written (whole) to the output folder, as `<run>.json`."""
    atomic_write_text(out_dir / f"{entry['run']}.json", json.dumps(entry, indent=1, default=str) + "\n")


def from_records(recs: list[Record], cut_at: float | None = None) -> dict:
    """What an entry keeps of its run's records for `suite summarize --unattended-json`: each
    experiment's wall time, the seconds each experiment cut off had run (`cut_experiment_s`), the
    baseline's and the experiments' summed (over every session of a resumed run), and the best
    version's distance to its roofline as the run's lever analysis read it. `cut_at` (epoch seconds
    of a `--per-run` kill): an experiment killed before it left a record (in its sweep stage, which
    `resume` does not count) is counted from the last record to the kill (its proposal included)."""
    best = next((r for r in reversed(recs) if r.status == "keep"), None)
    where = roofline(best, recs[0].target_backend) if best else None
    done = [r for r in recs[1:] if not interrupted(r)]
    cut = [s for r in recs[1:] if interrupted(r) and (s := elapsed_s(r)) is not None]
    last = _epoch(recs[-1].finished)
    if cut_at is not None and last is not None and not interrupted(recs[-1]) and cut_at > last:
        cut.append(round(cut_at - last, 3))
    return {"experiment_wall_s": [r.wall_s for r in done], "cut_experiment_s": cut,
            "records_wall_s": round(sum(r.wall_s for r in recs), 3), "roofline": where.basis if where else None}


def elapsed_s(r: Record) -> float | None:
    """Seconds from an interrupted experiment's start to the record that closed it (the stop, or the
    repair after a `--per-run` cut): a lower bound of what the experiment would have taken."""
    start, end = _epoch(r.started), _epoch(r.finished)
    return None if start is None or end is None else round(end - start, 3)


def _epoch(stamp: str) -> float | None:
    """A record's ISO time stamp in epoch seconds, None where it has none (or none readable)."""
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except (TypeError, ValueError):
        return None


def interrupted(r: Record) -> bool:
    """An experiment the run's stop cut (a crash record of no wall time, tried again on resume): no
    experiment's time, and not one of the experiments a run made."""
    return r.status == "crash" and r.verdict == "interrupted"


def _f(x, fmt="{:.6f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else ""


# The reference suite's targets: memory-bound ops at >= 0.90 of same-run clone bandwidth at the
# largest benchmark shape; bf16 matmul at 4096^3 against torch.matmul (Triton 0.90, cuTile 0.80);
# every op at least torch.compile's speed at each benchmark shape.
CLONE_TARGET = 0.90
MATMUL_TARGET = {"triton": 0.90, "cutile": 0.80}
MATMUL_TARGET_SHAPE = "4096x4096x4096"
COMPUTE_BOUND_FLOP_PER_BYTE = 50.0  # above this, a fraction of copy bandwidth says nothing about the kernel


def compute_bound(e: dict) -> bool:
    """Whether the entry's largest benchmark shape does more FLOPs per byte than a copy can say anything of."""
    shape = e.get("largest_shape") or {}
    return bool(shape.get("bytes")) and (shape.get("flops") or 0) / shape["bytes"] >= COMPUTE_BOUND_FLOP_PER_BYTE


def _ratio(row: dict, ref: str) -> float | None:
    """`ref`'s time over ours in a final row; None where `ref` has no time there (torch.compile
    `unavailable: ...`, `not timed`)."""
    try:
        return float(row[ref]) / float(row["best (ms)"])
    except (KeyError, TypeError, ValueError):
        return None


def _unavailable(final: list[dict]) -> str:
    """Why torch.compile has no time in a final measurement, where it says (` (unavailable: ...)`)."""
    why = next((str(r["torch.compile (ms)"]) for r in final if str(r.get("torch.compile (ms)", "")).startswith("unavailable")), "")
    return f" ({why[:120]})" if why else ""


def _methods(final_largest: dict, entry: dict) -> str:
    return f"{methods.method_text(final_largest.get('method'))} / {methods.method_text(entry.get('largest_method'))}"


def method_notes(entries: list[dict]) -> list[str]:
    """Where the final measurement and the loop's own give the same version at its largest shape
    latencies more than 5% apart: both, their methods, and why they differ."""
    out = []
    for e in entries:
        fl, loop = e.get("final_largest") or {}, (e.get("largest_best") or {}).get("median_ms")
        if not fl.get("best (ms)") or not loop:
            continue
        final = float(fl["best (ms)"])
        if abs(math.log(final / loop)) > math.log1p(0.05):
            out.append(f"- {e['op']} {e['language']} at {fl.get('shape')} {fl.get('dtype')}: {final:.6f} ms by "
                       f"{methods.method_text(fl.get('method'))} (`report --measure`) and {loop:.6f} ms by "
                       f"{methods.method_text(e.get('largest_method'))} (the loop's), {abs(final / loop - 1):.0%} apart: "
                       f"{methods.why_differ(fl.get('method'), e.get('largest_method'))}")
    return out


def target_rows(entries: list[dict]) -> list[dict]:
    """Each entry against the suite's targets: measured value, target, met or not. The value is the
    entry's final measurement (`tileloop report --measure`); for the clone-bandwidth target the
    loop's own measurement of the same version is shown too, and both must clear it."""
    rows = []
    for e in sorted(entries, key=lambda e: (e["op"], e["language"])):
        final, fl, impl = e.get("final") or [], e.get("final_largest") or {}, f"{e['op']} {e['language']}"

        def row(what, value, target, loop_value=None):
            # met only when every measurement of the version clears the target (the final one and,
            # where there is one, the loop's own: a kernel tuned at run time may pick differently)
            values = [v for v in (value, loop_value) if v is not None]
            met = "not measured" if value is None else ("met" if min(values) >= target else "not met")
            rows.append({"op / impl": impl, "target": what, "measured": "" if value is None else f"{value:.2f}",
                         "loop's measurement": "" if loop_value is None else f"{loop_value:.2f}",
                         "needed": f">= {target:.2f}", "result": met,
                         "methods (measured / loop's)": _methods(fl, e) if loop_value is not None else ""})

        if e["op"] == "matmul":
            at = next((r for r in final if r.get("shape") == MATMUL_TARGET_SHAPE and r.get("dtype") == "bfloat16"), None)
            row(f"bf16 {MATMUL_TARGET_SHAPE}: torch.matmul time / ours",
                _ratio(at, "torch eager (ms)") if at else None, MATMUL_TARGET.get(e["language"], 0.8))
        elif not compute_bound(e):
            frac = fl.get("best, fraction of clone bandwidth")
            row(f"largest shape ({fl.get('shape', '?')} {fl.get('dtype', '')}): fraction of clone bandwidth",
                float(frac) if frac not in (None, "", "n/a") else None, CLONE_TARGET,
                (e.get("largest_best") or {}).get("frac_clone_bw"))
        timed = [r for r in final if _ratio(r, "torch.compile (ms)") is not None]
        worst = min(timed, key=lambda r: _ratio(r, "torch.compile (ms)"), default=None)
        row("torch.compile time / ours, worst shape" + (f" ({worst['shape']} {worst['dtype']})" if worst else
                                                        _unavailable(final)),
            _ratio(worst, "torch.compile (ms)") if worst else None, 1.0)
    return rows


def summarize(entries: list[dict], title: str, plot_note: str = "No plot.") -> str:
    """The suite's summary page: the table of its entries, the targets, the rows per node (and
    `plot_note`, the line on its plot), its wall time simulated on more GPUs, the recipes kept,
    Triton against cuTile."""
    every = entries
    failed = [e for e in entries if "error" in e]
    entries = sorted((e for e in entries if "error" not in e), key=lambda e: (e["op"], e["language"]))
    devices = sorted({str(e.get("device")) for e in entries})
    lines = [f"# {title}", "",
             f"- device: {', '.join(devices)} (every number below is from runs on it)",
             "- each row: `tileloop run <target>` with default settings, then `tileloop report --measure` (best version against "
             "PyTorch eager and torch.compile, in one judged measurement, same inputs)",
             "- latency: geometric mean over the spec's benchmark shapes of the target backend's median; 'baseline ms' and "
             "'final ms' come from different measurements (the baseline's and the best iteration's own worker), so "
             "'speedup' is not their ratio: it is the product of the kept experiments' paired speedups (each from one "
             "worker that timed incumbent and candidate interleaved); 'largest' columns: the benchmark shape that moves "
             "the most bytes, timed by the method named in 'method (largest)' (the final measurement's where there is one)",
             "- fraction: of the same-run `clone` bandwidth (memory-bound ops), or of torch.matmul's FLOP rate (matmul, "
             "where torch eager is torch.matmul)", ""]
    rows = []
    for e in entries:
        fl = e.get("final_largest") or {}
        shape = e.get("largest_shape") or {}
        if e["op"] == "matmul" and fl and _ratio(fl, "torch eager (ms)") is not None:
            frac = f"{_ratio(fl, 'torch eager (ms)'):.2f} of torch.matmul"
        elif compute_bound(e):
            frac = "n/a (compute-bound)"
        else:
            frac = fl.get("best, fraction of clone bandwidth") or _f((e.get("largest_best") or {}).get("frac_clone_bw"), "{:.2f}")
        vs_compile = [v for r in e.get("final") or [] if (v := _ratio(r, "torch.compile (ms)")) is not None]
        rows.append({
            "op": e["op"], "impl": f"{e['language']}/{e['target_backend']}",
            "baseline ms": _f(e["baseline_ms"]), "final ms": _f(e["best_ms"]), "method": e.get("methods") or "unknown method",
            "speedup": _f(e["speedup"], "{:.2f}x"),
            "largest shape": f"{'x'.join(map(str, shape.get('shape', [])))} {shape.get('dtype', '')}",
            "final ms (largest)": fl.get("best (ms)", _f((e.get("largest_best") or {}).get("median_ms"))),
            "method (largest)": methods.method_text(fl.get("method") if fl else e.get("largest_method")),
            "fraction (largest)": frac,
            "torch eager ms": fl.get("torch eager (ms)", ""), "torch.compile ms": fl.get("torch.compile (ms)", ""),
            "vs torch.compile (worst shape)": f"{min(vs_compile):.2f}x" if vs_compile else
                                              (_unavailable(e.get("final") or []).strip(" ()") or "not measured"),
            "experiments": f"{e['iterations']} ({e['outcomes']['keep']}k/{e['outcomes']['revert']}r/{e['outcomes']['crash']}c"
                           + (f"/{e['outcomes']['unmeasured']}u" if e["outcomes"].get("unmeasured") else "") + ")"
                           + (" cut off" if e.get("cut_off") else "") + (" resumed" if e.get("resumed") else ""),
            "median s/iter": _f(e.get("median_iteration_wall_s"), "{:.1f}"),
            "stop": (e.get("stop") or {}).get("reason", "")[:70],
        })
    lines += [markdown_table(rows), ""]
    lines += [f"- not measured: {e.get('target') or e['run']}: {e['error']}" for e in failed]
    lines += ["", "## Targets", "",
              f"Memory-bound ops: >= {CLONE_TARGET:.2f} of the same-run clone bandwidth at the largest benchmark shape. "
              f"bf16 matmul {MATMUL_TARGET_SHAPE}: >= {MATMUL_TARGET['triton']:.2f} (Triton) / "
              f"{MATMUL_TARGET['cutile']:.2f} (cuTile) of torch.matmul's speed. Every op: at least torch.compile's "
              "speed at every benchmark shape. 'measured': the final measurement (`tileloop report --measure`); "
              "'loop's measurement': the run's own timing of the same version (a target counts as met only when both "
              "clear it).", "", markdown_table(target_rows(entries)) if entries else "", ""]
    notes = method_notes(entries)
    if notes:
        lines += ["Where the final measurement and the loop's own disagree for the same version and shape:", ""] + notes + [""]
    lines += nodes.markdown(nodes.node_rows(every), plot_note) + simulate.markdown(simulate.simulate(every))
    lines += ["## Recipes kept", ""]
    for e in entries:
        lines.append(f"- {e['op']} {e['language']}: " + ("; ".join(e["kept"]) if e["kept"] else "none"))
    lines += [""] + languages(entries)
    return "\n".join(lines)


def languages(entries: list[dict]) -> list[str]:
    """Triton against cuTile per op, at the largest shape: the final versions, with the Tile IR
    backend of nvtriton named as measured or unavailable (never filled with a PTX number)."""
    tileir = next((e["availability"]["tileir"] for e in entries if "tileir" in e.get("availability", {})), None)
    tileir_cell = ("measured in the runs: see their perf_results" if tileir and tileir.get("available")
                   else f"unavailable: {(tileir or {}).get('reason') or 'not probed'}")
    lines = ["## Triton (PTX backend) against cuTile (Tile IR), final versions, largest shape", "",
             f"Triton through the Tile IR backend of nvtriton (`ENABLE_TILE=1`): {tileir_cell}. No number below is a "
             "Triton-on-Tile-IR number. Each time is the final measurement where there is one, else the loop's, by the "
             "method of 'method (largest)' in the first table.", ""]
    by_op: dict[str, dict] = {}
    for e in entries:
        by_op.setdefault(e["op"], {})[e["language"]] = e
    cmp_rows = []
    for op, d in sorted(by_op.items()):
        t, c = d.get("triton"), d.get("cutile")
        tl = (t or {}).get("final_largest") or {}
        cl = (c or {}).get("final_largest") or {}
        tm = tl.get("best (ms)") or _f(((t or {}).get("largest_best") or {}).get("median_ms"))
        cm = cl.get("best (ms)") or _f(((c or {}).get("largest_best") or {}).get("median_ms"))
        shape = ((t or c or {}).get("largest_shape") or {})
        cmp_rows.append({"op": op, "shape": f"{'x'.join(map(str, shape.get('shape', [])))} {shape.get('dtype', '')}",
                         "Triton ms (backend)": f"{tm} ({t['target_backend']})" if tm else "not run",
                         "cuTile ms (backend)": f"{cm} ({c['target_backend']})" if cm else "not run",
                         "Triton/TileIR (nvtriton)": tileir_cell,
                         "cuTile / Triton time": f"{float(cm) / float(tm):.2f}" if tm and cm else ""})
    return lines + [markdown_table(cmp_rows), ""]


def load_entries(paths: list[Path]) -> list[dict]:
    """The suite entries in `paths` (folders or entry files). An entry written before entries kept
    their records' wall times (and their cut-off experiments' seconds) gets them from the records the
    suite copied beside it (`<run>-results.jsonl`), where there are some."""
    out = []
    for p in paths:
        if not p.exists():
            raise UserError(f"{p} does not exist", hint="give suite output folders (sandbox/suite) or their entry files")
        files = sorted(p.glob("*.json")) if p.is_dir() else [p]
        for f in files:
            try:
                d = json.loads(f.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise UserError(f"{f} is not a JSON suite entry") from None
            if isinstance(d, dict) and d.get("schema") == ENTRY_SCHEMA:
                beside = f.parent / f"{d.get('run')}-results.jsonl"
                if "error" not in d and not {"experiment_wall_s", "cut_experiment_s"} <= set(d) and beside.is_file():
                    d.update(from_records([Record.from_json(json.loads(line)) for line in beside.read_text().splitlines()
                                           if line.strip()]))
                out.append(d)
    if not out:
        raise UserError(f"no suite entries ({ENTRY_SCHEMA}) in {', '.join(map(str, paths))}")
    return out


TARGETS_FILE = "suite-targets.json"  # in a suite's output folder: every target a `suite run` call was given


def record_targets(out_dir: Path, targets: list[str]) -> None:
    """Add `targets` to the output folder's list of the suite's targets (kept over calls), so that a
    summary can name the targets that have no entry yet."""
    path = out_dir / TARGETS_FILE
    known = suite_targets([out_dir])
    atomic_write_text(path, json.dumps({"targets": known + [t for t in targets if t not in known]}, indent=1) + "\n")


def suite_targets(paths: list[Path]) -> list[str]:
    """The targets `suite run` was given in these output folders (its list of them), in order."""
    out: list[str] = []
    for p in paths:
        f = p / TARGETS_FILE
        if p.is_dir() and f.is_file():
            try:
                listed = json.loads(f.read_text()).get("targets", [])
            except (ValueError, AttributeError):
                raise UserError(f"{f} is not a suite's list of targets") from None
            out += [str(t) for t in listed if str(t) not in out]
    return out


def started_runs(paths: list[Path]) -> list[str]:
    """The runs a suite started in these output folders: each has its log (`<run>.log`) from the moment
    its `tileloop run` began, naming the run's branch (`tileloop/<run>`) once the run was set up; its
    entry comes only once it ended and was reported."""
    return sorted(f.stem for p in paths if p.is_dir() for f in p.glob("suite-*.log")
                  if f"tileloop/{f.stem}" in f.read_text(errors="replace"))
