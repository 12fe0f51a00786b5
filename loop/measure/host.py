"""The run's judge host, as the orchestrator holds it: one process per unattended run that has
imported torch and the judge once and forks a new judge for every measurement after it is ready
(`python -m loop.judge --host`, `loop/judge/host.py` says what it is and is not trusted with).

A measurement asked of it before it is ready, or with an environment that a fork could not take
on (variables an interpreter or a library reads at its start: PYTHON*, LD_*, OMP_*, ...), or after
it died, is started as a new process instead, as without a host. A judge it forked is handled as
a `subprocess.Popen` is (`Hosted`: pid, poll, wait, returncode): its own session, killed by group."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from loop.common.processes import die_with_parent

# read by an interpreter, a dynamic loader or a threading library when a process starts: a
# judge forked from the host keeps the host's values, so these must be the same in its request
STARTUP_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "TORCH_", "MALLOC_")
NOT_STARTUP = ("PYTHONUNBUFFERED",)


def startup_environment(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES) and k not in NOT_STARTUP}


class JudgeHost:
    """Started with the environment its judges share (`env`); `spawn` forks a judge from it."""

    def __init__(self, python: str, env: dict, cwd: Path, log_path: Path):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.python, self.cwd, self.env = python, str(cwd), startup_environment(env)
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen([python, "-m", "loop.judge", "--host", str(theirs.fileno())], cwd=cwd, env=env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         pass_fds=(theirs.fileno(),), start_new_session=True, preexec_fn=die_with_parent)
        theirs.close()
        self.sock, self.log_path = mine, log_path
        self.ready, self.dead = threading.Event(), threading.Event()
        self.not_dumpable = False
        self._replies: queue.Queue = queue.Queue()
        self._exits: dict[int, int] = {}
        self._exited = threading.Condition()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="tileloop-judge-host", daemon=True).start()

    def _read(self) -> None:
        try:
            while data := self.sock.recv(1 << 16):
                message = json.loads(data)
                if "ready" in message:
                    self.not_dumpable = bool(message.get("not_dumpable"))
                    self.ready.set()
                elif "exit" in message:
                    with self._exited:
                        self._exits[int(message["exit"])] = int(message["code"])
                        self._exited.notify_all()
                else:
                    self._replies.put(message)
        except (OSError, ValueError):
            pass
        self.dead.set()
        self._replies.put({"error": "the judge host is gone"})
        with self._exited:
            self._exited.notify_all()

    def usable(self, python: str, env: dict) -> bool:
        return (self.ready.is_set() and not self.dead.is_set() and python == self.python
                and startup_environment(env) == self.env)

    def spawn(self, cmd: list[str], env: dict, cwd: Path, log_fd: int, fds: tuple[int, ...]) -> "Hosted | None":
        """A judge forked for `cmd` (`python -m loop.judge ...`), with `env`, in `cwd`, holding
        `log_fd` as its output and `fds` (named by their numbers in `cmd`); None if the host cannot
        (not ready, gone, another interpreter or start-up environment): the caller starts a process."""
        if cmd[1:3] != ["-m", "loop.judge"] or not self.usable(cmd[0], env):
            return None
        request = {"argv": cmd[3:], "env": env, "cwd": str(cwd), "fds": list(fds), "host_cwd": self.cwd}
        with self._lock:
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [log_fd, *fds])
                reply = self._replies.get(timeout=30)
            except (OSError, queue.Empty):
                return None
        return Hosted(self, int(reply["pid"])) if "pid" in reply else None

    def exit_code(self, pid: int) -> int | None:
        with self._exited:
            if pid in self._exits:
                return self._exits[pid]
            return -9 if self.dead.is_set() else None  # its judges die with it (parent-death signal)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._exited:
            while (code := self.exit_code(pid)) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._exited.wait(timeout=0.5 if left is None else min(left, 0.5))
            return code

    def close(self) -> None:
        try:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread; the host reads the end
            except OSError:
                pass
            self.sock.close()  # the host ends its judges and exits
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Hosted:
    """A judge forked by the host, with the part of `subprocess.Popen` that `loop.measure.launch` uses."""

    def __init__(self, host: JudgeHost, pid: int):
        self.host, self.pid, self.returncode = host, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.host.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.host.wait_exit(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"judge {self.pid}", timeout)
        return self.returncode


def start_host(python: str, env: dict, folder: Path) -> JudgeHost | None:
    """The run's judge host, on Linux (elsewhere None: every judge is a new process)."""
    if not sys.platform.startswith("linux"):
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return JudgeHost(python, env, folder, folder / "judge-host.log")
