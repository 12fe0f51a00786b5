"""A PID namespace for a judge's kernel processes (with a mount namespace and a /proc of their
own), and what a kernel process forked rather than exec'd drops itself (Linux). In a PID namespace
of their own the kernel processes cannot name the judge, the orchestrator or any process outside
it: kill(2) reaches none of them, and their /proc shows none (no fd of one to pidfd_send_signal). Used by the judge's zygote (`loop.worker.zygote`); TILELOOP_PID_NAMESPACE=0 turns it off."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from loop.common import settings
from loop.common.processes import status_of


CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
_CAPABILITY_V3 = 0x20080522


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> str | None:
    """unshare(2) (os.unshare where Python has it); None, or why it failed."""
    try:
        if hasattr(os, "unshare"):
            os.unshare(flags)
            return None
        if _libc().unshare(flags) == 0:
            return None
        return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        return str(exc)


def new_pid_namespace(user: bool | None = None) -> str:
    """Put this process's next children in a new PID namespace and a mount namespace of their own
    (the first one forked is their init, pid 1, which mounts their own /proc: `mount_proc`; this
    process may start no thread after it): "own", or "unavailable: <why>". As root (holding
    CAP_SYS_ADMIN) the two namespaces alone; otherwise (or when `user` asks for it) with a new user
    namespace that maps this process's own uid and gid, so that its processes keep the judge's uid
    and gain nothing outside. The whole is tried in a forked child first (an init that mounts /proc
    included), so a failure leaves this process as it was. Off when TILELOOP_PID_NAMESPACE=0."""
    if not sys.platform.startswith("linux"):
        return f"unavailable: {sys.platform} has no PID namespaces"
    if not settings.load().pid_namespace:
        return f"unavailable: turned off ({settings.PID_NAMESPACE_ENV}=0)"
    tried = []
    for with_user in ([False, True] if not user and os.geteuid() == 0 else [True]):
        why = _in_a_child(lambda: _enter(with_user) or _trial_init())
        if why is None:
            why = _enter(with_user)
            if why is None:
                return "own"
        tried.append(why)
    return "unavailable: " + "; ".join(tried)


def _in_a_child(trial) -> str | None:
    """`trial()` (None, or why it failed) run in a forked child: what it said."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            said = trial() or ""
        except BaseException as exc:  # noqa: BLE001 - said, in the child that ends here
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, said.encode()[:500])
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode(errors="replace")
    os.waitpid(child, 0)
    return said or None


def _trial_init() -> str | None:
    """In a trial: fork the init of the new namespace, which mounts its /proc."""
    return _in_a_child(lambda: None if os.getpid() == 1 and mount_proc() is not None else "no init of its own")


def _enter(with_user: bool) -> str | None:
    if not with_user:
        why = _unshare(CLONE_NEWPID | CLONE_NEWNS)
        return None if why is None else f"unshare(CLONE_NEWPID|CLONE_NEWNS): {why}"
    uid, gid = os.geteuid(), os.getegid()
    why = _unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS)
    if why is not None:
        return f"unshare(CLONE_NEWUSER|CLONE_NEWPID|CLONE_NEWNS): {why}"
    try:
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1\n")
        Path("/proc/self/setgroups").write_text("deny\n")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1\n")
    except OSError as exc:
        return f"the user namespace's uid/gid map: {exc}"
    return None


def mount_proc() -> int | None:
    """In the init of a new PID and mount namespace: mounts made private, and a /proc of this PID
    namespace mounted on /proc (the CUDA driver fails where getpid() and /proc disagree; its
    processes see none outside). Returns an fd of the /proc it covers (the judge's: where a process
    reads its pid as the judge names it, `outer_pid`), or None if the mount failed."""
    host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    libc = _libc()
    if (libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0
            or libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0):
        os.close(host_proc)
        return None
    return host_proc


def outer_pid(host_proc: int) -> int:
    """This process's pid in the outermost PID namespace, read through `host_proc` (`mount_proc`)."""
    fd = os.open("self/status", os.O_RDONLY, dir_fd=host_proc)
    with os.fdopen(fd) as status:
        return next(int(line.split()[1]) for line in status if line.startswith("NSpid:"))


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
