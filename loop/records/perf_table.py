"""perf_results.md: the TileGym skill's five columns first, then one latency column per backend,
rendered with pandas + tabulate from the records (or from commit trailers, `loop.records.history`),
and regenerated atomically by the run after every iteration."""

from __future__ import annotations

from dataclasses import dataclass

from loop.records.results import Record, fmt_ms

FIXED_COLUMNS = ["iteration", "optimization", "latency_ms", "correctness", "status"]


@dataclass(frozen=True)
class Row:
    """One perf_results.md row; built from a Record or from a commit's trailers, and comparable."""

    iteration: int
    optimization: str
    latency_ms: str
    correctness: str
    status: str
    backends: tuple[tuple[str, str], ...]

    @classmethod
    def from_record(cls, r: Record) -> "Row":
        return cls(r.iteration, r.optimization, fmt_ms(r.latency_ms), r.correctness, r.status,
                   tuple((name, b.cell) for name, b in r.backends.items()))


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
        data.append([row.iteration, row.optimization, row.latency_ms, row.correctness, row.status]
                    + [cells.get(n, "") for n in names])
    df = pd.DataFrame(data, columns=FIXED_COLUMNS + [f"{n}_ms" for n in names])
    return df.to_markdown(index=False, disable_numparse=True, colalign=["right", "left", "right", "left", "left"] + ["right"] * len(names))


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


def render_perf_results(run_id: str, header: dict, rows: list[Row], interpreter: bool) -> str:
    lines = [f"# perf_results: {run_id}", ""]
    for key, value in header.items():
        lines.append(f"- {key}: {value}")
    if interpreter:
        lines += ["", "> Timings in this table are **Triton interpreter timings on the CPU** (`--device cpu`),",
                  "> not GPU timings: they test the loop, not the kernel's speed."]
    lines += ["", render_table(rows), ""]
    return "\n".join(lines)
