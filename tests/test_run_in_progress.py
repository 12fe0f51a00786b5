"""A run in progress is never doubled: init refuses with the command that continues it, run continues
it unattended; and init killed with SIGKILL during its baseline leaves no worker behind and is
finished by resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from loop.cli import main
from loop.records.results import read_records
from test_e2e_cpu import TARGET, git, small_repo  # noqa: F401  (fixture)
from test_processes import gone

pytestmark = pytest.mark.slow
INIT = ["init", TARGET, "--device", "cpu", "--archs", "none"]


def run_json(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv + ["--json"])
    return code, json.loads(capsys.readouterr().out)


def test_init_refuses_a_second_run_and_run_continues_the_first(small_repo, capsys):
    code, first = run_json(capsys, INIT)
    assert code == 0
    code, again = run_json(capsys, INIT)
    assert code == 2 and "in progress" in again["error"] and first["run"] in again["error"]
    assert f"tileloop resume --run {first['run']}" in again["hint"] and "--branch" in again["hint"]
    assert git(small_repo, "branch", "--list", "tileloop/*").count("tileloop/") == 1

    code, other = run_json(capsys, ["run", TARGET, "--device", "cuda", "--max-iters", "1"])
    assert code == 2 and "--device" in other["error"] and first["run"] in other["error"]  # not with other options

    code, cont = run_json(capsys, ["run", TARGET, "--device", "cpu", "--max-iters", "1"])
    assert code == 0 and cont["run"] == first["run"]  # the same run, now unattended, one experiment further
    assert [r["iteration"] for r in cont["records"]] == [0, 1]
    assert git(small_repo, "branch", "--list", "tileloop/*").count("tileloop/") == 1
    code, second = run_json(capsys, INIT + ["--branch", "tileloop/second"])  # asked for by name: a second run
    assert code == 0 and second["run"] == "second"


def test_init_killed_during_its_baseline_leaves_no_worker_and_resumes(small_repo, capsys):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILELOOP_")}
    proc = subprocess.Popen([sys.executable, "-m", "loop", *INIT], cwd=small_repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    pid_files = []
    while not pid_files and time.monotonic() < deadline and proc.poll() is None:
        pid_files = list((small_repo / "sandbox").glob("*/logs/iter-000/*.pid"))
        time.sleep(0.05)
    assert pid_files, proc.stderr.read() if proc.poll() is not None else "no worker started"
    worker = int(pid_files[0].read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert gone(worker), "the worker outlived its tileloop"

    code, again = run_json(capsys, INIT)
    assert code == 2 and "interrupted at iteration 0" in again["error"] and "tileloop resume" in again["hint"]
    code, resumed = run_json(capsys, ["resume"])
    assert code == 0 and resumed["inflight"] is None
    records = read_records(small_repo / "sandbox" / resumed["run"] / "results.jsonl")
    assert [(r.iteration, r.status) for r in records] == [(0, "keep")]
    assert git(small_repo, "rev-parse", "HEAD").strip() == records[0].commit
    assert git(small_repo, "status", "--porcelain", "--untracked-files=no") == ""
