"""How the judge starts a kernel process, and the boundary around it.

A kernel process never is a fork of the judge: a fork would start with the judge's memory, its
addresses and its imports, and code that knows where the judge keeps its thresholds can rewrite
them. The judge starts a zygote (`loop.worker.zygote`: `python -m loop.worker --zygote FD`, a freshly
executed interpreter, confined as a kernel process is) as soon as it starts its first kernel
process; the zygote imports torch, Triton and the serve loop once (CUDA untouched) and forks each
kernel process the judge asks for over a unix socket (its two pipes and its log passed as fds): the
kernel processes start while the judge starts, and none imports torch again. Where the zygote
cannot be used (not Linux, TILELOOP_ZYGOTE=0, another python asked for, the zygote dead) a kernel
process is a freshly executed interpreter of its own (`python -m loop.worker --serve R,W`).

Either way the kernel process is confined (`loop.common.processes.confine_child`, or the same done
by the zygote after its fork): its own session, SIGKILL when its parent dies (the judge; or the
zygote's init, which dies with the zygote, which dies with the judge), no new privileges from any
exec, every capability dropped (a root kernel process keeps its uid, not CAP_SYS_PTRACE), only its
two pipes and its log inherited. Unless TILELOOP_PID_NAMESPACE=0 (or the system forbids it) the
zygote's kernel processes are in a PID namespace of their own (with a mount namespace and a /proc
of their own, and a user namespace mapping the judge's own uid when the judge is not root): they
cannot name the judge, the orchestrator or any process outside it, so they cannot signal them
(kill; no /proc/<pid> to take a pidfd of). Where the system allows one more level, each is besides
the init of a PID and mount namespace of its own below that one: the incumbent and the candidate
cannot name each other either, and the Triton cache root is hidden under a tmpfs in each, but for
the implementation's own folder (`loop.common.namespaces`: `hide_triton_caches`, `own_triton_cache`).
The judge learns each one's pid as it names it from the credentials the kernel translates
(SCM_CREDENTIALS).

The judge guards itself first (`guard_judge`): not dumpable (a process of the same user without
CAP_SYS_PTRACE cannot attach to it, read or write its memory through /proc/<pid>/mem or
process_vm_*), and a subreaper (a kernel process's orphaned descendants come back to it, or to the
zygote's init or the zygote, a subreaper too: `loop.common.processes.Tree` finds them there).
Between its requests each kernel process's whole tree is stopped (SIGSTOP,
`kernel_process.KernelProcess`), so that neither implementation runs while the other is timed; a
descendant that left its process group or its parent is a stray: killed, and its implementation
refused.

`isolation` says what was in force, for the judge's result and every record: {"uid": "same",
"ptrace": "blocked" | "open", "descendants": "reaped" | "open", "exec": "fresh" (never a fork of
the judge), "stopped": "between requests", "pid_namespace": "own" | "unavailable: <why>",
"siblings": "hidden" | "visible" (whether a kernel process can name another), "triton_cache":
"own, others hidden" | "own" (each implementation compiles into a folder of its own, and cannot
reach the others' where hidden), "filesystem": "read-only" | "writable" (whether a kernel process can
write anything but its own cache folder and a private /tmp: `loop.common.namespaces.read_only_view`), "spawn": "zygote" | "fresh exec"}. "uid" is "same": the kernel process runs as the judge's user; without a
PID namespace of its own it can still send the judge a signal (a measurement it kills or stops
leaves no result, never a verdict); a separate uid would also need the judge's arena files, the
run's Triton cache and CUDA IPC shared with it (not done: docs/architecture.md)."""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from loop.common import settings
from loop.common.processes import (PARENT_ENV, become_subreaper, confine_child, confine_zygote,
                                   isolation_of, record_pid, set_dumpable)

READY_S = 600.0  # the longest the zygote may take to import torch and Triton (a loaded machine)
_GUARD: dict[str, bool] = {}
_SPAWNED: dict[int, str] = {}  # kernel pid -> "zygote" | "fresh exec"
_ZYGOTE: dict[int, "Zygote | None"] = {}  # judge pid -> its zygote (a judge forked by the judge host has its own)


def guard_judge() -> dict[str, bool]:
    """This judge not dumpable and a subreaper (once per process); what took effect."""
    if not _GUARD:
        _GUARD.update(not_dumpable=set_dumpable(False), subreaper=become_subreaper())
    return dict(_GUARD)


def _environment() -> dict[str, str]:
    return {**os.environ, PARENT_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}


