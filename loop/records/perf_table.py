"""perf_results.md: a file a reader needs nothing else to read. A header says what the latencies
are (timing mode and method, which shapes, how they aggregate, that rows are separate measurements,
which dtypes went unchecked); then the table: the TileGym skill's five columns first, in order,
then the hypothesis, the decision and its reason, the paired speedup against the incumbent with its
interval, the incumbent's latency in the same measurement, the cumulative speedup (kept speedups
multiplied), the commit and, for one not kept, the ref that keeps it, and one latency column per
backend. Rendered with pandas + tabulate from the records (or from commit trailers,
`loop.records.history`, which rebuilds the same rows), regenerated atomically after every iteration."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from loop.common.messages import Decision
from loop.records import methods
from loop.records.results import Record, fmt_ms, ref_of

FIXED_COLUMNS = ["iteration", "optimization", "latency_ms", "correctness", "status"]
# isolation values weaker than full (`loop.judge` reports them per shape; `tileloop doctor` explains them)
WEAKER = (("ptrace", "open"), ("descendants", "open"), ("stopped", "no"), ("exec", "forked"), ("siblings", "visible"),
          ("triton_cache", "own"), ("filesystem", "writable"))
EXTRA_COLUMNS = ["hypothesis", "decision", "speedup_vs_incumbent", "incumbent_ms", "cumulative_speedup", "commit", "ref"]
HYPOTHESIS_CHARS, DECISION_CHARS = 60, 140


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def short(text: str, limit: int) -> str:
    text = one_line(text)
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def speedup_cell(speedup: str, interval: str) -> str:
    """`1.2345x (1.2001-1.2702)`: the paired speedup and its interval, as the trailers carry them."""
    if not speedup:
        return ""
    return f"{speedup}x ({interval})" if interval else f"{speedup}x"


def decision_text(decision: Decision | None) -> str:
    """The decision as its commit trailer carries it: `verdict: reason`."""
    return f"{decision.verdict}: {decision.reason}" if decision else ""


@dataclass(frozen=True)
class Row:
    """One perf_results.md row; built from a Record or from a commit's trailers, and comparable."""

    iteration: int
    optimization: str
    latency_ms: str
    correctness: str
    status: str
    hypothesis: str
    decision: str
    speedup: str
    incumbent_ms: str
    cumulative: str
    commit: str
    ref: str
    backends: tuple[tuple[str, str], ...]

    @classmethod
    def from_record(cls, r: Record) -> "Row":
        target = r.backends.get(r.target_backend)
        interval = f"{r.lo:.4f}-{r.hi:.4f}" if r.lo is not None and r.hi is not None else ""
        return cls(r.iteration, r.optimization, fmt_ms(r.latency_ms), r.correctness, r.status,
                   short(r.hypothesis, HYPOTHESIS_CHARS), short(decision_text(r.decision), DECISION_CHARS),
                   speedup_cell(f"{r.speedup:.4f}" if r.speedup is not None else "", interval),
                   fmt_ms(target.incumbent_ms if target else None),
                   f"{r.cumulative_speedup:.4f}x" if r.cumulative_speedup is not None and r.status == "keep" else "",
                   (r.commit or "")[:10], ref_of(r.run, r.iteration) if r.commit and r.status != "keep" else "",
                   tuple((name, b.cell) for name, b in r.backends.items()))

    def to_json(self) -> dict:
        d = asdict(self)
        d["backends"] = dict(self.backends)
        return d


def render_table(rows: list[Row]) -> str:
    import pandas as pd

    names = []
    for row in rows:
        for name, _ in row.backends:
            if name not in names:
                names.append(name)
    data = []
    for row in rows:
        cells = dict(row.backends)
        data.append([row.iteration, row.optimization, row.latency_ms, row.correctness, row.status, row.hypothesis,
                     row.decision, row.speedup, row.incumbent_ms, row.cumulative, row.commit, row.ref]
                    + [cells.get(n, "") for n in names])
    df = pd.DataFrame(data, columns=FIXED_COLUMNS + EXTRA_COLUMNS + [f"{n}_ms" for n in names])
    align = ["right", "left", "right", "left", "left", "left", "left", "right", "right", "right", "left", "left"]
    return df.to_markdown(index=False, disable_numparse=True, colalign=align + ["right"] * len(names))


