"""How the judge starts a kernel process, and the boundary around it.

A kernel process is a freshly executed interpreter (`python -m loop.worker --serve R,W`), never a
fork of the judge: a fork would start with the judge's memory, its addresses and its imports, and
code that knows where the judge keeps its thresholds can rewrite them. Before exec the child is
confined (`loop.common.processes.confine_child`): its own session, SIGKILL when the judge dies, no
new privileges from any exec, every capability dropped from its bounding set (a root kernel
process keeps its uid, not CAP_SYS_PTRACE), only its two pipes and its log inherited.

The judge guards itself first (`guard_judge`): not dumpable (a process of the same user without
CAP_SYS_PTRACE cannot attach to it, read or write its memory through /proc/<pid>/mem or
process_vm_*), and a subreaper (a kernel process's orphaned descendants come back to it, where
`loop.common.processes.Tree` finds them). Between its requests each kernel process's whole tree is
stopped (SIGSTOP, `kernel_process.KernelProcess`), so that neither implementation runs while the
other is timed; a descendant that left its process group or its parent is a stray: killed, and its
implementation refused.

`isolation` says what was in force, for the judge's result and every record: {"uid": "same",
"ptrace": "blocked" | "open", "descendants": "reaped" | "open", "exec": "fresh", "stopped":
"between requests"}. "uid" is "same": the kernel process runs as the judge's user, so it can still
send the judge a signal (a measurement it kills or stops leaves no result, never a verdict); a
separate uid would also need the judge's arena files, the run's Triton cache and CUDA IPC shared
with it (not done: docs/architecture.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from loop.common.processes import PARENT_ENV, become_subreaper, confine_child, isolation_of, set_dumpable

_GUARD: dict[str, bool] = {}


def guard_judge() -> dict[str, bool]:
    """This judge not dumpable and a subreaper (once per process); what took effect."""
    if not _GUARD:
        _GUARD.update(not_dumpable=set_dumpable(False), subreaper=become_subreaper())
    return dict(_GUARD)


def start_kernel(workdir: Path, log_path: Path, fds: tuple[int, int], warm: str | None,
                 python: str | None = None) -> subprocess.Popen:
    """A confined kernel process serving on `fds` (read, write), as a new interpreter."""
    guard_judge()
    env = {**os.environ, PARENT_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [python or sys.executable, "-m", "loop.worker", "--serve", f"{fds[0]},{fds[1]}",
             *(["--warm", warm] if warm else [])],
            cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            pass_fds=fds, preexec_fn=confine_child)


def isolation(pids: list[int]) -> dict[str, str]:
    """The isolation in force for the kernel processes `pids` (read from /proc, not assumed)."""
    guard = guard_judge()
    return isolation_of(pids, guard["not_dumpable"], guard["subreaper"])


def full(isolation_: dict[str, str]) -> bool:
    """Whether `isolation_` is the strongest this judge knows (a separate uid is not required)."""
    return (isolation_.get("ptrace") == "blocked" and isolation_.get("descendants") == "reaped"
            and isolation_.get("exec") == "fresh" and isolation_.get("stopped") == "between requests")