def start_kernel(workdir: Path, log_path: Path, fds: tuple[int, int], warm: str | None,
                 python: str | None = None, pid_file: Path | None = None) -> "subprocess.Popen | ZygoteKernel":
    """A confined kernel process serving on `fds` (read, write): forked by this judge's zygote
    (started on the first call) or, where none can be used, a new interpreter. Its pid goes to
    `pid_file` as soon as it is known (a zygote's fork writes it there itself, before kernel code runs)."""
    guard_judge()
    zygote = None
    if python in (None, sys.executable):
        zygote = _ZYGOTE.get(os.getpid())
        if os.getpid() not in _ZYGOTE:
            zygote = _ZYGOTE[os.getpid()] = Zygote.start(workdir, log_path)
    if zygote is not None and zygote.proc.poll() is None:
        return zygote.spawn(workdir, log_path, fds, warm, pid_file)
    proc = fresh_kernel(workdir, log_path, fds, warm, python)
    _SPAWNED[proc.pid] = "fresh exec"
    if pid_file is not None:
        record_pid(pid_file, proc.pid)
    return proc


def fresh_kernel(workdir: Path, log_path: Path, fds: tuple[int, int], warm: str | None,
                 python: str | None = None) -> subprocess.Popen:
    """A confined kernel process serving on `fds` (read, write), as a new interpreter."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [python or sys.executable, "-m", "loop.worker", "--serve", f"{fds[0]},{fds[1]}",
             *(["--warm", warm] if warm else [])],
            cwd=workdir, env=_environment(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            pass_fds=fds, preexec_fn=confine_child)


class Zygote:
    """This judge's zygote (`loop.worker.zygote`), seen from the judge: a control socket to ask it
    for kernel processes, and what it said of itself once ready."""

    def __init__(self, proc: subprocess.Popen, control: socket.socket):
        self.proc, self.control = proc, control
        self.init: int | None = None  # its init's pid (in a PID namespace of their own), as the judge names it
        self.hello: dict | None = None

    @classmethod
    def start(cls, workdir: Path, log_path: Path) -> "Zygote | None":
        """The zygote, started (it imports while the judge goes on); None where none can be used."""
        if not sys.platform.startswith("linux") or not settings.load().zygote:
            return None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zygote_log = log_path.with_name(log_path.name.removesuffix(".kernel.log") + ".zygote.log")
        try:
            with open(zygote_log, "w") as log:
                proc = subprocess.Popen([sys.executable, "-m", "loop.worker", "--zygote", str(theirs.fileno())],
                                        cwd=workdir, env=_environment(), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), preexec_fn=confine_zygote)
        except OSError:
            mine.close()
            return None
        finally:
            theirs.close()
        return cls(proc, mine)

    def ready(self, within_s: float = READY_S) -> dict:
        """What the zygote said once ready ({"pid_namespace", "subreaper"}), or {} if it died first."""
        deadline = time.monotonic() + within_s
        while self.hello is None:
            if not select.select([self.control], [], [], 0.2)[0]:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.hello = {}
                continue
            try:
                raw = self.control.recv(4096)
            except OSError:  # it died
                raw = b""
            message = json.loads(raw) if raw else None
            if not isinstance(message, dict):
                self.hello = {}
            elif "init" in message:
                self.init = int(message["init"])
            elif message.get("ready") is True:
                self.hello = message
        return self.hello

    def parents(self) -> frozenset[int]:
        """The processes a kernel process's orphans may be re-parented to, besides the judge."""
        return frozenset(p for p in (self.proc.pid, self.init) if p)

    def spawn(self, workdir: Path, log_path: Path, fds: tuple[int, int], warm: str | None,
              pid_file: Path | None = None) -> "ZygoteKernel":
        """Ask for a kernel process on `fds` (read, write) logging to `log_path`; it is forked once
        the zygote is ready, and writes its pid (as the judge names it) to `pid_file` then; the
        judge learns it at its first use (`ZygoteKernel.pid`)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        request = json.dumps({"op": "fork", "workdir": str(workdir), "warm": warm,
                              "pid_file": str(pid_file) if pid_file else None}).encode()
        with open(log_path, "w") as log:
            try:
                socket.send_fds(self.control, [request], [fds[0], fds[1], log.fileno(), theirs.fileno()])
            except OSError:
                pass  # the zygote is gone: the kernel process is exec'd instead (`ZygoteKernel.pid`)
        theirs.close()
        kept = (os.dup(fds[0]), os.dup(fds[1]))  # until the fork is known to have happened
        return ZygoteKernel(self, mine, lambda: fresh_kernel(workdir, log_path, kept, warm), kept)


class ZygoteKernel:
    """A kernel process the zygote forked, with what the judge uses of a Popen (pid, poll, wait,
    returncode): its pid comes with its credentials, its exit code from its parent, both over its
    status socket. Should the zygote die before forking it, it is exec'd instead (`fresh_kernel`)."""

    def __init__(self, zygote: Zygote, status: socket.socket, fallback, kept: tuple[int, int]):
        self.zygote, self.status, self.fallback, self.kept = zygote, status, fallback, kept
        self.returncode: int | None = None
        self.exec: subprocess.Popen | None = None
        self._pid: int | None = None

    @property
    def pid(self) -> int:
        """Its pid as the judge names it (waits until the zygote, ready, has forked it)."""
        if self._pid is None:
            self._pid = self._learn_pid()
            for fd in self.kept:
                os.close(fd)
        return self._pid

    def _learn_pid(self) -> int:
        self.zygote.ready()
        while not select.select([self.status], [], [], 0.2)[0]:
            if self.zygote.proc.poll() is not None:
                break
        else:
            try:
                raw, ancillary, _, _ = self.status.recvmsg(16, socket.CMSG_SPACE(struct.calcsize("iII")))
            except OSError:  # its parent gone
                raw, ancillary = b"", []
            for level, kind, data in ancillary:
                if raw == b"pid" and (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS):
                    pid = struct.unpack("iII", data[:struct.calcsize("iII")])[0]
                    _SPAWNED[pid] = "zygote"
                    return pid
            if raw:
                raise RuntimeError(f"the zygote's kernel process said {raw[:40]!r}, not its pid")
        try:
            self.zygote.proc.wait(timeout=10)  # its init gone: it follows
        except subprocess.TimeoutExpired:
            raise RuntimeError("the zygote's kernel process ended before it gave its pid") from None
        self.exec = self.fallback()  # the zygote died before forking it (its forks die with it)
        _SPAWNED[self.exec.pid] = "fresh exec"
        return self.exec.pid

    def poll(self) -> int | None:
        return self.wait(0.0, block=False)

    def wait(self, timeout: float | None = None, block: bool = True) -> int | None:
        pid = self.pid
        if self.exec is not None:
            self.returncode = self.exec.wait(timeout) if block else self.exec.poll()
            return self.returncode
        if self.returncode is None:
            if not select.select([self.status], [], [], timeout)[0]:
                if not block:
                    return None
                raise subprocess.TimeoutExpired(f"kernel process {pid}", timeout or 0.0)
            try:
                raw = self.status.recv(64)
            except OSError:
                raw = b""
            self.returncode = int(raw) if raw.lstrip(b"-").isdigit() else -9  # nothing: its parent died, so did it
        return self.returncode


