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
    if not raw.isdigit() or os.getpid() == 1:  # the init of a PID namespace of its own (a confined worker:
        return  # `loop.common.namespaces.exec_confined`) cannot name it; its parent-death signal ends it
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


# -- confinement of kernel processes (Linux; elsewhere each part is reported as not in force) --------

PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 3, 4, 24, 36, 38
SCRATCH_MOUNT = "tileloop-scratch"  # the source of each private tmpfs a read-only kernel process writes its temporary files to
CACHE_MOUNT = "tileloop-triton-cache"  # the source of the tmpfs hiding the Triton cache root in a kernel process's mount namespace
CAP_KILL, CAP_SYS_PTRACE = 5, 19
LAST_CAP = 40  # CAP_CHECKPOINT_RESTORE; dropping a capability the kernel does not know fails harmlessly


def _prctl(option: int, arg: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_dumpable(on: bool) -> bool:
    """Not dumpable: no process of the same user attaches to this one, reads or writes its memory
    (/proc/<pid>/mem, process_vm_*) unless it holds CAP_SYS_PTRACE."""
    return _prctl(PR_SET_DUMPABLE, int(on))


def dumpable() -> bool:
    """Whether this process is dumpable (PR_GET_DUMPABLE)."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1
    except (OSError, AttributeError):
        return True


def become_subreaper() -> bool:
    """Orphaned descendants (a double-forked daemon) are re-parented to this process, not to init:
    they stay findable (`Tree`)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def confine_child() -> None:
    """Popen(preexec_fn=...) of a kernel process, before exec: its own session, SIGKILL when its
    parent dies, no new privileges from any exec (setuid binaries, file capabilities), and every
    capability it could attach to or signal another user's process with dropped from its bounding
    set (root keeps its uid, but no CAP_SYS_PTRACE: a process that is not dumpable is out of its reach)."""
    confine_zygote()
    drop_bounding_set()


def confine_zygote() -> None:
    """Popen(preexec_fn=...) of the judge's zygote (`loop.worker.zygote`), and of the launcher of a
    worker that runs kernel code outside a judge (`loop.common.namespaces.exec_confined`): as
    `confine_child`, but its capabilities kept until it has made its PID namespace (as root,
    CLONE_NEWPID needs CAP_SYS_ADMIN); it drops them itself then (`drop_bounding_set`,
    `drop_capabilities`)."""
    os.setsid()
    die_with_parent()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def drop_bounding_set() -> None:
    """Every capability dropped from this process's bounding set (none regained by any exec)."""
    for cap in range(LAST_CAP + 1):
        _prctl(PR_CAPBSET_DROP, cap)


def status_of(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict ({} when it is gone or not Linux)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _stat(pid: int) -> tuple[int, int, int, float, int] | None:
    """(ppid, pgid, session, CPU seconds of the process and its reaped children, start time in clock
    ticks since boot) of `pid`, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return int(fields[1]), int(fields[2]), int(fields[3]), ticks / os.sysconf("SC_CLK_TCK"), int(fields[19])


class Tree:
    """A kernel process and every process it started, found in /proc: members stay in its process
    group (so the judge stops, resumes and kills them with one signal); a descendant that left the
    group (its own session or group) or was orphaned to one of its legitimate parents (the judge, a
    subreaper; the zygote and the init of the kernel processes' PID namespace, `parents`) is a
    stray; the process that keeps a kernel process in a namespace of its own (`keeper`, its parent)
    is none, and the judge names it among the `others` of every tree. `scan` reads only the pids that appeared since the last scan, so it is cheap between
    requests."""

    def __init__(self, pid: int, judge: int | None = None, parents: frozenset[int] = frozenset()):
        self.pid, self.judge = pid, judge or os.getpid()
        self.parents = {self.judge, *parents}
        self.members: set[int] = {pid}
        self.seen: set[int] = set()
        stat = _stat(pid) or (0, 0, 0, 0.0, 0)
        self.born = stat[4]  # an older child of the judge is none of this tree's
        # the parent that keeps it, where it is the init of a namespace of its own (a child of the zygote's init)
        self.keeper = stat[0] if stat[0] and stat[0] not in self.parents else None

    def scan(self, others: set[int] = frozenset()) -> list[int]:
        """New members and strays since the last scan; returns the strays. `others`: the judge's
        other children (other kernel processes), never strays of this tree."""
        try:
            now = {int(p) for p in os.listdir("/proc") if p.isdigit()}
        except OSError:
            return []
        new = now - self.seen
        self.seen = now
        self.members &= now
        stats = {p: s for p in new if (s := _stat(p)) is not None}
        strays, grew = [], True
        while grew:  # a child's parent may be new too
            grew = False
            for p, (ppid, pgid, _, _, born) in list(stats.items()):
                if p in self.members or p in strays:
                    continue
                orphan = ppid in self.parents and p != self.pid and p not in others and born >= self.born
                if ppid in self.members or ppid in strays or orphan:
                    if pgid == self.pid and not orphan:
                        self.members.add(p)
                    else:
                        strays.append(p)
                    grew = True
        return strays

    def cpu_s(self) -> float:
        """CPU seconds used so far by the members (and the children they reaped)."""
        return sum(s[3] for p in self.members if (s := _stat(p)) is not None)

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stopped(self) -> bool:
        """Every thread of every member stopped (or gone). A stop signal takes effect when a thread
        next leaves the kernel: one preempted inside a system call (a kill of its sibling) finishes it
        first, so the judge waits for this before it resumes another tree."""
        for pid in self.members:
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tasks:
                try:
                    raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                except OSError:
                    continue
                if raw[raw.rindex(")") + 2] not in "TtZX":
                    return False
        return True

    def stop(self, within_s: float = 1.0) -> bool:
        """SIGSTOP to the group, and wait until every thread has stopped; False if one did not in time."""
        self.signal(signal.SIGSTOP)
        deadline = time.monotonic() + within_s
        while not self.stopped():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0002)
        return True

    def is_stopped(self) -> bool:
        """The tree's first process stopped (by anyone)."""
        try:
            raw = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return raw[raw.rindex(")") + 2] in "Tt"


def kill_all(pids: list[int]) -> None:
    """Stop, then kill, every pid (stopped first, so that none forks a successor in between)."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def isolation_of(pids: list[int], not_dumpable: bool, subreaper: bool, spawn: str = "fresh exec",
                 no_namespace: str = "unavailable: a kernel process exec'd by the judge shares its PID namespace"
                 ) -> dict[str, str]:
    """The isolation in force around the kernel processes `pids` (read from /proc, not assumed) of a
    judge that is (or is not) dumpable and a subreaper: {"uid": "same" | "separate", "ptrace":
    "blocked" | "open", "descendants": "reaped" | "open", "exec": "fresh", "stopped": "between
    requests" | "no", "pid_namespace": "own" | "unavailable: <why>", "siblings": "hidden" |
    "visible", "triton_cache": "own, others hidden" | "own", "filesystem": "read-only" | "writable",
    "spawn": `spawn`}. A root kernel
    process reaches the judge unless it lost CAP_SYS_PTRACE; any reaches a dumpable one of its own
    uid. "pid_namespace" is "own" when every kernel process is in a PID namespace below the judge's
    (NSpid), where it cannot name the judge to signal it; else `no_namespace` says why not.
    "siblings" is "hidden" when each is the init of a PID namespace of its own (`siblings_hidden`);
    "triton_cache" is "own" (each implementation takes its own folder at its load:
    `loop.common.namespaces.own_triton_cache`), and the others' are hidden when, besides, each has
    the tmpfs over the cache root in its mount namespace (`cache_hidden`); "filesystem" is
    "read-only" when each sees the machine read-only but its own cache and a private /tmp
    (`read_only`)."""
    statuses = [status_of(pid) for pid in pids]
    depth = len((status_of(os.getpid()).get("NSpid") or "").split())
    own = bool(statuses) and depth > 0 and all(len((s.get("NSpid") or "").split()) > depth for s in statuses)

    def has_ptrace(s: dict) -> bool:
        return any(int(s.get(k, "f") or "0", 16) >> CAP_SYS_PTRACE & 1 for k in ("CapBnd", "CapEff", "CapPrm"))

    mine = (status_of(os.getpid()).get("Uid") or "").split()[:1]
    linux = sys.platform.startswith("linux") and all(statuses)
    hidden = linux and siblings_hidden(pids)
    return {"uid": "same" if all((s.get("Uid") or "").split()[:1] == mine for s in statuses) else "separate",
            "ptrace": "blocked" if linux and not_dumpable and not any(map(has_ptrace, statuses)) else "open",
            "descendants": "reaped" if linux and subreaper else "open",
            "exec": "fresh",
            "stopped": "between requests" if linux else "no",
            "pid_namespace": "own" if linux and own else no_namespace,
            "siblings": "hidden" if hidden else "visible",
            "triton_cache": "own, others hidden" if hidden and all(map(cache_hidden, pids)) else "own",
            "filesystem": "read-only" if linux and statuses and all(map(read_only, pids)) else "writable",
            "spawn": spawn}


def siblings_hidden(pids: list[int]) -> bool:
    """Whether no process of `pids` can name another: each the init (pid 1) of a PID namespace of its
    own, none of them the same (their /proc/<pid>/ns/pid), so none below another's."""
    spaces = []
    for pid in pids:
        nspid = (status_of(pid).get("NSpid") or "").split()
        try:
            spaces.append(os.readlink(f"/proc/{pid}/ns/pid"))
        except OSError:
            return False
        if len(nspid) < 2 or nspid[-1] != "1":
            return False
    return bool(pids) and len(set(spaces)) == len(spaces)


def cache_hidden(pid: int) -> bool:
    """Whether the tmpfs that hides the Triton cache root (`loop.common.namespaces.hide_triton_caches`)
    is mounted in `pid`'s mount namespace (its mountinfo)."""
    return any(source == f"tmpfs {CACHE_MOUNT}" for _, _, source in mounts(pid))


def mounts(pid: int) -> list[tuple[str, str, str]]:
    """The mounts `pid` sees, in the order of its mountinfo: (mount point, mount options, "fstype
    source"); [] where it cannot be read."""
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts, kind = fields.split(), rest.split()
        if len(parts) >= 6 and len(kind) >= 2:
            out.append((parts[4], parts[5], f"{kind[0]} {kind[1]}"))
    return out


def read_only(pid: int) -> bool:
    """Whether `pid` sees the machine read-only (`loop.common.namespaces.read_only_view`): its root
    mount read-only and a private tmpfs for its temporary files (its mountinfo; the last mount at a
    point is the one it sees)."""
    seen = {point: (options, source) for point, options, source in mounts(pid)}
    root = seen.get("/")
    scratch = [options for options, source in seen.values() if source == f"tmpfs {SCRATCH_MOUNT}"]
    return root is not None and "ro" in root[0].split(",") and any("rw" in o.split(",") for o in scratch)


PROBE = """
import json, subprocess, sys
from loop.common import settings
from loop.common.processes import become_subreaper, confine_child, confine_zygote, isolation_of, set_dumpable
guard = set_dumpable(False), become_subreaper()
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                         preexec_fn=confine_child)
trial = subprocess.run([sys.executable, "-c", "import json; from loop.common.namespaces import probe; print(json.dumps(probe()))"],
                       capture_output=True, text=True, preexec_fn=confine_zygote).stdout.strip()
zygote = sys.platform.startswith("linux") and settings.load().zygote
said = json.loads(trial) if trial.startswith("{") else {"pid_namespace": "unavailable: the trial failed"}
print(json.dumps({**isolation_of([child.pid], *guard), **({**said, "spawn": "zygote"} if zygote else {})}))
child.stdin.close()
child.wait()
"""


def probe_isolation(python: str | None = None, env: dict | None = None) -> dict[str, str] | None:
    """What a judge started on this machine would have in force (a judge and one kernel process
    started as the judge starts them, and the PID namespaces tried as its zygote would make them,
    its own and one per kernel process below it: `tileloop doctor`); None when the probe fails."""
    import json
    import subprocess

    try:
        done = subprocess.run([python or sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, env=env)
        return json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
