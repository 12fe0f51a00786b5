"""Child processes that do not outlive tileloop, even when it is killed with SIGKILL.

Every worker, external command and suite child starts in its own process group (so a timeout or
an interrupt kills the whole group) and, on Linux, with a parent-death signal: the kernel sends
SIGKILL to the child when the tileloop process that started it dies, however it dies. A worker
also watches that process itself (`watch_parent`), for a launcher in between (ncu) and for
systems without a parent-death signal. A worker records its pid in a file beside its result, so
that `tileloop resume` can end a worker of its run that is still alive (`end_leftovers`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

PARENT_ENV = "TILELOOP_PARENT_PID"
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Popen(preexec_fn=...): in the child, before exec, ask for SIGKILL when the parent dies."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: watch_parent still ends a worker whose tileloop died


def kill_process_group(pid: int, alive=lambda: True) -> None:
    """SIGKILL to the process group `pid` leads, or to `pid` alone while it leads none yet (a child
    forked this instant that has not called setsid); `alive` says whether `pid` is still the child
    (not yet reaped), so that a reused pid is never signalled."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        if alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    except PermissionError:
        pass


def watch_parent(interval_s: float = 1.0) -> None:
    """In a worker: end this process (and its group) as soon as the tileloop process that started it
    (named by TILELOOP_PARENT_PID) is gone."""
    raw = os.environ.get(PARENT_ENV, "")
    if not raw.isdigit():
        return
    parent = int(raw)

    def watch() -> None:
        while True:
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                try:
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                finally:
                    os._exit(137)
            except PermissionError:
                pass  # alive, under another user: never the case for a parent, but not a death either
            time.sleep(interval_s)

    if not _alive(parent):
        os._exit(137)
    threading.Thread(target=watch, name="tileloop-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def record_pid(path: Path, pid: int) -> None:
    path.write_text(f"{pid}\n")


def end_leftovers(folder: Path, markers: tuple[str, ...] = ("loop.worker", "loop.judge")) -> list[int]:
    """Kill the process group of every recorded worker, judge or kernel process under `folder` (*.pid
    files) that is still alive and still one of tileloop's (its command line holds one of `markers`: a
    reused pid is left alone); returns the pids ended."""
    ended = []
    for pid_file in sorted(folder.rglob("*.pid")):
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if _alive(pid) and any(m in _command_line(pid) for m in markers):
            try:
                os.killpg(pid, signal.SIGKILL)
                ended.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        pid_file.unlink(missing_ok=True)
    return ended


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        import subprocess

        try:
            return subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True,
                                  timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
