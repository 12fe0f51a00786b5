"""What an experiment does not do twice: the compile gate of a source that passed it in this process
(a remeasure, an A/A pair) and the device's health round trip right after a judge got the device's
answers. Each is shown by counting the workers that would have started."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from loop import decide
from loop.common.settings import Settings
from loop.records import gitops
from loop.run import core, measuring
from loop.run import state as st
from loop.run.core import Run

KERNEL = Path(__file__).resolve().parent.parent / "kernels" / "vector_add"
TARGET, SPEC = "kernels/vector_add/vector_add_triton.py", "kernels/vector_add/spec.py"


@pytest.fixture
def run(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(KERNEL, repo / "kernels" / "vector_add", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    state = st.RunState(run_id="r", branch="tileloop/r", origin_branch="main", target=TARGET, spec=SPEC,
                        language="triton", op="vector_add", device="cuda", target_backend="ptx",
                        backends=["ptx"], availability={"ptx": {"available": True, "reason": ""}},
                        base_commit="0" * 40, seed=0, env={}, untracked_at_start=[],
                        policy=asdict(decide.Policy()), created="now", archs=["sm_90", "sm_100"])
    return Run(repo, state, Settings(judge_host=False), log=lambda line: None)


class Gate:
    """Stands in for `compile_gate`: counts its calls, passes unless told to fail."""

    def __init__(self):
        self.calls, self.status = 0, "ok"

    def __call__(self, **kwargs):
        self.calls += 1
        return {"status": self.status, "message": "ptxas error" if self.status != "ok" else "",
                "compile": {"ok": self.status == "ok", "results": []}}


def candidate(run: Run, n: int, source: str) -> Path:
    workdir = run.iter_dir(n)
    workdir.mkdir(parents=True, exist_ok=True)
    return measuring.implementations(run, workdir, {"candidate": source})["candidate"]


def test_a_source_that_passed_the_gate_is_not_built_again(run, monkeypatch):
    gate = Gate()
    monkeypatch.setattr(measuring, "compile_gate", gate)
    src = (run.root / TARGET).read_text()
    assert measuring.verify(run, 1, run.iter_dir(1), candidate(run, 1, src))[0] is None
    assert measuring.verify(run, 1, run.iter_dir(1), candidate(run, 1, src))[0] is None  # the remeasure
    assert gate.calls == 1
    changed = src.replace("BLOCK = 128", "BLOCK = 256")
    assert changed != src
    measuring.verify(run, 2, run.iter_dir(2), candidate(run, 2, changed))
    assert gate.calls == 2  # another source is built
    run.state.archs = ["sm_90"]
    measuring.verify(run, 3, run.iter_dir(3), candidate(run, 3, changed))
    assert gate.calls == 3  # the same source for other architectures is built


def test_a_failed_gate_is_not_remembered(run, monkeypatch):
    gate = Gate()
    gate.status = "compile_error"
    monkeypatch.setattr(measuring, "compile_gate", gate)
    src = (run.root / TARGET).read_text()
    failed, _ = measuring.verify(run, 1, run.iter_dir(1), candidate(run, 1, src))
    assert failed is not None and failed["ptx"].status == "compile_error"
    failed, _ = measuring.verify(run, 2, run.iter_dir(2), candidate(run, 2, src))
    assert failed is not None and gate.calls == 2


def test_the_health_round_trip_is_skipped_only_right_after_the_device_answered(run, monkeypatch):
    started = []

    def worker(*args, **kwargs):
        started.append(kwargs.get("name"))
        return {"status": "ok"}

    monkeypatch.setattr(core, "run_worker", worker)
    assert run.gpu_health() is None and started == ["health"]  # nothing answered yet: the worker runs
    run.device_answered = time.monotonic()
    assert run.gpu_health() is None and started == ["health"]
    run.device_answered = time.monotonic() - core.HEALTH_FRESH_S - 1
    assert run.gpu_health() is None and started == ["health", "health"]


@pytest.mark.parametrize("status, answered", [("ok", True), ("timeout", False), ("harness_error", False)])
def test_a_judge_that_got_answers_stands_for_the_round_trip(run, monkeypatch, status, answered):
    class Measured:
        raw = {"ptx": {"status": status}}

    monkeypatch.setattr(measuring, "measure", lambda **kwargs: Measured())
    measuring.judged(run, 1, run.iter_dir(1), {}, [], ["ptx"], lambda what: None)
    assert (run.device_answered is not None) is answered
