"""Kill the orchestrator (SIGKILL, as a power cut would) on entering each stage of an iteration,
then resume: no iteration lost or counted twice, the in-flight experiment recorded once (as
`crash (interrupted)` unless it had reached `record`), the branch tip the best kept commit,
perf_results.md equal to what `history` rebuilds from git."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loop.records import history
from loop.records.results import read_records
from loop.records.perf_table import Row
from loop.common.settings import KILL_STAGES
from test_e2e_cpu import TARGET, git, small_repo  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def tileloop(repo, *args, kill_at=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILELOOP_")}
    if kill_at:
        env["TILELOOP_TEST_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "loop", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("stage", KILL_STAGES)
def test_kill_at_stage_then_resume(small_repo, stage):
    killed = tileloop(small_repo, "run", TARGET, "--device", "cpu", "--branch", "tileloop/kill", "--max-iters", "2",
                      "--archs", "none", kill_at=stage)
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = json.loads(next((small_repo / "sandbox").glob("*/state.json")).read_text())
    assert state["inflight"]["iteration"] == 1 and state["inflight"]["stage"] == stage

    resumed = tileloop(small_repo, "resume", "--no-continue", "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    out = json.loads(resumed.stdout)
    run_id = out["run"]
    records = read_records(small_repo / "sandbox" / run_id / "results.jsonl")
    assert [r.iteration for r in records] == [0, 1]
    if stage == "record":  # the decision was made and written before the kill: it stands
        # (the first candidate, the autotune space over the current launch, cannot show in interpreter timings)
        assert records[1].status in ("keep", "revert", "unmeasured") and "(interrupted)" not in records[1].optimization
    else:
        assert records[1].status == "crash" and records[1].optimization.endswith("(interrupted)")
        assert records[1].failure.status == "interrupted" and records[1].correctness == "not checked"
    assert out["inflight"] is None

    best = [r for r in records if r.status == "keep"][-1].commit
    assert git(small_repo, "rev-parse", "HEAD").strip() == best
    assert git(small_repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert history.rows(small_repo, run_id, "tileloop/kill") == [Row.from_record(r) for r in records]
    if records[1].status != "keep":
        assert git(small_repo, "rev-parse", f"refs/tileloop/{run_id}/1").strip() == records[1].commit

    # resuming again changes nothing; continuing the unattended run numbers the next iteration 2
    again = tileloop(small_repo, "resume", "--no-continue", "--json")
    assert [r.iteration for r in read_records(small_repo / "sandbox" / run_id / "results.jsonl")] == [0, 1]
    assert again.returncode == 0
    if stage == "record":
        cont = tileloop(small_repo, "resume", "--json")
        assert cont.returncode == 0, cont.stderr[-2000:]
        assert [r.iteration for r in read_records(small_repo / "sandbox" / run_id / "results.jsonl")] == [0, 1, 2]


def test_resume_refuses_another_machine(small_repo):
    assert tileloop(small_repo, "init", TARGET, "--device", "cpu", "--branch", "tileloop/env", "--archs", "none").returncode == 0
    path = next((small_repo / "sandbox").glob("*/state.json"))
    state = json.loads(path.read_text())
    state["env"]["triton_version"] = "0.0.1"
    state["env"]["gpu"] = "Imaginary GPU"
    path.write_text(json.dumps(state))
    res = tileloop(small_repo, "resume", "--no-continue")
    assert res.returncode == 2
    assert "triton_version: '0.0.1' -> '3." in res.stderr and "gpu: 'Imaginary GPU' -> None" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
