"""Nothing of a run outlives it outside sandbox/: a CPU arena's file loses its name as soon as every
kernel process has opened it, the names a killed judge left are swept by the next tileloop command
(and the next arena), and a failure's traceback log of a test goes to that test's temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from loop.cli import COMMANDS, main
from loop.common import arena


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_an_arena_file_loses_its_name_once_the_kernel_process_has_opened_it(tmp_path):
    shared = arena.Arena(torch, "cpu", 4096, folder=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [shared.path.name]  # named until opened
    theirs = arena.open_arena(torch, shared.handle)  # the kernel process's view of it
    x, desc = shared.place(torch.arange(8, dtype=torch.float32))
    assert list(tmp_path.iterdir()) == []  # the first use removed the name ...
    seen = arena.view(torch, {shared.id: theirs}, desc)
    assert torch.equal(seen, x)  # ... and both sides still share the memory
    seen.mul_(2)
    assert torch.equal(x, torch.arange(8, dtype=torch.float32) * 2)
    shared.close()


def test_sweep_removes_the_arenas_of_dead_judges_only(tmp_path):
    dead = tmp_path / f"{arena.PREFIX}{dead_pid()}-0123456789ab"
    live = tmp_path / f"{arena.PREFIX}{os.getpid()}-0123456789ab"
    other = tmp_path / "tileloop-arena-notapid"
    for p in (dead, live, other):
        p.write_bytes(b"x")
    assert arena.sweep(tmp_path) == [dead]
    assert sorted(tmp_path.iterdir()) == sorted([live, other])


def test_a_new_arena_sweeps_what_a_dead_judge_left(tmp_path):
    dead = tmp_path / f"{arena.PREFIX}{dead_pid()}-0123456789ab"
    dead.write_bytes(b"x" * 4096)
    shared = arena.Arena(torch, "cpu", 4096, folder=tmp_path)
    assert not dead.exists()
    shared.close()
    assert list(tmp_path.iterdir()) == []


def test_every_tileloop_command_sweeps_what_a_dead_judge_left(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(arena, "default_folder", lambda: tmp_path)
    dead = tmp_path / f"{arena.PREFIX}{dead_pid()}-0123456789ab"
    dead.write_bytes(b"x")
    assert main(["playbook", "list"]) == 0
    assert not dead.exists()


def test_a_failure_log_of_a_test_stays_in_its_temporary_folder(tmp_path, monkeypatch, capsys, tmp_path_factory):
    """tests/conftest.py points the temporary folder of every test at a folder of its own, so the
    traceback log of a failure outside a run (loop/cli/common.py) is not left in the system's."""
    def broken(args, settings):
        raise RuntimeError("planted")

    monkeypatch.chdir(tmp_path)  # no run, no repository: the log goes to the temporary folder
    monkeypatch.setitem(COMMANDS, "status", broken)
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    log = Path(err.split("the traceback is in ")[1].rstrip(")\n"))
    assert log.is_file() and "planted" in log.read_text()
    assert log.is_relative_to(tmp_path_factory.getbasetemp())
    assert Path(tempfile.gettempdir()).is_relative_to(tmp_path_factory.getbasetemp())
    assert Path(os.environ["TMPDIR"]).is_relative_to(tmp_path_factory.getbasetemp())  # and a child's


def test_a_scratch_folder_of_a_killed_command_is_removed_by_the_next_one(tmp_path):
    """probe, check, compile, profile and friends work in scratch folders named after their process:
    one left by a kill -9 goes at the next tileloop command; a live process's stays."""
    import subprocess
    import sys

    from loop.common import files

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    left = tmp_path / f"{files.SCRATCH}{dead}-probe-abc"
    (left / "sub").mkdir(parents=True)
    (left / "sub" / "f.txt").write_text("x")
    mine = tmp_path / f"{files.SCRATCH}{os.getpid()}-check-xyz"
    mine.mkdir()
    assert files.sweep_scratch(tmp_path) == [left]
    assert not left.exists() and mine.exists()
    with files.scratch("compile") as tmp:
        assert Path(tmp).name.startswith(f"{files.SCRATCH}{os.getpid()}-compile-")
