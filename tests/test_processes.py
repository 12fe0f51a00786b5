"""No orphans: a child started by tileloop dies with it, even under SIGKILL, and `resume` ends a
recorded worker of its run that is still alive (and nothing else)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from loop.common.processes import end_leftovers, record_pid


def gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a killed child of ours stays a zombie until reaped: that is gone too
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_child_dies_with_its_parent_even_under_sigkill(tmp_path):
    parent = textwrap.dedent("""
        import subprocess, sys, time
        from loop.common.processes import die_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                                 preexec_fn=die_with_parent)
        print(child.pid, flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    child = int(proc.stdout.readline())
    assert not gone(child, within_s=0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert gone(child)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers, /proc: Linux")
def test_an_orphan_of_a_zygote_is_a_stray_only_where_the_zygote_is_a_named_parent():
    """A kernel process started by a subreaper between it and the judge (as the judge's zygote is)
    double-forks a daemon: orphaned to that subreaper, the daemon is a stray of the tree that names
    the subreaper among its parents, and invisible to one that knows only the judge."""
    zygote = textwrap.dedent("""
        import subprocess, sys, time
        from loop.common.processes import become_subreaper, confine_child
        assert become_subreaper()
        daemon = ("import os, time\\n"
                  "if os.fork() == 0:\\n"
                  "    os.setsid()\\n"
                  "    if os.fork() == 0:\\n"
                  "        print('d', os.getpid(), flush=True); time.sleep(60)\\n"
                  "    os._exit(0)\\n"
                  "os.wait(); time.sleep(60)\\n")
        kernel = subprocess.Popen([sys.executable, "-c", daemon], preexec_fn=confine_child)
        print("k", kernel.pid, flush=True)
        time.sleep(60)
    """)
    from loop.common.processes import Tree, kill_all

    proc = subprocess.Popen([sys.executable, "-c", zygote], stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    lines: dict[str, str] = {}
    try:
        lines.update([proc.stdout.readline().split()])
        kernel = int(lines["k"])
        named, judge_only = Tree(kernel, parents=frozenset({proc.pid})), Tree(kernel)
        named.scan(), judge_only.scan()
        lines.update([proc.stdout.readline().split()])
        daemon = int(lines["d"])
        time.sleep(0.3)  # its middle process exits: the daemon is orphaned to the zygote
        assert named.scan() == [daemon] and judge_only.scan() == [], (daemon, named.members, judge_only.members)
    finally:
        kill_all([int(lines["d"])] if "d" in lines else [])
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_worker_watches_the_tileloop_that_started_it(tmp_path):
    """Without the parent-death signal (a launcher in between, another system), the worker itself
    ends when the process named by TILELOOP_PARENT_PID is gone."""
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    worker = subprocess.Popen([sys.executable, "-c", "from loop.common.processes import watch_parent; import time; "
                               "watch_parent(0.1); time.sleep(120)"],
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TILELOOP_PARENT_PID": str(stand_in.pid)},
                              start_new_session=True)
    assert not gone(worker.pid, within_s=1.0)
    stand_in.kill()
    stand_in.wait()
    assert worker.wait(timeout=10) != 0


def test_resume_ends_a_recorded_worker_that_is_still_alive_and_nothing_else(tmp_path):
    logs = tmp_path / "logs" / "iter-003"
    logs.mkdir(parents=True)
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    worker = subprocess.Popen(sleeper + ["-m", "loop.worker"], start_new_session=True)  # a worker's command line
    stranger = subprocess.Popen(sleeper, start_new_session=True)  # a reused pid: not a worker
    record_pid(logs / "worker-ptx.pid", worker.pid)
    record_pid(logs / "compile.pid", stranger.pid)
    try:
        assert end_leftovers(tmp_path / "logs") == [worker.pid]
        assert worker.wait(timeout=10) == -signal.SIGKILL
        assert stranger.poll() is None
        assert not list(logs.glob("*.pid"))
    finally:
        stranger.kill()
        stranger.wait()
