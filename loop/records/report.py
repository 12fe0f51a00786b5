"""`tileloop report`: sandbox/<run>/report.md and latency.png, from the records (and, with
--measure on a GPU, one final measurement of the best version against PyTorch eager and
torch.compile). Interpreter (CPU) numbers are labelled as such wherever they appear."""

from __future__ import annotations

from pathlib import Path

from loop.records.perf_table import markdown_table
from loop.records.results import Record
from playbook.analysis import analyze
from playbook.hazards import scan

STRATEGY = {
    "dot": "TMA + 2CTA + occupancy + larger tiles",
    "norm-like": "high occupancy, more warps, one pass over the row",
    "element-wise": "occupancy + num_stages, bigger blocks",
    "reduction": "high occupancy + num_warps",
}


def intensity_class(flops: float, nbytes: float) -> str:
    ai = flops / nbytes if nbytes else 0.0
    return f"{ai:.2f} FLOP/byte: " + ("memory-bound" if ai < 10 else "balanced" if ai <= 50 else "compute-bound")


def plot(records: list[Record], path: Path, interpreter: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    best, best_x, best_y = None, [], []
    ymax = max((r.latency_ms for r in records if r.latency_ms), default=1.0)
    top = ymax * 1.3  # where experiments without a latency (crashed, or incorrect before timing) are drawn
    styles = {"keep": ("o", "tab:green"), "revert": ("x", "tab:orange"), "crash": ("v", "tab:red")}
    for status, (marker, color) in styles.items():
        timed = [r for r in records if r.status == status and r.latency_ms is not None]
        untimed = [r for r in records if r.status == status and r.latency_ms is None]
        if timed:
            ax.scatter([r.iteration for r in timed], [r.latency_ms for r in timed], marker=marker, color=color,
                       label=status, zorder=3)
        if untimed:
            what = "incorrect" if status == "revert" else status
            ax.scatter([r.iteration for r in untimed], [top] * len(untimed), marker=marker, color=color,
                       facecolors="none" if marker == "o" else None, alpha=0.7, zorder=3,
                       label=f"{what}, no latency (drawn at top)")
    for r in records:
        if r.status == "keep" and r.latency_ms is not None:
            best = r.latency_ms
        best_x.append(r.iteration)
        best_y.append(best)
    ax.step(best_x, best_y, where="post", color="tab:blue", alpha=0.6, label="best so far")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    lat = [r.latency_ms for r in records if r.latency_ms]
    if lat and max(lat) / min(lat) > 20:  # a few very slow candidates would flatten the rest
        ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("latency (ms, " + ("Triton interpreter on CPU" if interpreter else "GPU") + ")")
    ax.set_title(f"{records[0].run}: latency per iteration")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render(state, records: list[Record], root: Path, final: dict | None, png_name: str, entry: tuple = ()) -> str:
    interpreter = any(r.interpreter for r in records)
    unit = " (Triton interpreter on CPU, not GPU timings)" if interpreter else ""
    src = (root / state.target).read_text()
    an = analyze(src, entry=entry)
    base, best = records[0], next(r for r in reversed(records) if r.status == "keep")
    shapes = best.backends[state.target_backend].shapes if best.backends.get(state.target_backend) else []
    lines = [f"# tileloop report: {state.run_id}", ""]
    if interpreter:
        lines += ["> Every latency in this report is a **Triton interpreter (CPU) timing**, not a GPU number.", ""]
    lines += ["## Classification", f"- kernel type: {an.kernel_class} ({an.language})",
              f"- strategy: {STRATEGY[an.kernel_class]}"]
    if shapes:
        lines.append(f"- arithmetic intensity at {shapes[-1]['shape']}: {intensity_class(shapes[-1].get('flops', 0), shapes[-1].get('bytes', 0))}"
                     if shapes[-1].get("bytes") else "- arithmetic intensity: n/a")
    hazards = scan(src, state.language)
    lines += [f"- Tile IR hazards: {len([h for h in hazards if h.severity != 'info'])} warning(s)/error(s)"]
    lines += [f"  - line {h.line}: {h.severity}: {h.message}" for h in hazards]
    lines += ["", "## Compatibility per backend", ""]
    rows = []
    for name in state.backends:
        av = state.availability[name]
        b0, b1 = base.backends.get(name), best.backends.get(name)
        rows.append({"backend": name, "available": "yes" if av["available"] else "no",
                     "baseline": b0.correctness or b0.status if b0 else "", "best": (b1.correctness or b1.status) if b1 else "",
                     "note": av["reason"] or ((b1.proof or {}).get("detail", "") if b1 else "")[:120]})
    lines += [markdown_table(rows), "", "## Transformations applied", ""]
    kept = [r for r in records[1:] if r.status == "keep"]
    lines += [f"- #{r.iteration} {r.optimization}: {r.speedup:.3f}x ({r.decision.get('verdict')})" for r in kept] or ["- none kept"]
    lines += ["", f"## Benchmark comparison{unit}", ""]
    table = []
    for name in state.backends:
        b0, b1 = base.backends.get(name), best.backends.get(name)
        if not state.availability[name]["available"]:
            table.append({"Backend": name, "Baseline (ms)": f"unavailable: {state.availability[name]['reason']}", "Best (ms)": "", "Speedup": ""})
            continue
        t0 = b0.latency_ms if b0 else None
        t1 = b1.latency_ms if b1 and b1.status == "ok" else None
        table.append({"Backend": name, "Baseline (ms)": f"{t0:.6f}" if t0 else "", "Best (ms)": f"{t1:.6f}" if t1 else (b1.cell if b1 else ""),
                      "Speedup": f"{t0 / t1:.2f}x" if t0 and t1 else ""})
    lines += [markdown_table(table), "", "## Optimization path", ""]
    lines += [markdown_table([{"iteration": r.iteration, "optimization": r.optimization, "status": r.status,
                               "latency_ms": f"{r.latency_ms:.6f}" if r.latency_ms else "", "speedup": f"{r.speedup:.3f}" if r.speedup else "",
                               "decision": f"{r.decision.get('verdict', '')}: {r.decision.get('reason', '')}"[:100]} for r in records]), ""]
    lines += [f"![latency per iteration]({png_name})", "", f"## Best version against PyTorch{unit}", ""]
    if final:
        lines += [markdown_table(final["rows"]), ""]
    else:
        lines += ["not measured (run `tileloop report --measure` on a GPU)", ""]
    lines += ["## Roofline (best version, target backend)", ""]
    roof = []
    for s in shapes:
        st = s.get("candidate") or s.get("baseline") or {}
        roof.append({"shape": "x".join(map(str, s["shape"])), "dtype": s["dtype"], "median_ms": f"{st.get('median_ms', 0):.6f}",
                     "GB/s": f"{st['gbps']:.0f}" if st.get("gbps") else "", "TFLOP/s": f"{st['tflops']:.2f}" if st.get("tflops") else "",
                     "fraction of clone bandwidth": f"{st['frac_clone_bw']:.2f}" if st.get("frac_clone_bw") else "n/a"})
    lines += [markdown_table(roof), "", "## Output", f"- file: `{state.target}` at `{state.best_commit[:12]}` on branch `{state.branch}`",
              f"- baseline {base.latency_ms:.6f} ms -> best {best.latency_ms:.6f} ms ({base.latency_ms / best.latency_ms:.2f}x) on {state.target_backend}{unit}",
              f"- device: {state.env.get('gpu') or 'CPU'}; triton {state.env.get('triton_version')}; torch {state.env.get('torch_version')}", ""]
    return "\n".join(lines)
