"""`tileloop report`: sandbox/<run>/report.md and latency.png, from the records (and, with
--measure on a GPU, one final measurement of the best version against PyTorch eager and
torch.compile). Interpreter (CPU) numbers are labelled as such wherever they appear.

Every speedup here comes from paired measurements: an iteration's own (incumbent and candidate
timed interleaved in one measurement), and across iterations their product over the kept ones, never one
session's latency divided by another's. Every table of latencies names its timing method, and where
two methods (or two sessions of one) disagree for the same version and shape beyond the noise, the
report says so and why.
"""

from __future__ import annotations

import math
from pathlib import Path

from loop.records import methods
from loop.records.perf_table import markdown_table, short
from loop.records.results import Record, cumulative
from playbook.analysis import analyze
from playbook.hazards import scan

STRATEGY = {
    "dot": "TMA + 2CTA + occupancy + larger tiles",
    "norm-like": "high occupancy, more warps, one pass over the row",
    "element-wise": "occupancy + num_stages, bigger blocks",
    "reduction": "high occupancy + num_warps",
}
DISAGREE_FLOOR = 0.05  # two latencies of one version and shape differ "beyond noise" past 5% and twice the spread
STYLES = {"keep": ("o", "tab:green"), "revert": ("x", "tab:orange"), "crash": ("v", "tab:red"),
          "unmeasured": ("s", "tab:gray")}


def intensity_class(flops: float, nbytes: float) -> str:
    ai = flops / nbytes if nbytes else 0.0
    return f"{ai:.2f} FLOP/byte: " + ("memory-bound" if ai < 10 else "balanced" if ai <= 50 else "compute-bound")


def plot(records: list[Record], path: Path, interpreter: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5))
    best, best_x, best_y = None, [], []
    ymax = max((r.latency_ms for r in records if r.latency_ms), default=1.0)
    top = ymax * 1.3  # where experiments without a latency (crashed, incorrect, unmeasured) are drawn
    for status, (marker, color) in STYLES.items():
        timed = [r for r in records if r.status == status and r.latency_ms is not None]
        untimed = [r for r in records if r.status == status and r.latency_ms is None]
        if timed:
            ax.scatter([r.iteration for r in timed], [r.latency_ms for r in timed], marker=marker, color=color,
                       label=status, zorder=3)
        if untimed:
            what = "incorrect" if status == "revert" else status
            ax.scatter([r.iteration for r in untimed], [top] * len(untimed), marker=marker, color=color,
                       facecolors="none" if marker in "os" else None, alpha=0.7, zorder=3,
                       label=f"{what}, no latency (drawn at top)")
    for r in records:
        if r.status == "keep" and r.latency_ms is not None:
            best = r.latency_ms
        best_x.append(r.iteration)
        best_y.append(best)
    ax.step(best_x, best_y, where="post", color="tab:blue", alpha=0.6, label="latency of the kept version, as measured then")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    lat = [r.latency_ms for r in records if r.latency_ms]
    if lat and max(lat) / min(lat) > 20:  # a few very slow candidates would flatten the rest
        ax.set_yscale("log")
    ax.set_xlabel("iteration (each point its own measurement)")
    ax.set_ylabel("latency (ms, " + ("Triton interpreter on CPU" if interpreter else "GPU") + ")")
    ax.set_title(f"{records[0].run}: latency per iteration")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def backend_speedup(records: list[Record], name: str, target_backend: str) -> float | None:
    """The best version against the baseline on one backend, from paired measurements only: on the
    target backend the product of the kept paired speedups (the decisions'); on a guard backend the
    product, over the kept iterations, of the incumbent's over the candidate's latency in that
    iteration's own measurement. None where a kept iteration has no such pair."""
    if name == target_backend:
        return cumulative(records)
    out = 1.0
    for r in records:
        if r.iteration >= 1 and r.status == "keep":
            b = r.backends.get(name)
            if b is None or not b.latency_ms or not b.incumbent_ms:
                return None
            out *= b.incumbent_ms / b.latency_ms
    return out


def _stats(shape: dict) -> dict:
    return shape.get("candidate") or shape.get("baseline") or {}


