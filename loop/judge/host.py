"""`python -m loop.judge --host FD`: a process that has imported torch and the judge once, and forks
a fresh judge for each measurement of a run, so that no measurement but the first waits seconds
for `import torch` (its kernel processes are new interpreters, never forks of it: `loop.judge.fork`).

It never runs kernel code, a spec or a job: it reads fork requests from the socket the
orchestrator made (a socketpair, never a name on disk that a candidate could take over), each
with the judge's arguments, its environment, its folder and the descriptors it is to hold (log,
result pipe, job pipe) passed with the request; it answers each with the new judge's pid, and
tells the exit status of every judge it reaped. What a judge inherits is this process before any
measurement: torch and tileloop's judge imported, nothing of any earlier job (each judge is a new
fork, none is reused). It cannot be attached to by a same-user process (not dumpable), it dies
with the orchestrator, and its judges die with it. A judge it forked stays not dumpable and
becomes a subreaper (`loop.judge.fork.guard_judge`); its kernel processes map its CUDA memory by
IPC handle (legacy CUDA IPC; whether a driver asks ptrace access for it is to be seen on the GPU).

Protocol (AF_UNIX SOCK_SEQPACKET, JSON per message): host -> `{"ready": pid}` once; request
`{"argv": [...], "env": {...}, "cwd": str, "fds": [n, ...]}` with descriptors [log, *fds] ->
`{"pid": pid}` (or `{"error": str}`); later `{"exit": pid, "code": int}` per judge."""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import traceback

from loop.common.processes import die_with_parent, kill_process_group, set_dumpable, watch_parent

MAX_MESSAGE = 1 << 20


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--host" or not argv[1].isdigit():
        print("usage: python -m loop.judge --host FD", file=sys.stderr)
        return 2
    watch_parent()
    guarded = set_dumpable(False)
    import torch  # noqa: F401 - what every judge would otherwise import again

    import loop.judge.entry  # noqa: F401
    import loop.judge.run  # noqa: F401 - the judge's modules, imported once

    sock = socket.socket(fileno=int(argv[1]))
    sock.send(json.dumps({"ready": os.getpid(), "not_dumpable": guarded}).encode())
    judges: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable and not _serve_one(sock, judges):
                break
            _reap(sock, judges)
    finally:
        for pid in judges:  # the orchestrator is gone or closed the host: no judge outlives it
            kill_process_group(pid)  # unreaped children: never a reused pid
    return 0


def _serve_one(sock: socket.socket, judges: set[int]) -> bool:
    """One fork request; False when the orchestrator closed its end."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
    except OSError:
        return False
    if not data:
        return False
    try:
        request = json.loads(data)
        pid = _fork_judge(sock, request, fds)
        judges.add(pid)
        reply = {"pid": pid}
    except Exception as exc:  # noqa: BLE001 - a bad request is answered, the host goes on
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for fd in fds:
            os.close(fd)
    _send(sock, reply)
    return True


def _reap(sock: socket.socket, judges: set[int]) -> None:
    while judges:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            judges.clear()
            return
        if pid == 0:
            return
        judges.discard(pid)
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, message: dict) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        pass  # the orchestrator is gone: the parent watch ends this process


def _fork_judge(sock: socket.socket, request: dict, fds: list[int]) -> int:
    argv, env, cwd, passed = request["argv"], request["env"], request["cwd"], request.get("fds", [])
    if len(fds) != 1 + len(passed):
        raise ValueError(f"{len(fds)} descriptors came with a request that names {1 + len(passed)}")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        sock.close()
        os.setsid()
        die_with_parent()
        log, mapping = fds[0], {str(old): str(new) for old, new in zip(passed, fds[1:])}
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        if sys.path and sys.path[0] == request.get("host_cwd"):
            sys.path[0] = cwd  # as `python -m loop.judge` started in `cwd` would have it
        argv = [mapping.get(a, a) if i and argv[i - 1].endswith("-fd") else a for i, a in enumerate(argv)]
        from loop.judge.entry import main as judge

        code = judge([*argv, "--hosted"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the judge's own failure, to its log; never back into the host's loop
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code or 0)
