"""The run's judge host (loop/judge/host.py, loop/measure/host.py): judges forked from one process
that imported torch once give the verdicts a new judge process gives, hold nothing of the host,
and a host that dies or cannot serve a request costs the measurement at hand, never a verdict."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from loop import backends
from loop.common.settings import Settings
from loop.measure.launch import JudgeAhead, judge_environment, start_judge_host
from test_judge import ADVERSARIES, alive, judged

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the judge host forks: Linux only")
HOSTED = "forked by the run's judge host"
HONEST = REPO_ROOT / "kernels" / "vector_add" / "vector_add_triton.py"


@pytest.fixture
def host(tmp_path, env):
    h = start_judge_host(Settings(), tmp_path / "host")
    assert h.ready.wait(120), (tmp_path / "host" / "judge-host.log").read_text()
    yield h
    h.close()
    assert h.proc.returncode is not None


@pytest.mark.slow
def test_hosted_judges_give_the_verdicts_of_new_processes(tmp_path, host):
    assert host.not_dumpable  # no same-user process attaches to the process every judge is forked from
    bad = judged(tmp_path / "bad", ADVERSARIES / "replace_comparison.py", host=host)
    assert bad["status"] == "incorrect" and bad["failed_impl"] == "candidate", bad
    assert bad["judge_started"] == HOSTED
    good = judged(tmp_path / "good", HONEST, ahead=True, host=host)
    assert good["status"] == "ok" and good["judge_started"] == HOSTED, good
    assert good["phases_s"]["warm"] < 5  # torch was imported once, by the host, not by this judge
    for folder in ("bad", "good"):
        assert not list((tmp_path / folder).glob("*.pid"))  # every judge and kernel process ended


@pytest.mark.slow
def test_neither_a_hosted_judge_nor_its_kernel_processes_hold_the_hosts_socket(tmp_path, host):
    """The host's end of its socket (fork requests come on it) and the orchestrator's pipes for the
    verdict and the job are in no process that kernel code can reach, nor in the judge itself but
    for its own two pipe ends."""
    ahead = JudgeAhead(tmp_path, "judged", backends.get("interpreter"), Settings(), tmp_path / "cache", "cpu", 2, host=host)
    try:
        assert ahead.launched.proc.poll() is None
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("judged-*.kernel.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the children close what they inherited first thing
        host_socket = {h for h in held(host.proc.pid) if h.startswith("socket:")}
        assert host_socket
        pipes = {f"pipe:[{os.fstat(fd).st_ino}]" for fd in (ahead.launched.piped.read_fd, ahead.launched.job_w)}
        assert not held(ahead.launched.proc.pid) & host_socket
        assert len(held(ahead.launched.proc.pid) & pipes) == 2  # the judge holds its result and job pipes
        kernels = [int(p.read_text()) for p in tmp_path.glob("judged-*.kernel.pid")]
        assert len(kernels) == 2
        for pid in kernels:
            assert not held(pid) & (host_socket | pipes), (pid, held(pid))
    finally:
        ahead.cancel()


def held(pid: int) -> set[str]:
    fd_dir = Path(f"/proc/{pid}/fd")
    return {os.readlink(fd_dir / fd) for fd in os.listdir(fd_dir)}


@pytest.mark.slow
def test_a_host_killed_mid_measurement_fails_it_and_the_next_judge_is_a_new_process(tmp_path, host):
    ahead = JudgeAhead(tmp_path, "judged", backends.get("interpreter"), Settings(), tmp_path / "cache", "cpu", 2, host=host)
    judge = ahead.launched.proc.pid
    os.kill(host.proc.pid, signal.SIGKILL)
    assert host.dead.wait(30)
    deadline = time.monotonic() + 30
    while alive(judge) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(judge)  # its judges die with it
    assert not ahead.usable("judged", tmp_path / "cache")
    ahead.cancel()
    after = judged(tmp_path / "after", HONEST, host=host)
    assert after["status"] == "ok" and after["judge_started"] == "a new process", after


def test_a_request_the_host_cannot_take_on_starts_a_new_process(tmp_path, host):
    env = judge_environment()
    assert host.usable(sys.executable, env)
    assert not host.usable(sys.executable, {**env, "PYTHONHASHSEED": "7"})  # read when an interpreter starts
    assert not host.usable(sys.executable, {**env, "LD_PRELOAD": "libx.so"})
    assert not host.usable("/another/python", env)
    assert host.usable(sys.executable, {**env, "TRITON_CACHE_DIR": "/elsewhere", "ENABLE_TILE": "1"})  # read later
    log = os.open(os.devnull, os.O_WRONLY)
    try:
        assert host.spawn([sys.executable, "-m", "loop.worker", "--probe"], env, tmp_path, log, ()) is None
    finally:
        os.close(log)


def test_the_host_can_be_turned_off(monkeypatch):
    from loop.common import settings

    monkeypatch.setenv("TILELOOP_JUDGE_HOST", "0")
    assert settings.load().judge_host is False
    monkeypatch.setenv("TILELOOP_JUDGE_HOST", "maybe")
    with pytest.raises(Exception, match="TILELOOP_JUDGE_HOST must be one of"):
        settings.load()