def disagreements(best: Record, backend: str, final_rows: list[dict]) -> list[str]:
    """Where the final measurement and the loop's own give one version at one shape latencies apart by
    more than the noise (5%, or twice the loop's relative interquartile range): what and why."""
    b = best.backends.get(backend)
    loop = {methods.point_text(s): s for s in (b.shapes if b else [])}
    out = []
    for row in final_rows:
        point = f"{row['shape']} {row['dtype']}"
        s = loop.get(point)
        st = _stats(s) if s else {}
        if not st.get("median_ms"):
            continue
        mine, theirs = st["median_ms"], float(row["best (ms)"])
        spread = (st.get("iqr_ms") or 0.0) / mine
        limit = max(DISAGREE_FLOOR, 2 * spread)
        if abs(math.log(theirs / mine)) > math.log1p(limit):
            out.append(f"- {point}: {mine:.6f} ms by {methods.method_text(s.get('method'))} (the loop's measurement of "
                       f"iteration {best.iteration}, roofline table) and {theirs:.6f} ms by "
                       f"{methods.method_text(row.get('method'))} (`report --measure`, table above): "
                       f"{abs(theirs / mine - 1):.0%} apart, beyond the noise ({limit:.0%}). Why: "
                       f"{methods.why_differ(s.get('method'), row.get('method'))}.")
    return out


def _classification(state, root: Path, best: Record, entry: tuple = ()) -> list[str]:
    src = (root / state.target).read_text()
    an = analyze(src, entry=entry)
    shapes = best.backends[state.target_backend].shapes if best.backends.get(state.target_backend) else []
    lines = ["## Classification", f"- kernel type: {an.kernel_class} ({an.language})", f"- strategy: {STRATEGY[an.kernel_class]}"]
    if shapes:
        lines.append(f"- arithmetic intensity at {shapes[-1]['shape']}: {intensity_class(shapes[-1].get('flops', 0), shapes[-1].get('bytes', 0))}"
                     if shapes[-1].get("bytes") else "- arithmetic intensity: n/a")
    hazards = scan(src, state.language)
    lines += [f"- Tile IR hazards: {len([h for h in hazards if h.severity != 'info'])} warning(s)/error(s)"]
    return lines + [f"  - line {h.line}: {h.severity}: {h.message}" for h in hazards]


def _compatibility(state, records: list[Record], best: Record) -> list[str]:
    base = records[0]
    rows = []
    for name in state.backends:
        av = state.availability[name]
        b0, b1 = base.backends.get(name), best.backends.get(name)
        rows.append({"backend": name, "available": "yes" if av["available"] else "no",
                     "baseline": b0.correctness or b0.status if b0 else "", "best": (b1.correctness or b1.status) if b1 else "",
                     "note": av["reason"] or ((b1.proof or {}).get("detail", "") if b1 else "")[:120]})
    lines = ["## Compatibility per backend", "", markdown_table(rows), ""]
    gaps = methods.unchecked(records)
    if gaps:
        lines += [f"Unchecked: {'; '.join(gaps)}. PASS above covers the spec's other dtypes only.", ""]
    return lines


def _comparison(state, records: list[Record], best: Record, unit: str) -> list[str]:
    base = records[0]
    table = []
    for name in state.backends:
        if not state.availability[name]["available"]:
            table.append({"Backend": name, "method": "", "Baseline (ms, iteration 0)": f"unavailable: {state.availability[name]['reason']}",
                          f"Best (ms, iteration {best.iteration})": "", "Speedup (paired, kept iterations multiplied)": ""})
            continue
        b0, b1 = base.backends.get(name), best.backends.get(name)
        t0 = b0.latency_ms if b0 else None
        t1 = b1.latency_ms if b1 and b1.status == "ok" else None
        sp = backend_speedup(records, name, state.target_backend)
        table.append({"Backend": name, "method": methods.methods_used(methods.timed_points([best], name)),
                      "Baseline (ms, iteration 0)": f"{t0:.6f}" if t0 else "",
                      f"Best (ms, iteration {best.iteration})": f"{t1:.6f}" if t1 else (b1.cell if b1 else ""),
                      "Speedup (paired, kept iterations multiplied)": f"{sp:.4f}x" if sp is not None else "not paired"})
    return [f"## Benchmark comparison{unit}", "", markdown_table(table), "",
            "Baseline and best latencies come from different measurements (each iteration's own). "
            "The speedup is not their ratio: it is the product of the kept iterations' paired speedups, each from one "
            f"measurement that timed incumbent and candidate interleaved (on {state.target_backend}, the decisions' own; "
            "on a guard backend, incumbent over candidate latency in the same measurement).", ""]


def _path(records: list[Record], backend: str) -> list[str]:
    rows = [{"iteration": r.iteration, "optimization": r.optimization, "status": r.status, "correctness": r.correctness,
             "latency_ms": f"{r.latency_ms:.6f}" if r.latency_ms else "",
             "incumbent_ms (same measurement)": f"{inc:.6f}" if (inc := _incumbent(r)) else "",
             "speedup vs incumbent (paired)": (f"{r.speedup:.4f}x ({r.lo:.4f}-{r.hi:.4f})" if r.lo is not None
                                               else f"{r.speedup:.4f}x") if r.speedup is not None else "",
             "decision": short(f"{r.verdict or ''}: {r.decision.reason if r.decision else ''}", 120)} for r in records]
    return ["## Optimization path", "", f"Latencies on {backend}: {methods.methods_used(methods.timed_points(records, backend))}. "
            "Each row is its own measurement: compare a row's latency with its incumbent's, not with other rows. "
            "`unmeasured`: a change that cannot show in these timings, checked for correctness, not decided on timing.",
            "", markdown_table(rows), ""]