def markdown_table(rows: list[dict]) -> str:
    """A list of flat dicts as a markdown table (columns in first-seen order)."""
    import pandas as pd

    if not rows:
        return "(nothing)"
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    def cell(v):
        return "" if v is None else " ".join(v.split()) if isinstance(v, str) else v

    df = pd.DataFrame([{c: cell(row.get(c)) for c in cols} for row in rows], columns=cols)
    return df.to_markdown(index=False, disable_numparse=True)


def measurement_lines(records: list[Record], target_backend: str, harness: dict | None = None) -> list[str]:
    """The header lines that say what the latencies and speedups of the table are."""
    points = methods.timed_points(records, target_backend)
    mode = records[0].timing_mode if records else ("harness" if harness else "gpu")
    if harness:
        latency = (f"per row, the geometric mean over the bench command's records of their median over "
                   f"{harness['bench_repeats']} runs ({len(points)} record(s): {', '.join(p for p, _ in points)})")
    else:
        latency = f"per row, that row's version on the {target_backend} backend: {methods.aggregation(points)}"
    lines = [f"timing: {methods.MODES[mode]}; method: {methods.methods_used(points)}",
             f"latency_ms: {latency}",
             "rows: each row is its own measurement (the incumbent and the candidate timed interleaved, each in its "
             "own kernel process, by one judge), so latencies of different rows are not comparable; compare within a row "
             "(speedup_vs_incumbent, incumbent_ms)",
             "speedup_vs_incumbent: incumbent time / candidate time, paired round by round (median of the per-round "
             "ratios, geometric mean over the shapes) with its 99% interval; incumbent_ms: the incumbent's latency in "
             "the same measurement; cumulative_speedup: the product of the kept rows' paired speedups (the best "
             "version against the baseline)",
             "status: keep | revert | crash | unmeasured (a change that cannot show in these timings: checked for "
             "correctness, not decided on timing, reverted; or, decision void, a measurement voided by what is not the "
             "candidate's doing, correctness not checked); a commit not kept stays under its ref"]
    weaker = sorted({f"{k}: {v}" for r in records if target_backend in r.backends
                     for sh in r.backends[target_backend].shapes for k, v in (sh.get("isolation") or {}).items()
                     if (k, v) in WEAKER})
    if weaker:
        lines.append(f"isolation: weaker than full in some rows ({'; '.join(weaker)}): kernel code could reach the "
                     "judge's memory, outlive its measurement, run beside or signal the other implementation, or "
                     "write its compiled kernels (`tileloop doctor`)")
    gaps = methods.unchecked(records)
    if gaps:
        lines.append(f"unchecked: {'; '.join(gaps)} (correctness PASS covers the spec's other dtypes only)")
    if any(r.sweep for r in records):
        lines.append("swept rows (optimization `A -> B (swept ...)`): the values of one variable were timed in one "
                     "measurement beside the incumbent and the best chosen; the row's speedup and decision are that "
                     "value's own fresh measurement, alone against the incumbent (every value's result: the record's "
                     "sweep, the commit's Tileloop-Sweep trailer)")
    return lines


def render_perf_results(run_id: str, header: dict, records: list[Record], target_backend: str,
                        harness: dict | None = None) -> str:
    lines = [f"# perf_results: {run_id}", ""]
    for key, value in header.items():
        lines.append(f"- {key}: {value}")
    lines += [f"- {line}" for line in measurement_lines(records, target_backend, harness)]
    if any(r.interpreter for r in records):
        lines += ["", "> Timings in this table are **Triton interpreter timings on the CPU** (`--device cpu`),",
                  "> not GPU timings: they test the loop, not the kernel's speed."]
    lines += ["", render_table([Row.from_record(r) for r in records]), ""]
    return "\n".join(lines)
