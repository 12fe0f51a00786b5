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


def test_a_kernel_failure_is_one_type_with_one_wire_format_on_both_sides(tmp_path):
    """What kernel code raised, typed in the worker (call_impl), reaches the judge as the kernel
    process's `failure` and a job's result file as status and failed_impl: the same type and fields."""
    import json
    import time

    from loop.common.errors import KernelFailure
    from loop.judge import kernel_process
    from loop.worker import failures, serve
    from loop.worker.entry import write_job_result

    assert failures.KernelFailure is kernel_process.KernelFailure is KernelFailure

    class Side:
        def call(self, msg):
            return failures.call_impl("candidate", "call", lambda: 1 / 0)

    answer = serve.answer(Side(), {"op": "call"})
    detail = answer["failure"].pop("detail")
    assert answer == {"failure": {"status": "runtime_error", "label": "candidate",
                                  "message": "ZeroDivisionError: division by zero"}}
    assert "ZeroDivisionError" in detail and "Traceback" in detail

    def work(job):
        raise KernelFailure("oom", "incumbent", "out of memory", "the log")

    assert write_job_result(tmp_path / "result.json", {"backend": "ptx"}, time.time(), work) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert {k: result[k] for k in ("status", "failed_impl", "message", "detail", "backend")} == {
        "status": "oom", "failed_impl": "incumbent", "message": "out of memory", "detail": "the log", "backend": "ptx"}