def isolation(pids: list[int]) -> dict[str, str]:
    """The isolation in force for the kernel processes `pids` (read from /proc, not assumed)."""
    guard = guard_judge()
    zygote = _ZYGOTE.get(os.getpid())
    spawned = {_SPAWNED.get(pid, "fresh exec") for pid in pids}
    spawn = spawned.pop() if len(spawned) == 1 else "zygote and fresh exec"
    hello = zygote.ready() if zygote is not None and spawn != "fresh exec" else {}
    subreaper = guard["subreaper"] and (spawn == "fresh exec" or hello.get("pid_namespace") == "own"
                                        or hello.get("subreaper") is True)
    said = str(hello.get("pid_namespace") or "unavailable: the zygote did not say")
    why = ("unavailable: kernel processes exec'd by the judge share its PID namespace" if spawn != "zygote" else
           said if said != "own" else "unavailable: the kernel processes are not in a PID namespace below the judge's")
    return isolation_of(pids, guard["not_dumpable"], subreaper, spawn, why)


def parents() -> frozenset[int]:
    """The processes besides the judge that a kernel process's orphans may be re-parented to."""
    zygote = _ZYGOTE.get(os.getpid())
    return zygote.parents() if zygote is not None else frozenset()


def full(isolation_: dict[str, str]) -> bool:
    """Whether `isolation_` is the strongest this judge knows (a separate uid is not required)."""
    return (isolation_.get("ptrace") == "blocked" and isolation_.get("descendants") == "reaped"
            and isolation_.get("exec") == "fresh" and isolation_.get("stopped") == "between requests"
            and isolation_.get("pid_namespace") == "own" and isolation_.get("siblings") == "hidden"
            and isolation_.get("triton_cache") == "own, others hidden" and isolation_.get("filesystem") == "read-only")
