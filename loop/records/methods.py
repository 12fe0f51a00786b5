"""What produced a latency: the timing mode of a run, the method of each timed shape, and how one
latency aggregates several shapes. Every table that shows a latency names these (perf_results.md,
report.md, the suite summary), so that no two numbers of different methods or sessions are read as
one."""

from __future__ import annotations

from loop.records.results import Record

METHODS = {
    "cuda_graph": "CUDA-graph replay over rotating inputs",
    "cuda_events_l2_flush": "eager calls after an L2 flush (CUDA events)",
    "interpreter_wallclock": "Triton interpreter wall clock on the CPU",
    "harness": "the bench command's own timing (harness)",
}
MODES = {
    "interpreter": "Triton interpreter on the CPU (`--device cpu`), not GPU timings",
    "gpu": "GPU",
    "harness": "the repository's bench command (external harness)",
}
# why two methods give different latencies for the same version and shape
WHY_METHODS_DIFFER = {
    frozenset({"cuda_graph", "cuda_events_l2_flush"}):
        "graph replay issues the calls back to back from a captured graph (inputs rotated so that each call "
        "reads cold data), so it times the kernel alone; eager timing launches each call from Python after an "
        "L2 flush and a synchronize, so it also pays the launch and host-side cost of one call, which weighs "
        "most on short kernels",
}


def method_text(method: str | None) -> str:
    return METHODS.get(method or "", method or "unknown method")


def why_differ(a: str | None, b: str | None) -> str:
    if a == b:
        return ("the same method in two measurements: the difference is run-to-run variation (clocks, "
                "memory placement, other work on the device) beyond each measurement's own spread")
    return WHY_METHODS_DIFFER.get(frozenset({a, b}), f"{method_text(a)} and {method_text(b)} time different things")


def point_text(shape) -> str:
    """A shape entry of a backend result as `4096x16384 bfloat16`."""
    dims = shape["shape"]
    return f"{'x'.join(map(str, dims))} {shape.get('dtype', '')}".strip()


def timed_points(records: list[Record], backend: str) -> list[tuple[str, str]]:
    """(shape and dtype, method) of every point the records timed on `backend`, first seen first."""
    out: list[tuple[str, str]] = []
    for r in records:
        b = r.backends.get(backend)
        for s in (b.shapes if b else []):
            p = (point_text(s), s.get("method") or "")
            if p not in out:
                out.append(p)
    return out


def aggregation(points: list[tuple[str, str]]) -> str:
    """How one latency of a row is made of the per-shape medians, naming the shapes."""
    names = list(dict.fromkeys(p for p, _ in points))
    if not names:
        return "no shape timed"
    if len(names) == 1:
        return f"the median at one shape ({names[0]}); no mean over shapes"
    return f"the geometric mean of the per-shape medians over {len(names)} shapes ({', '.join(names)})"


def methods_used(points: list[tuple[str, str]]) -> str:
    methods = list(dict.fromkeys(m for _, m in points))
    if len(methods) <= 1:
        return method_text(methods[0] if methods else None)
    return "; ".join(f"{method_text(m)} at {', '.join(p for p, mm in points if mm == m)}" for m in methods)


def unchecked(records: list[Record]) -> list[str]:
    return list(dict.fromkeys(u for r in records for u in r.unchecked))
