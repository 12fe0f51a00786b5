"""Where and when a suite's targets ran: one row per node (the targets it ran, its wall time from
the first start to the last end of its entries, its GPU, the experiments it made) and a plot of it
(one row per node, one bar per target from its start to its end). Each entry names its node (the
hostname of the machine that ran it) and its start and end (seconds since the epoch, that node's
clock); an entry made before entries recorded them has no bar and leaves its node's wall time
unknown."""

from __future__ import annotations

from pathlib import Path

from loop.records.perf_table import markdown_table

CPU_DEVICE = "CPU (Triton interpreter)"  # an entry's device when its run had no GPU
UNNAMED = "(node not recorded)"  # the node of an entry made before entries named it


def node_of(entry: dict) -> str:
    """The node an entry's run ran on (its last one, for a run resumed elsewhere)."""
    return str(entry.get("node") or UNNAMED)


def gpu_of(entry: dict) -> str | None:
    """The GPU an entry's run ran on, from its records' environment; "cpu" for a CPU run; None
    for an entry with no records (an error)."""
    device = entry.get("device")
    if not device:
        return None
    return "cpu" if device == CPU_DEVICE else str(device)


def timed(entry: dict) -> bool:
    """Whether an entry says when its run started and ended."""
    return isinstance(entry.get("started"), (int, float)) and isinstance(entry.get("ended"), (int, float))


def target_name(entry: dict) -> str:
    """The target an entry is of, as the rows name it."""
    return str(entry.get("target") or entry.get("run"))


def node_rows(entries: list[dict]) -> list[dict]:
    """One row per node, in the order of its first start (nodes with no timed entry last): its
    targets, runs, GPU(s) (with the device ids a `--gpus` suite gave), first start, last end, wall
    time (None where an entry of it has no times) and experiments summed."""
    by_node: dict[str, list[dict]] = {}
    for e in entries:
        by_node.setdefault(node_of(e), []).append(e)
    rows = []
    for node, mine in by_node.items():
        done = [e for e in mine if "error" not in e]
        gpus = sorted({g for e in done if (g := gpu_of(e))})
        ids = sorted({str(e["gpu"]) for e in mine if e.get("gpu") is not None})
        whole = all(timed(e) for e in mine)
        first = min((e["started"] for e in mine if timed(e)), default=None)
        last = max((e["ended"] for e in mine if timed(e)), default=None)
        rows.append({"node": node, "gpu": ", ".join(gpus) or "unknown", "gpu_ids": ids,
                     "targets": [target_name(e) for e in mine], "failed": [target_name(e) for e in mine if "error" in e],
                     "started": first, "ended": last,
                     "wall_s": round(last - first, 3) if whole and first is not None else None,
                     "experiments": sum(int(e.get("iterations") or 0) for e in done)})
    return sorted(rows, key=lambda r: (r["started"] is None, r["started"] or 0.0, r["node"]))


def markdown(rows: list[dict], plot_note: str) -> list[str]:
    """The summary's section of rows per node, with a line on the plot."""
    table = [{"node": r["node"], "GPU": r["gpu"] + (f" (ids {','.join(r['gpu_ids'])})" if r["gpu_ids"] else ""),
              "targets": ", ".join(Path(t).stem + (" (failed)" if t in r["failed"] else "") for t in r["targets"]),
              "wall s (first start to last end)": "unknown" if r["wall_s"] is None else f"{r['wall_s']:.0f}",
              "experiments": str(r["experiments"])} for r in rows]
    return ["## Nodes: where and when each target ran", "",
            "Each node's wall time runs from the first start to the last end of its targets' runs (each run's own "
            "`tileloop run` or `resume`, then its report), by that node's clock; 'unknown' where an entry was made "
            "before entries recorded their times.", "", markdown_table(table), "", plot_note, ""]


def lanes(spans: list[tuple[float, float]]) -> list[int]:
    """Each span's lane within its row: the lowest lane free at its start (spans taken by start), so
    that runs overlapping on one node (one per GPU) are drawn side by side."""
    ends: list[float] = []
    out = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i]):
        start, end = spans[i]
        lane = next((k for k, e in enumerate(ends) if e <= start), len(ends))
        if lane < len(ends):
            ends[lane] = end
        else:
            ends.append(end)
        out[i] = lane
    return out


def plot(entries: list[dict], path: Path, title: str, link: str | None = None) -> tuple[str, bool]:
    """The plot of where and when each target ran written to `path`; what the summary says of it
    (the image at `link`, else at `path`'s name: beside the summary; or why there is none) and
    whether it was written."""
    bars = [e for e in entries if timed(e)]
    if not bars:
        return "No plot: no entry says when its run started and ended (made before entries recorded it).", False
    try:
        import matplotlib
    except ImportError:
        return "No plot: matplotlib is not installed here.", False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r["node"] for r in node_rows(bars)]
    zero = min(e["started"] for e in bars)
    by_row = {node: [e for e in bars if node_of(e) == node] for node in rows}
    height_in = 1.5 + sum(0.3 + 0.3 * (1 + max(lanes(_spans(es, zero)))) for es in by_row.values())
    fig, ax = plt.subplots(figsize=(10, height_in))
    colors = plt.get_cmap("tab20")
    y, ticks = 0.0, []
    for node, mine in by_row.items():
        spans = _spans(mine, zero)
        lane_of = lanes(spans)
        height = 0.8 / (1 + max(lane_of))
        for e, (start, end), lane in zip(mine, spans, lane_of):
            ax.barh(y + lane * height, end - start, left=start, height=height * 0.9, align="edge",
                    color=colors(next(k for k, b in enumerate(bars) if b is e) % 20), edgecolor="black", linewidth=0.5)
            ax.text(start + (end - start) / 2, y + (lane + 0.5) * height, Path(target_name(e)).stem, ha="center",
                    va="center", fontsize=7, clip_on=True)
        ticks.append((y + 0.4, node))
        y += 1.0
    ax.set_yticks([t for t, _ in ticks], [n for _, n in ticks])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the suite's first start (each node's clock)")
    ax.set_title(f"{title}: where and when each target ran")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"![where and when each target ran]({link or path.name})" + (
        f" (one row per node, a bar per target from its start to its end; {len(entries) - len(bars)} entries "
        "without times have no bar)" if len(bars) < len(entries) else
        " (one row per node, a bar per target from its start to its end)"), True


def _spans(entries: list[dict], zero: float) -> list[tuple[float, float]]:
    return [(e["started"] - zero, e["ended"] - zero) for e in entries]
