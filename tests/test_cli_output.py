"""What the commands print, as a person or a program reads it: latencies in sensible digits, a stop
line that says something, JSON that never cuts what the table shortens, readable `status`, a closed
stdout that ends the command quietly, files written with the user's umask."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest

from loop import decide
from loop.cli import main
from loop.common.files import atomic_write_text, umask
from loop.common.messages import Decision
from loop.run.progress import ProgressView, latency_text
from loop.run import unattended


def test_latencies_print_six_significant_digits():
    assert latency_text(12.758694000012838) == "12.7587 ms"
    assert latency_text(0.000123456789) == "0.000123457 ms"
    assert latency_text(None) == "-"


def test_the_stop_line_of_an_unattended_run_rounds_its_best_latency():
    lines: list[str] = []
    state = SimpleNamespace(mode="", stopped=None, best_latency_ms=12.758694000012838, best_commit="0123456789abcdef")
    run = SimpleNamespace(state=state, save=lambda: None, log=lines.append, timing_mode="interpreter",
                          stop_state=lambda **_: decide.Stop("stop", "no improvement twice in a row"),
                          progress_view=ProgressView("r", 5, log=lines.append, live=False))
    unattended.loop(run, None)
    assert lines[-1] == "stopped: stop: no improvement twice in a row; best 12.7587 ms at 0123456789"


class _ClosedPipe:
    """stdout whose reader went away (`tileloop results | head -1`)."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        raise OSError("not a file")


def test_a_closed_stdout_ends_the_command_quietly(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["experience", "list"]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.slow  # a child tileloop: a few seconds
def test_a_reader_that_goes_away_is_no_error_of_tileloop(tmp_path):
    """The console script's whole exit: no `error:` line, no `Exception ignored` at the interpreter's
    exit, and the exit status of a Unix tool whose reader went away."""
    child = subprocess.Popen([sys.executable, "-m", "loop", "playbook", "list"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # before tileloop has written a byte: its first write meets a closed pipe
    err = child.stderr.read().decode()
    assert child.wait() == 141, err
    assert err == ""


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_atomic_writes_honour_the_umask(tmp_path, mask):
    """perf_results.md, report.md and state.json are written by atomic_write_text: with the mode any
    file the user makes gets, not the private mode of a temporary file."""
    old = os.umask(mask)
    try:
        atomic_write_text(tmp_path / "state.json", "{}")
        atomic_write_text(tmp_path / "state.json", "{}\n")  # a rewrite too
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "state.json").stat().st_mode) == 0o666 & ~mask
    assert umask() == old


# ----------------------------------------------------------------------------- reading a run back

LONG_HYPOTHESIS = ("a tile of 1024 elements halves the programs launched and the launch overhead with them, "
                   "so the median should drop by 5-10% at the largest shape and stay level at the smallest")
LONG_REASON = ("slower at 2/3 shapes beyond noise: 0.9412x (0.9301-0.9533) at 8192, 0.9650x (0.9588-0.9701) at "
               "1048576; the smallest shape did not move (1.0021x); the change is reverted and its ref keeps it")


def a_run_with_a_long_hypothesis(root) -> str:
    """A run (as tests/test_json_contract.py makes one) and one reverted experiment, recorded and
    committed with its trailers, whose hypothesis and decision the table shortens."""
    from conftest import git
    from test_json_contract import RUN, make_run

    from loop.measure.evaluate import BackendResult
    from loop.records import history
    from loop.records.results import Record, append_record
    from loop.run import state as st

    make_run(root)
    rec = Record(run=RUN, iteration=1, optimization="tile 1024", status="revert", correctness="PASS", latency_ms=1.25,
                 target_backend="interpreter",
                 backends={"interpreter": BackendResult("interpreter", True, "ok", timing_label="interpreter")},
                 commit=None, parent=None, hypothesis=LONG_HYPOTHESIS, decision=Decision("revert", "regression", LONG_REASON))
    git(root, "commit", "-q", "--allow-empty", "-m", history.commit_message(rec))
    append_record(st.run_dir(root, RUN) / "results.jsonl", dataclasses.replace(rec, commit=git(root, "rev-parse", "HEAD").strip()))
    return RUN


@pytest.mark.parametrize("command", ["history", "results"])
def test_json_never_cuts_what_the_table_shortens(kernel_repo, capsys, command):
    a_run_with_a_long_hypothesis(kernel_repo)
    assert main([command, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][-1]
    assert row["hypothesis"] == LONG_HYPOTHESIS
    assert row["decision"] == f"regression: {LONG_REASON}"
    if command == "history":  # the table itself still fits its columns
        assert main([command]) == 0
        table = capsys.readouterr().out
        assert LONG_HYPOTHESIS[:40] in table and LONG_HYPOTHESIS not in table


def test_status_prints_readable_text(kernel_repo, capsys):
    from test_json_contract import RUN, make_run

    make_run(kernel_repo)
    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert "{" not in text and "[" not in text and "None" not in text, text
    lines = text.splitlines()
    assert lines[0].startswith(f"run: {RUN} on branch ")
    assert "target: kernels/vector_add/vector_add_triton.py (kernel class: element-wise; no matrix product" in text
    assert "device: cpu; timings: interpreter; target backend: interpreter; backends: interpreter" in lines
    assert "in flight: nothing" in lines and any(line.startswith("best: ") and line.endswith(" (not timed)") for line in lines)
    assert "hazard: line 11: add_kernel: 2 tensor-of-pointer load(s)" in text
    assert "not stopped: no stop rule fires yet; an edit of the target, then tileloop step goes on" in lines


def test_resume_without_going_on_says_the_run_has_not_stopped(kernel_repo, capsys, monkeypatch):
    """`resume --no-continue` of a run no stop rule has stopped printed `stopped: continue: `."""
    from loop.cli import common as cli_common

    class Run:
        state = SimpleNamespace(run_id="r1", mode="run")
        perf_path = kernel_repo / "perf_results.md"

        def records(self):
            return []

    Run.perf_path.write_text("| table |\n")
    monkeypatch.setattr(cli_common, "status_payload", lambda exp: {})
    args = SimpleNamespace(json=False, command="resume")
    cli_common.finish_run(args, Run(), decide.Stop("continue", ""))
    out = capsys.readouterr().out
    assert out.endswith("not stopped: no stop rule fires yet; tileloop resume --run r1 goes on\n")
    cli_common.finish_run(args, Run(), decide.Stop("stop", "reached --max-iters 1"))
    assert capsys.readouterr().out.endswith("\nstopped: stop: reached --max-iters 1\n")


def test_history_in_a_clone_says_how_to_read_a_run_from_its_branch(kernel_repo, tmp_path, capsys):
    from conftest import git

    git(kernel_repo, "branch", "tileloop/vector_add-20260101-0000")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(kernel_repo), str(clone))
    os.chdir(clone)
    assert main(["history"]) == 2
    err = capsys.readouterr().err
    assert "a clone has none" in err and "tileloop history --branch tileloop/<run>" in err
    assert "run branches here: origin/tileloop/vector_add-20260101-0000" in err
    assert "git fetch origin 'refs/tileloop/*:refs/tileloop/*'" in err