def _incumbent(r: Record) -> float | None:
    b = r.backends.get(r.target_backend)
    return b.incumbent_ms if b else None


NOT_A_RATE = "n/a (interpreter)"


def _roofline(state, best: Record) -> list[str]:
    shapes = best.backends[state.target_backend].shapes if best.backends.get(state.target_backend) else []
    roof = []
    interp = state.target_backend == "interpreter"  # its wall clock says nothing of a GPU's bytes or flops per second
    for s in shapes:
        st = _stats(s)
        roof.append({"shape": "x".join(map(str, s["shape"])), "dtype": s["dtype"], "method": methods.method_text(s.get("method")),
                     "median_ms": f"{st.get('median_ms', 0):.6f}",
                     "GB/s": NOT_A_RATE if interp else f"{st['gbps']:.4g}" if st.get("gbps") else "",
                     "TFLOP/s": NOT_A_RATE if interp else f"{st['tflops']:.4g}" if st.get("tflops") else "",
                     "fraction of clone bandwidth": f"{st['frac_clone_bw']:.2f}" if st.get("frac_clone_bw") else "n/a"})
    above = [f"- {'x'.join(map(str, s['shape']))} {s['dtype']}: {n}" for s in shapes for n in s.get("notes") or []
             if str(n).startswith("above 1.0 of the clone")]  # why (`loop.common.timing.above_one`)
    return [f"## Roofline (best version, target backend, iteration {best.iteration}'s measurement)", "",
            markdown_table(roof), ""] + above + [""] * bool(above)


def _final(final: dict | None, unit: str) -> list[str]:
    lines = [f"## Best version against PyTorch{unit}", ""]
    if not final:
        return lines + ["not measured (run `tileloop report --measure` on a GPU)", ""]
    rows = [{**r, "method": methods.method_text(r.get("method"))} for r in final["rows"]]
    return lines + ["One measurement timed the best version, torch eager, torch.compile (and the spec's references) "
                    "interleaved; the ratios are within that measurement.", "", markdown_table(rows), ""]


def _output(state, records: list[Record], best: Record, unit: str) -> list[str]:
    kept = [r for r in records[1:] if r.status == "keep" and r.speedup is not None]
    chain = " x ".join(f"#{r.iteration} {r.speedup:.4f}" for r in kept) or "nothing kept"
    return ["## Output", f"- file: `{state.target}` at `{state.best_commit[:12]}` on branch `{state.branch}`",
            f"- best against baseline on {state.target_backend}: {cumulative(records):.4f}x, the kept paired speedups "
            f"multiplied: {chain}{unit}",
            f"- device: {state.env.get('gpu') or 'CPU'}; triton {state.env.get('triton_version')}; torch {state.env.get('torch_version')}", ""]


def render(state, records: list[Record], root: Path, final: dict | None, png_name: str, entry: tuple = ()) -> str:
    interpreter = any(r.interpreter for r in records)
    unit = " (Triton interpreter on CPU, not GPU timings)" if interpreter else ""
    best = next(r for r in reversed(records) if r.status == "keep")
    lines = [f"# tileloop report: {state.run_id}", ""]
    if interpreter:
        lines += ["> Every latency in this report is a **Triton interpreter (CPU) timing**, not a GPU number.", ""]
    lines += _classification(state, root, best, entry) + [""] + _compatibility(state, records, best)
    kept = [r for r in records[1:] if r.status == "keep" and r.speedup is not None]
    lines += ["## Transformations applied", ""]
    lines += [f"- #{r.iteration} {r.optimization}: {r.speedup:.4f}x paired (interval {r.lo:.4f}-{r.hi:.4f}x; "
              f"{r.verdict})" if r.lo is not None else
              f"- #{r.iteration} {r.optimization}: {r.speedup:.4f}x paired ({r.verdict})" for r in kept] or ["- none kept"]
    lines += [""] + _comparison(state, records, best, unit) + _path(records, state.target_backend)
    lines += [f"![latency per iteration]({png_name})", ""] + _final(final, unit) + _roofline(state, best)
    differ = disagreements(best, state.target_backend, (final or {}).get("rows", []))
    if differ:
        lines += ["## Where two timings of the best version disagree", ""] + differ + [""]
    return "\n".join(lines + _output(state, records, best, unit))
