"""Kernel processes forked from the judge. Importing torch takes seconds; a judge and two kernel
processes importing it side by side take longer still. So once the judge has imported torch, and
before it makes its CUDA context (a CUDA process must not fork), it forks its kernel processes: each
child starts with torch already imported and becomes `python -m loop.worker --serve R,W` on the
spot. What it inherits is the judge before any job data, spec or kernel code: in the child every
file descriptor but its two pipes and its log is closed first (the judge's result pipe among them),
it starts its own session, dies with the judge, and never returns into the judge's code.

Where the judge cannot fork (not Linux, torch not imported yet, or its CUDA context already made),
the kernel process is started as a new interpreter instead (`loop.judge.kernel_process`)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

from loop.common.processes import PARENT_ENV, die_with_parent


def can_fork() -> bool:
    """Linux only (elsewhere a process that loaded system frameworks may not fork safely), torch
    imported, no CUDA context yet."""
    torch = sys.modules.get("torch")
    return sys.platform.startswith("linux") and torch is not None and not torch.cuda.is_initialized()


class Forked:
    """A forked child as the judge handles it (subprocess.Popen's names: pid, poll, wait, returncode)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -9
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"kernel process {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode


def fork_kernel(workdir: Path, log_path: Path, fds: tuple[int, int], warm: str | None) -> Forked:
    """A kernel process serving on `fds` (read, write), forked from this judge."""
    sys.stdout.flush()
    sys.stderr.flush()
    judge = os.getpid()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # here: the judge may rename it at once
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the judge's parent-watch thread sleeps: no lock is held
        pid = os.fork()
    if pid:
        os.close(log)
        return Forked(pid)
    _become_kernel(judge, workdir, log, fds, warm)  # never returns
    raise AssertionError("unreachable")


def _become_kernel(judge: int, workdir: Path, log: int, fds: tuple[int, int], warm: str | None) -> None:
    code = 1
    try:
        os.setsid()
        die_with_parent()
        os.chdir(workdir)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        _close_all_but({0, 1, 2, *fds})
        os.environ[PARENT_ENV] = str(judge)
        os.environ["PYTHONUNBUFFERED"] = "1"
        entry = importlib.import_module("loop.worker.entry")  # from here on this process is a kernel process
        code = entry.main(["--serve", f"{fds[0]},{fds[1]}", *(["--warm", warm] if warm else [])])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child's own failure, to its log; it must not unwind into the judge
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code or 0)


def _close_all_but(keep: set[int]) -> None:
    for fd in sorted(int(fd) for fd in os.listdir("/proc/self/fd")):  # Linux only, as `can_fork` says
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
