"""What the commands print, as a person or a program reads it: latencies in sensible digits, a stop
line that says something, JSON that never cuts what the table shortens, readable `status`, a closed
stdout that ends the command quietly, files written with the user's umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest

from loop import decide
from loop.cli import main
from loop.common.files import atomic_write_text, umask
from loop.run.progress import ProgressView, latency_text
from loop.run.unattended import Unattended


def test_latencies_print_six_significant_digits():
    assert latency_text(12.758694000012838) == "12.7587 ms"
    assert latency_text(0.000123456789) == "0.000123457 ms"
    assert latency_text(None) == "-"


def test_the_stop_line_of_an_unattended_run_rounds_its_best_latency():
    lines: list[str] = []
    state = SimpleNamespace(mode="", stopped=None, best_latency_ms=12.758694000012838, best_commit="0123456789abcdef")
    run = SimpleNamespace(state=state, save=lambda: None, log=lines.append, timing_mode="interpreter",
                          stop_state=lambda **_: decide.StopState("stop", "no improvement twice in a row"),
                          progress_view=ProgressView("r", 5, log=lines.append, live=False))
    Unattended._run_loop(run, None)
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
    assert main(["playbook", "list"]) == 141
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
