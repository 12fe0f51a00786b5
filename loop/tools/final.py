"""`tileloop report --measure`: the best version against PyTorch eager, torch.compile and the spec's
named reference kernels (`REFERENCES`, see `loop.worker.providers`), timed in one judged measurement on the
run's target backend (the same timing as an iteration's, with the same-run copy bandwidth)."""

from __future__ import annotations

from pathlib import Path

from loop import backends as backend_registry
from loop.common.errors import HarnessFailure, UserError
from loop.measure.launch import run_worker
from loop.records import gitops

TORCH = [("torch_eager", "torch eager (ms)", "vs eager"), ("torch_compile", "torch.compile (ms)", "vs torch.compile")]


def measure_final(exp, settings) -> dict:
    """Best version vs PyTorch eager, torch.compile and the references, one judged measurement on the target backend."""
    st = exp.state
    if st.harness:
        raise UserError("report --measure times the best version on a spec's inputs; this run was driven by "
                        "--test-cmd/--bench-cmd and has no spec.py",
                        hint="its bench command's records are the measurement: tileloop report (without --measure)")
    workdir = exp.dir / "logs" / "report"
    workdir.mkdir(parents=True, exist_ok=True)
    best = workdir / f"{Path(st.target).stem}__best.py"
    best.write_text(gitops.show_file(exp.root, st.best_commit, st.target))
    job = {"spec": str(exp.root / st.spec), "target_dir": str((exp.root / st.target).parent), "device": st.device,
           "backend": st.target_backend, "impls": [{"label": "best", "path": str(best)}],
           "torch_providers": ["torch_eager", "torch_compile"], "check": ["best", "torch_eager", "torch_compile"],
           "references": True, "seed": st.seed + 99991, "bench": True}
    raw = without_failed_compile(lambda j: run_worker(workdir, j, backend_registry.get(st.target_backend), settings,
                                                      exp.dir / "triton-cache" / "report", name="final"), job)
    if raw.get("status") != "ok":
        raise HarnessFailure(f"final measurement failed: {raw.get('status')}: {raw.get('message')}")
    return final_rows(raw)


def without_failed_compile(measure, job: dict) -> dict:
    """The judged measurement of `job`; where torch.compile failed in it (it ran the reference
    eagerly at a shape, hit dynamo's recompile limit or did not compile: `loop.worker.compiled`),
    the same measurement again without it, and torch.compile `unavailable` with the reason in the
    result (`torch_compile`), never a time of an eager fallback labelled torch.compile."""
    raw = measure(job)
    if raw.get("status") == "ok" or raw.get("failed_impl") != "torch_compile":
        return raw
    why = f"{raw['status']}: {raw.get('message', '')}"[:500]
    rest = {**job, "torch_providers": [p for p in job.get("torch_providers", []) if p != "torch_compile"],
            "check": [c for c in job.get("check", []) if c != "torch_compile"]}
    return {**measure(rest), "torch_compile": {"status": "unavailable", "reason": why}}


def final_rows(raw: dict) -> dict:
    """The table of a final measurement: per shape, the best version's time against PyTorch eager,
    torch.compile and each reference (its time, or why it has none: `unavailable: ...`,
    `incorrect: ...`); `vs X` is X's time over the best version's (above 1: the best is faster)."""
    refs = raw.get("references") or {}
    compiled = raw.get("torch_compile") or {}
    missing = {"torch_compile": f"{compiled['status']}: {compiled['reason']}"[:160]} if compiled else {}
    rows = []
    for s in raw["timing"]["shapes"]:
        im = s["impls"]
        b = im["best"]["median_ms"]
        row = {"shape": "x".join(map(str, s["shape"])), "dtype": s["dtype"], "method": s.get("method", ""),
               "best (ms)": f"{b:.6f}"}
        times = {label: im.get(label, {}).get("median_ms") for label, _, _ in TORCH}
        row.update({column: f"{times[label]:.6f}" if times[label] else missing.get(label, "not timed")
                    for label, column, _ in TORCH})
        row.update({vs: f"{times[label] / b:.2f}x" if times[label] else "n/a" for label, _, vs in TORCH})
        for name, ref in refs.items():
            t = im.get(name, {}).get("median_ms") if ref["status"] == "ok" else None
            row[f"{name} (ms)"] = f"{t:.6f}" if t else f"{ref['status']}: {ref['reason']}"[:160]
            row[f"vs {name}"] = f"{t / b:.2f}x" if t else "n/a"
        row["best, fraction of clone bandwidth"] = f"{im['best']['frac_clone_bw']:.2f}" if im["best"].get("frac_clone_bw") else "n/a"
        if im["best"].get("frac_matmul") and (s.get("matmul") or {}).get("tflops"):  # a compute-bound shape
            rate = s["matmul"]
            row["best, fraction of the device's matmul rate"] = (
                f"{im['best']['frac_matmul']:.2f} (torch.matmul {rate['n']}^3 {rate['dtype']}: {rate['tflops']:.0f} TFLOP/s)")
        if (s.get("clone") or {}).get("above_one"):  # why a fraction of the clone is above 1 (`timing.above_one`)
            row["clone note"] = s["clone"]["above_one"]
        notes = compile_notes(im.get("torch_compile", {}))
        if notes:
            row["torch.compile notes"] = notes
        rows.append(row)
    out = {"rows": rows, "references": refs}
    if compiled:
        out["torch_compile"] = compiled
    return out


def compile_notes(stats: dict) -> str:
    """What torch.compile ran at a timed shape where it was more than one graph per call (a graph
    break, with dynamo's reason: still what a user of torch.compile gets), from the picks its kernel
    process reported for the shape (`loop.worker.compiled`)."""
    picks = [str(v).strip("'\"") for v in (stats.get("tuned") or {}).values()]
    return "; ".join(p for p in picks if "graph break" in p)[:300]
