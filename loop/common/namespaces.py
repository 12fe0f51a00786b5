"""A PID namespace for a judge's kernel processes, and what a kernel process forked rather than
exec'd drops itself (Linux). In a PID namespace of their own the kernel processes cannot name the
judge, the orchestrator or any process outside it: kill(2) and pidfd_send_signal(2) reach none of
them. Used by the judge's zygote (`loop.worker.zygote`); TILELOOP_PID_NAMESPACE=0 turns it off."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from loop.common.processes import status_of


CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
NAMESPACE_ENV = "TILELOOP_PID_NAMESPACE"  # "0": kernel processes share the judge's PID namespace
_CAPABILITY_V3 = 0x20080522


def _unshare(flags: int) -> str | None:
    """unshare(2) (os.unshare where Python has it); None, or why it failed."""
    try:
        if hasattr(os, "unshare"):
            os.unshare(flags)
            return None
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(flags) == 0:
            return None
        return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        return str(exc)


def new_pid_namespace(user: bool | None = None) -> str:
    """Put this process's next children in a new PID namespace (the first one forked is its init,
    pid 1; this process may start no thread after it): "own", or "unavailable: <why>". As root
    (holding CAP_SYS_ADMIN) CLONE_NEWPID alone suffices; otherwise (or when `user` asks for it) with
    a new user namespace that maps this process's own uid and gid, so that its processes keep the
    judge's uid and gain nothing outside; that is tried in a forked child first, so a failure leaves
    this process as it was. Off when TILELOOP_PID_NAMESPACE=0."""
    if not sys.platform.startswith("linux"):
        return f"unavailable: {sys.platform} has no PID namespaces"
    if os.environ.get(NAMESPACE_ENV, "1") == "0":
        return f"unavailable: turned off ({NAMESPACE_ENV}=0)"
    why = None
    if not user and os.geteuid() == 0:
        why = _unshare(CLONE_NEWPID)
        if why is None:
            return "own"
    read, write = os.pipe()
    probe = os.fork()
    if probe == 0:  # a trial in a child: unshare cannot be undone
        os.close(read)
        os.write(write, (_user_and_pid_namespace() or "own").encode()[:500])
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        trial = pipe.read().decode(errors="replace")
    os.waitpid(probe, 0)
    if trial == "own":
        trial = _user_and_pid_namespace() or "own"
    if trial == "own":
        return "own"
    return f"unavailable: {f'unshare(CLONE_NEWPID): {why}; ' if why else ''}{trial}"


def _user_and_pid_namespace() -> str | None:
    uid, gid = os.geteuid(), os.getegid()
    why = _unshare(CLONE_NEWUSER | CLONE_NEWPID)
    if why is not None:
        return f"unshare(CLONE_NEWUSER|CLONE_NEWPID): {why}"
    try:
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1\n")
        Path("/proc/self/setgroups").write_text("deny\n")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1\n")
    except OSError as exc:
        return f"the user namespace's uid/gid map: {exc}"
    return None


def drop_capabilities() -> bool:
    """Every capability of this process dropped (effective, permitted, inheritable): what a kernel
    process forked rather than exec'd must do itself, since no exec clears them for it."""
    if not sys.platform.startswith("linux"):
        return False
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_V3, 0)
    data = (ctypes.c_uint32 * 6)()
    try:
        return ctypes.CDLL(None, use_errno=True).capset(header, data) == 0
    except (OSError, AttributeError):
        return False


def ns_pids(pid: int) -> list[int]:
    """`pid`'s pid in each PID namespace it is in, outermost first (NSpid); [] when unknown."""
    return [int(x) for x in (status_of(pid).get("NSpid") or "").split() if x.isdigit()]
