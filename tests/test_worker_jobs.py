"""Worker jobs end to end on the CPU (Triton interpreter), through the real subprocess: the
measurement job with PyTorch stand-ins checked beside the target, as `report --measure` and
`compare` ask for it, and which of the target's kernels ran."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO_ROOT
from loop import backends
from loop.common.settings import Settings
from loop.measure.launch import run_worker


def test_a_job_checks_and_times_torch_stand_ins_beside_the_target(tmp_path, env):
    op = REPO_ROOT / "kernels" / "vector_add"
    job = {"spec": str(op / "spec.py"), "target_dir": str(op), "device": "cpu", "backend": "interpreter",
           "impls": [{"label": "best", "path": str(op / "vector_add_triton.py")}],
           "torch_providers": ["torch_eager"], "check": ["best", "torch_eager"], "seed": 7, "bench": True,
           "dtypes": ["float32"], "timing": {"min_reps": 5, "max_reps": 6, "budget_s": 0.05}}
    raw = run_worker(tmp_path, job, backends.get("interpreter"), Settings(), tmp_path / "cache", name="final")
    assert raw["status"] == "ok", raw.get("message", "") + raw.get("log_tail", "")
    assert {c["label"] for c in raw["correctness"]["checks"]} == {"best", "torch_eager"}
    assert raw["correctness"]["launched"] == {"best": ["add_kernel"], "torch_eager": []}
    (shape,) = raw["timing"]["shapes"]
    assert set(shape["impls"]) == {"best", "torch_eager"} and all(r["ok"] for r in shape["recheck"].values())
    assert not list(Path(tmp_path).glob("*.pid"))  # the worker's pid file is gone with it
