"""`tileloop report --measure`: the best version against PyTorch eager and torch.compile, timed in
one worker on the run's target backend (the same timing as an iteration's, with the same-run copy
bandwidth)."""

from __future__ import annotations

from pathlib import Path

from loop import backends as backend_registry
from loop.common.errors import HarnessFailure
from loop.measure.launch import run_worker
from loop.records import gitops


def measure_final(exp, settings) -> dict:
    """Best version vs PyTorch eager and torch.compile, one worker on the target backend."""
    st = exp.state
    workdir = exp.dir / "logs" / "report"
    workdir.mkdir(parents=True, exist_ok=True)
    best = workdir / f"{Path(st.target).stem}__best.py"
    best.write_text(gitops.show_file(exp.root, st.best_commit, st.target))
    job = {"spec": str(exp.root / st.spec), "target_dir": str((exp.root / st.target).parent), "device": st.device,
           "backend": st.target_backend, "impls": [{"label": "best", "path": str(best)}],
           "torch_providers": ["torch_eager", "torch_compile"], "check": ["best", "torch_eager", "torch_compile"],
           "seed": st.seed + 99991, "bench": True}
    raw = run_worker(workdir, job, backend_registry.get(st.target_backend), settings, exp.dir / "triton-cache" / "report", name="final")
    if raw.get("status") != "ok":
        raise HarnessFailure(f"final measurement failed: {raw.get('status')}: {raw.get('message')}")
    rows = []
    for s in raw["timing"]["shapes"]:
        im = s["impls"]
        b, e, c = im["best"]["median_ms"], im["torch_eager"]["median_ms"], im["torch_compile"]["median_ms"]
        rows.append({"shape": "x".join(map(str, s["shape"])), "dtype": s["dtype"], "method": s.get("method", ""),
                     "best (ms)": f"{b:.6f}",
                     "torch eager (ms)": f"{e:.6f}", "torch.compile (ms)": f"{c:.6f}", "vs eager": f"{e / b:.2f}x",
                     "vs torch.compile": f"{c / b:.2f}x",
                     "best, fraction of clone bandwidth": f"{im['best']['frac_clone_bw']:.2f}" if im["best"].get("frac_clone_bw") else "n/a"})
    return {"rows": rows}
