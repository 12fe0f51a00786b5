"""The zygote of a judge's kernel processes: `python -m loop.worker --zygote FD`, exec'd fresh by
the judge (`loop.judge.fork`; never a fork of it, so it never holds the judge's memory) and
confined as a kernel process is (its capabilities dropped once it has made its PID namespace).
It imports what a kernel process needs (torch, Triton, the serve
loop of `loop.worker.serve`) once, without initialising CUDA (a fork after CUDA is initialised is
broken), and then forks one kernel process per request of the judge, which runs the same serve
loop as `python -m loop.worker --serve` (warm-up included), without importing torch again.

Unless TILELOOP_PID_NAMESPACE=0 (or the system forbids it), the zygote first puts its children in a
PID namespace and a mount namespace of their own (`loop.common.namespaces.new_pid_namespace`) and
forks its init (pid 1 there), which mounts their own /proc (the CUDA driver fails where getpid()
and /proc disagree), does the imports and forks the kernel processes: they cannot name the judge,
the orchestrator or any process outside, so they cannot signal them. Where the system allows one
more level (`nested_pid_namespace`; the init keeps CAP_SYS_ADMIN for it, and no other capability),
each kernel process is besides the init (pid 1) of a PID and mount namespace of its own, below
theirs, made by a child of the init that stays its parent (`nest`): it mounts its own /proc, sees
no sibling (the incumbent and the candidate cannot signal each other) and, before it drops its
capabilities, hides the Triton cache root under a tmpfs (`hide_triton_caches`), keeping only a
handle to the folder where it takes its implementation's own cache at its load. Without a
namespace the zygote does this itself, as a subreaper (a kernel process's orphans come back to it,
where the judge finds them).

Over FD (a unix SOCK_SEQPACKET socket) the judge sends one request per kernel process, JSON
{"op": "fork", "workdir", "warm", "pid_file"} with four fds (SCM_RIGHTS): the kernel process's two pipes,
its log and a status socket; before any kernel code runs it writes its pid as the judge names it to
`pid_file`. On the control socket the zygote answers {"init": pid} (its init's pid in the
judge's namespace) and, once ready, {"ready": true, "pid_namespace", "subreaper", "siblings"}
("siblings": "hidden", or why they are visible). On the status socket the kernel process first
sends its credentials (SCM_CREDENTIALS: the kernel gives the judge its pid as the judge names it),
and its parent later its exit code. Every process here dies with its parent (SIGKILL); the judge
closing the control socket ends them all."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import traceback

from loop.common.namespaces import (CAP_SYS_ADMIN, drop_all, drop_capabilities, ended_as, enter_own_namespace,
                                    hide_triton_caches, keep_only, mount_proc, nested_pid_namespace, new_pid_namespace,
                                    outer_pid, read_only_view)
from loop.common.processes import become_subreaper, die_with_parent, drop_bounding_set, kill_process_group, set_dumpable


def main(control_fd: int) -> int:
    control = socket.socket(fileno=control_fd)
    set_dumpable(False)  # the kernel processes' siblings hold the judge's sockets: out of their reach
    namespace = new_pid_namespace()
    if namespace != "own":
        drop_all()
        return init(control, namespace, become_subreaper(), None, "visible: no PID namespace for the kernel processes")
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        die_with_parent()
        if os.getppid() not in (parent, 0):  # 0: its parent is outside its namespace
            os._exit(137)
        try:
            host_proc = mount_proc()
            nested = nested_pid_namespace() if host_proc is not None else "unavailable: no /proc of their own"
            drop_bounding_set()
            if nested != "own" or not keep_only(CAP_SYS_ADMIN):  # only to make each kernel process's namespaces
                drop_capabilities()
                nested = nested if nested != "own" else "unavailable: CAP_SYS_ADMIN could not be kept alone"
            if host_proc is None:
                raise RuntimeError("the init of the kernel processes' namespaces could not mount their /proc")
            code = init(control, namespace, False, host_proc, "hidden" if nested == "own" else f"visible: {nested}")
        except BaseException:  # noqa: BLE001 - said in the log, then the namespace ends with its init
            traceback.print_exc()
            code = 1
        os._exit(code)
    drop_all()
    control.send(json.dumps({"init": pid}).encode())
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        except InterruptedError:
            continue


def init(control: socket.socket, namespace: str, subreaper: bool, host_proc: int | None, siblings: str) -> int:
    """Import what a kernel process needs, say so, then fork one per request until the judge closes
    `control`; each kernel process's exit code goes to its status socket when it is reaped.
    `host_proc`: an fd of the judge's /proc, in a namespace of their own (`mount_proc`); `siblings`:
    "hidden" where each kernel process gets a PID and mount namespace of its own (`nest`), else
    "visible: <why>"."""
    import torch

    import loop.worker.serve  # noqa: F401 - the serve loop and everything it imports, once
    try:
        import triton  # noqa: F401 - imported by every Triton target (cuTile runs may lack it)
    except ImportError:
        pass
    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised in the zygote: its forks could not use it")
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    kernels: dict[int, socket.socket] = {}  # pid (in this namespace) -> its status socket
    control.send(json.dumps({"ready": True, "pid_namespace": namespace, "subreaper": subreaper,
                             "siblings": siblings}).encode())
    while True:
        ready = select.select([control, wake_r], [], [])[0]
        if wake_r in ready:
            while _drain(wake_r):
                pass
            reap(kernels)
        if control in ready:
            message, fds, _, _ = socket.recv_fds(control, 65536, 8)
            if not message:
                for pid in kernels:
                    kill_process_group(pid)  # not reaped yet: its pid is not reused
                return 0
            pid = fork_kernel(json.loads(message), fds, host_proc,
                              [control.fileno(), wake_r, wake_w, *(s.fileno() for s in kernels.values())],
                              siblings == "hidden")
            kernels[pid] = socket.socket(fileno=fds[3])
            for fd in fds[:3]:
                os.close(fd)
            reap(kernels)


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def reap(kernels: dict[int, socket.socket]) -> None:
    """Each kernel process that ended: its exit code to its status socket (only kernel processes
    are reaped here: an orphan stays a zombie, where the judge finds it as a stray)."""
    for pid in list(kernels):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            sock = kernels.pop(pid)
            try:
                sock.send(str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:
                pass
            sock.close()


def fork_kernel(request: dict, fds: list[int], host_proc: int | None, close: list[int], nested: bool = False) -> int:
    """Fork one kernel process on the request's fds (read, write, log, status); its pid here (with
    `nested`, the pid of its parent, `nest`, which ends as it ends)."""
    if len(fds) != 4:
        raise RuntimeError(f"a fork request came with {len(fds)} fds, not 4")
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        code = nest(request, fds, host_proc, parent) if nested else kernel(request, fds, host_proc, parent)
    except BaseException:  # noqa: BLE001 - in the kernel process's log; its exit code says it failed
        traceback.print_exc()
    _end(code)


def _end(code: int):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def nest(request: dict, fds: list[int], host_proc: int | None, parent: int) -> int:
    """In the child the init forked for a kernel process: a PID and mount namespace of the kernel
    process's own, whose init (pid 1) it is, forked there (it sees no sibling, and none sees it);
    this process keeps nothing of it (no fd, no capability) and ends as it ends (`ended_as`)."""
    die_with_parent()
    if os.getppid() != parent:
        return 137
    why = enter_own_namespace()
    if why is not None:
        raise RuntimeError(f"the kernel process's own namespaces: {why}")
    alive_r, alive_w = os.pipe()  # its read end sees EOF once this process is gone
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(alive_w)
            code = kernel(request, fds, host_proc, None, alive_r)
        except BaseException:  # noqa: BLE001 - in the kernel process's log (or the zygote's, before it is set)
            traceback.print_exc()
        _end(code)
    os.close(alive_r)
    for fd in fds:
        os.close(fd)
    if host_proc is not None:
        os.close(host_proc)
    drop_capabilities()
    return ended_as(pid)


def kernel(request: dict, fds: list[int], host_proc: int | None, parent: int | None, alive: int | None = None) -> int:
    """In the forked child: confined as a kernel process is, its pid given to the judge, then the
    serve loop. `alive` (the init of a namespace of its own, `nest`): a pipe whose other end its
    parent holds, in place of `parent` (whose pid it cannot read); it mounts its own /proc and hides
    the Triton cache root (`hide_triton_caches`) before it drops its capabilities."""
    os.setsid()
    die_with_parent()
    if alive is not None:
        gone = bool(select.select([alive], [], [], 0)[0])  # EOF: its parent died before the signal was asked for
        os.close(alive)
        if gone:
            return 137
        own_proc = mount_proc()
        if own_proc is None:
            raise RuntimeError("the kernel process's own namespace could not mount its /proc")
        os.close(own_proc)
        hide_triton_caches()
    elif os.getppid() != parent:
        return 137
    host_pid = os.getpid() if host_proc is None else outer_pid(host_proc)
    if host_proc is not None:
        os.close(host_proc)  # the judge's /proc: never in reach of kernel code
    if request.get("pid_file"):  # for `tileloop resume`: its pid as the judge names it
        part = f"{request['pid_file']}.part"
        with open(part, "w") as pid_file:
            pid_file.write(f"{host_pid}\n")
        os.rename(part, request["pid_file"])
    # in a mount namespace of its own: the machine read-only but its own cache and scratch; then confined as
    # it runs, all before the judge learns its pid and may read its isolation (a judge that is not root reads
    # /proc/<pid>/ns and mountinfo only of a process that is dumpable)
    view = read_only_view() if alive is not None else ""
    drop_capabilities()  # a fork keeps them (no exec clears them): none, as a kernel process exec'd has
    set_dumpable(True)  # as an exec'd kernel process is (CUDA and its tools read /proc/self)
    status = socket.socket(fileno=fds[3])
    status.sendmsg([b"pid"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS,
                               struct.pack("iII", os.getpid(), os.getuid(), os.getgid()))])
    status.close()
    os.dup2(fds[2], 1)
    os.dup2(fds[2], 2)
    os.close(fds[2])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(request["workdir"])
    if view:
        print(f"tileloop: filesystem {view}", file=sys.stderr, flush=True)
    from loop.worker.serve import serve

    return serve(f"{fds[0]},{fds[1]}", request.get("warm"))
