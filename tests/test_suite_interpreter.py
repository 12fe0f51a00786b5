"""Every Triton implementation of the reference suite passes its spec under the Triton
interpreter (fp16/fp32 at the correctness shapes; bf16 is not supported there and is reported
as skipped), through the same worker the loop uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop import backends
from loop.measure.launch import run_worker
from loop.common.settings import Settings

pytestmark = pytest.mark.slow
KERNELS = Path(__file__).resolve().parent.parent / "kernels"
TRITON_TARGETS = sorted(KERNELS.glob("*/*_triton.py"))


def test_suite_is_complete():
    ops = {p.parent.name for p in TRITON_TARGETS}
    assert {"vector_add", "silu_mul", "softmax", "layernorm", "rmsnorm", "row_sum", "matmul", "attention"} <= ops
    for op in ops:
        assert (KERNELS / op / "spec.py").is_file() and (KERNELS / op / f"{op}_cutile.py").is_file(), op


@pytest.mark.parametrize("target", TRITON_TARGETS, ids=lambda p: p.parent.name)
def test_triton_target_passes_its_spec_in_the_interpreter(target, tmp_path):
    job = {"spec": str(target.parent / "spec.py"), "target_dir": str(target.parent), "device": "cpu",
           "backend": "interpreter", "impls": [{"label": "candidate", "path": str(target)}], "check": ["candidate"],
           "seed": 7, "bench": False}
    res = run_worker(tmp_path, job, backends.get("interpreter"), Settings(worker_timeout_s=600), tmp_path / "cache")
    assert res["status"] == "ok", (res.get("message"), res.get("log_tail", "")[-1500:])
    checks = res["correctness"]["checks"]
    assert checks and all(c["ok"] for c in checks)
    assert {c["dtype"] for c in checks} & {"float16", "float32"}
    assert "bfloat16" not in {c["dtype"] for c in checks}
    assert res["proof"]["ran"] == "interpreter"
