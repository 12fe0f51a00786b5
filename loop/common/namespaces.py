"""A PID namespace for a judge's kernel processes (with a mount namespace and a /proc of their
own), one more below it for each kernel process, each implementation's own Triton cache (the
others' hidden by a tmpfs where its mount namespace is its own), the launcher that confines a
worker running kernel code outside a judge (the compile gate, `check`), and what a kernel process
forked rather than exec'd drops itself (Linux). In a PID namespace of their own the kernel processes
cannot name the judge, the orchestrator or any process outside it: kill(2) reaches none of them,
and their /proc shows none (no fd of one to pidfd_send_signal); in one each, neither the
incumbent nor the candidate can name the other. Used by the judge's zygote (`loop.worker.zygote`)
and the kernel process's load (`loop.worker.serve`); TILELOOP_PID_NAMESPACE=0 turns the namespaces off.

In a mount namespace of its own a kernel process also sees the machine read-only (`read_only_view`):
it can write its own cache folder and a private /tmp, nothing else, so it cannot plant code where
the judge, the orchestrator or the next measurement will import it (tileloop's own source, a module
in a later iteration's folder, the run's records). TILELOOP_READ_ONLY=0 turns that off."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import signal
import sys
from pathlib import Path

from loop.common import settings
from loop.common.processes import (CACHE_MOUNT, SCRATCH_MOUNT, die_with_parent, drop_bounding_set, dumpable,
                                   set_dumpable, status_of)


CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, AT_FDCWD, AT_EMPTY_PATH, AT_RECURSIVE = 0x1, -100, 0x1000, 0x8000
SYS_MOUNT_SETATTR = 442  # mount_setattr(2), Linux 5.12: the same number on x86_64 and on the generic table (aarch64)
SHARED_MEMORY = "/dev/shm"  # writable in a read-only view: where the judge's CPU arenas are (`loop.common.arena`)
_CAPABILITY_V3 = 0x20080522
CAP_SYS_ADMIN = 21
IMPLEMENTATIONS = "implementations"  # the folder of the Triton cache that holds one folder per implementation
_HELD: dict[str, object] = {}  # in a kernel process whose cache root is hidden: {"root": path, "fd": O_PATH fd}


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
    # a process that is not dumpable (the zygote, guarded before this) has its /proc/self files owned by
    # root: as another user it could not write its own maps; dumpable for the three writes (no kernel code
    # exists yet in this process), then as it was
    was = dumpable()
    set_dumpable(True)
    try:
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1\n")
        Path("/proc/self/setgroups").write_text("deny\n")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1\n")
    except OSError as exc:
        return f"the user namespace's uid/gid map: {exc}"
    finally:
        set_dumpable(was)
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
    return _capset(0)


def keep_only(cap: int) -> bool:
    """Every capability but `cap` dropped (effective and permitted keep it; none inheritable): the
    init of the kernel processes' namespaces keeps CAP_SYS_ADMIN, to make one more for each."""
    return _capset(1 << cap)


def _capset(mask: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_V3, 0)
    low, high = mask & 0xFFFFFFFF, mask >> 32
    data = (ctypes.c_uint32 * 6)(low, low, 0, high, high, 0)  # (effective, permitted, inheritable) x 2 words
    try:
        return ctypes.CDLL(None, use_errno=True).capset(header, data) == 0
    except (OSError, AttributeError):
        return False


def drop_all() -> None:
    """Every capability gone: from the bounding set (none regained by an exec) and from this process."""
    drop_bounding_set()
    drop_capabilities()


# -- one PID and mount namespace per kernel process, below the kernel processes' own -------------

def nested_pid_namespace() -> str:
    """In the init of the kernel processes' namespaces (which holds CAP_SYS_ADMIN there): whether
    each kernel process can have a PID and mount namespace of its own below theirs, where it is
    pid 1 and sees no sibling (tried in a forked child whose child mounts its /proc, as
    `enter_own_namespace` and `mount_proc` do for a kernel process): "own", or "unavailable: <why>"."""
    if not sys.platform.startswith("linux"):
        return f"unavailable: {sys.platform} has no PID namespaces"
    if not settings.load().pid_namespace:
        return f"unavailable: turned off ({settings.PID_NAMESPACE_ENV}=0)"
    why = _in_a_child(lambda: _enter(False) or _trial_init())
    return "own" if why is None else f"unavailable: {why}"


def probe() -> dict[str, str]:
    """What a judge's zygote would have in force here, tried as it would do it (in a process
    confined as the zygote is: `tileloop doctor`): {"pid_namespace": "own" | "unavailable: <why>",
    "siblings": "hidden" | "visible", "triton_cache": "own, others hidden" | "own", "filesystem":
    "read-only" | "writable: <why>"}."""
    namespace = new_pid_namespace()
    said = _in_a_child(_probe_init) if namespace == "own" else None
    found = json.loads(said) if said and said.startswith("{") else {"nested": said or "no namespace"}
    nested = found.get("nested") == "own"
    if not settings.load().read_only:
        view = f"writable: turned off ({settings.READ_ONLY_ENV}=0)"
    elif not nested:
        view = "writable: no mount namespace of its own for a kernel process"
    else:
        view = "read-only" if found.get("view") is None else f"writable: {found['view']}"
    return {"pid_namespace": namespace, "siblings": "hidden" if nested else "visible",
            "triton_cache": "own, others hidden" if nested else "own", "filesystem": view}


def _trial_read_only() -> str | None:
    """In a trial: the init of a mount namespace of its own makes every mount read-only, as a kernel
    process's `read_only_view` does."""
    if os.getpid() != 1 or mount_proc() is None:
        return "no init of its own"
    why = _mount_setattr(AT_FDCWD, b"/", AT_RECURSIVE, set_=MOUNT_ATTR_RDONLY)
    return None if why is None else f"mount_setattr: {why}"


def _probe_init() -> str:
    """In `probe`: the init of the kernel processes' namespaces, which tries one more below and, in
    another, a read-only view: {"nested": "own" | why not, "view": None | why not} as JSON."""
    if os.getpid() != 1 or mount_proc() is None:
        return json.dumps({"nested": "no init of its own"})
    return json.dumps({"nested": nested_pid_namespace(),
                       "view": _in_a_child(lambda: _enter(False) or _in_a_child(_trial_read_only))})


def enter_own_namespace() -> str | None:
    """This process's next child the init of a PID namespace of its own, in a mount namespace of its
    own (unshare CLONE_NEWPID|CLONE_NEWNS: CAP_SYS_ADMIN); None, or why not."""
    return _enter(False)


# -- each implementation's own Triton cache -------------------------------------------------------

def triton_root() -> str:
    """Triton's cache folder as this process's Triton reads it (TRITON_CACHE_DIR: the run's, the
    judge's); "" without Triton."""
    try:
        import triton
    except ImportError:
        return ""
    knobs = getattr(triton, "knobs", None)
    return str(knobs.cache.dir) if knobs is not None else ""


def hide_triton_caches(root: str | None = None) -> bool:
    """In a kernel process in a mount namespace of its own, before it drops its capabilities: the
    per-implementation folder of the Triton cache `root` held open (O_PATH, for `own_triton_cache`
    to take this implementation's folder from at its load), then a private tmpfs mounted over
    `root` (default `triton_root()`), so that no path reaches another implementation's folder (nor
    anything else of the root). False where it could not be done (nothing hidden, nothing held)."""
    root = triton_root() if root is None else root
    if not root or not os.path.isdir(root):
        return False
    folder = os.path.join(root, IMPLEMENTATIONS)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return False
    # a mount of its own (the folder bound onto itself), so that a read-only view can leave it writable
    bound = _libc().mount(folder.encode(), folder.encode(), None, MS_BIND, None) == 0
    try:
        fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    if _libc().mount(CACHE_MOUNT.encode(), root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                     b"mode=0700,size=1m") != 0:
        os.close(fd)
        return False
    _HELD.update(root=root, fd=fd, bound=bound)
    return True


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _mount_setattr(dirfd: int, path: bytes, flags: int, set_: int = 0, clear: int = 0) -> str | None:
    """mount_setattr(2) on the mount at `path` (relative to `dirfd`); None, or why it failed."""
    attr = _MountAttr(set_, clear, 0, 0)
    try:
        done = _libc().syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(dirfd), ctypes.c_char_p(path),
                               ctypes.c_uint(flags), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    except (OSError, AttributeError) as exc:
        return str(exc)
    return None if done == 0 else os.strerror(ctypes.get_errno())


def read_only_view() -> str:
    """In a kernel process in a mount namespace of its own, after `hide_triton_caches` and before it
    drops its capabilities: every mount made read-only (recursively), but the folder of its own
    Triton cache (the mount the held fd is on, where `own_triton_cache` takes its folder, and with it
    TileLang's, cuTile's and torch.compile's caches and CUDA C builds) and the tmpfs over the cache
    root, and /dev/shm (the judge's CPU arenas, which it opens by name; nothing there is imported);
    a private tmpfs for its temporary files (its TMPDIR and Python's `tempfile`: /tmp itself stays
    read-only, as it is seen, since a repository or a run may live there). Device nodes open
    read-write on a read-only mount, so the GPU is unaffected.
    "read-only", or "writable: <why>" where nothing was changed; a view made read-only whose own
    folder could not be made writable again raises."""
    if not settings.load().read_only:
        return f"writable: turned off ({settings.READ_ONLY_ENV}=0)"
    fd, root = _HELD.get("fd"), _HELD.get("root")
    if not isinstance(fd, int) or not isinstance(root, str) or not _HELD.get("bound"):
        return "writable: no cache folder of its own to keep writable (the Triton cache root is not hidden)"
    scratch = os.path.join(root, "scratch")  # in the tmpfs over the cache root, which stays writable
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    why = _read_only_but([(fd, b"", AT_EMPTY_PATH), (AT_FDCWD, root.encode(), 0)], scratch)
    return "read-only" if why is None else f"writable: {why}"


def _read_only_but(keep: list[tuple[int, bytes, int]], scratch: str) -> str | None:
    """Every mount this process sees made read-only (recursively), then the mounts of `keep` (dirfd,
    path, flags, as mount_setattr(2) names a mount) and /dev/shm writable again, and a private tmpfs
    on `scratch` (an empty folder in one of them) made this process's and its children's temporary
    folder (TMPDIR, Python's `tempfile`). None, or why nothing was made read-only; raises where what
    was made read-only could not be made writable again."""
    import tempfile

    why = _mount_setattr(AT_FDCWD, b"/", AT_RECURSIVE, set_=MOUNT_ATTR_RDONLY)
    if why is not None:
        return f"mount_setattr: {why}"
    if os.path.isdir(SHARED_MEMORY):
        keep = [*keep, (AT_FDCWD, SHARED_MEMORY.encode(), 0)]
    for dirfd, path, flags in keep:
        why = _mount_setattr(dirfd, path, flags, clear=MOUNT_ATTR_RDONLY)
        if why is not None:
            raise RuntimeError(f"{path.decode() or 'its own cache folder'} could not be made writable again: {why}")
    if _libc().mount(SCRATCH_MOUNT.encode(), scratch.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0700") != 0:
        raise RuntimeError(f"a private tmpfs for temporary files: {os.strerror(ctypes.get_errno())}")
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    return None


def cache_name(label: str, source: bytes) -> str:
    """An implementation's folder in the Triton cache: its label and a hash of its source."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', label or 'implementation')[:64]}-{hashlib.sha256(source).hexdigest()[:16]}"


ADOPT_LIMIT = 1 << 30  # bytes: a larger folder is not copied (the incumbent fills its own)


def adopt_kept_cache(root: Path, source: bytes, label: str = "incumbent", kept_as: str = "candidate") -> bool:
    """On the orchestrator's side, before a measurement: `label`'s own cache folder for `source`, where
    it has none yet, made from the folder the same source filled as `kept_as` (a kept candidate is
    the next incumbent: the same code, so what it compiled and tuned as the candidate is what it would
    compile and tune again, at every key, in its first measurement as the incumbent: on an H200 a
    one-line change's measurement took 170 s where its autotuned incumbent searched again). Only the
    same source's folder is copied (never another implementation's), links as links, under
    ADOPT_LIMIT bytes; True when it was copied."""
    import shutil

    folder = Path(root) / IMPLEMENTATIONS
    dst, src = folder / cache_name(label, source), folder / cache_name(kept_as, source)
    if dst.exists() or not src.is_dir() or src.is_symlink():
        return False
    total = 0
    for path in src.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
            if total > ADOPT_LIMIT:
                return False
    tmp = folder / f".{dst.name}.adopting-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(src, tmp, symlinks=True)
        os.rename(tmp, dst)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def own_triton_cache(label: str, source: bytes) -> str:
    """At a kernel process's load, before any kernel code runs: its implementation's own Triton cache,
    `<root>/implementations/<label>-<hash of its source>` (a rerun of the same source finds what it
    compiled and tuned there), made Triton's cache folder (its knob, and TRITON_CACHE_DIR with it).
    Where the root is hidden (`hide_triton_caches`) the folder is reached through the fd held since
    (closed now: nothing else of the root stays in reach) by a link under the same path in the tmpfs.
    Returns the path ("" without Triton); a second load keeps the first's."""
    if "path" in _HELD:
        return str(_HELD["path"])
    try:
        import triton
    except ImportError:
        return ""
    knobs = getattr(triton, "knobs", None)
    if knobs is None:
        return ""
    name, fd = cache_name(label, source), _HELD.pop("fd", None)
    path = os.path.join(str(_HELD.get("root") or knobs.cache.dir), IMPLEMENTATIONS, name)
    if not isinstance(fd, int):
        os.makedirs(path, exist_ok=True)
    else:
        try:
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            own = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        os.makedirs(os.path.dirname(path), exist_ok=True)  # in the tmpfs, which only this process sees
        # by its pid, not /proc/self: its children (a compiler's workers, told TRITON_CACHE_DIR) reach it too
        os.symlink(f"/proc/{os.getpid()}/fd/{own}", path)
    knobs.cache.dir = path
    _HELD["path"] = path
    return path


# -- the launcher of a worker that runs kernel code outside a judge --------------------------------

def exec_confined(argv: list[str]) -> int:
    """`python -c ... ARGV`: the launcher of a worker that runs kernel code outside a judge (the
    compile gate, `check`), started confined as the judge's zygote is (`processes.confine_zygote`:
    its own session, SIGKILL when its parent dies, no new privileges). Where the system allows it,
    a PID and mount namespace of its own (`new_pid_namespace`): ARGV exec'd as their init (its /proc
    mounted, the machine read-only but its folder and caches: `writable_only`, every capability
    dropped), this process waiting and ending as it ended; elsewhere ARGV replaces this process,
    every capability dropped."""
    if new_pid_namespace() != "own":
        drop_all()
        os.execvp(argv[0], argv)
    caches = worker_caches()
    scratch = os.path.join(os.getcwd(), f".tileloop-scratch-{os.getpid()}")  # its temporary files' tmpfs goes here
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    child = os.fork()
    if child == 0:
        code = 127
        try:
            die_with_parent()
            host_proc = mount_proc()
            if host_proc is None:
                raise RuntimeError("the worker's namespace could not mount its /proc")
            os.close(host_proc)
            print(f"tileloop: filesystem {writable_only([os.getcwd(), *caches], scratch)}", file=sys.stderr, flush=True)
            drop_all()
            os.execvp(argv[0], argv)
        except BaseException as exc:  # noqa: BLE001 - said on stderr (the worker's log), then this child ends
            print(f"tileloop: the confined worker could not start: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(code)
    drop_all()
    try:
        return ended_as(child)
    finally:
        try:
            os.rmdir(scratch)  # its tmpfs went with the worker's mount namespace
        except OSError:
            pass


def worker_caches() -> list[str]:
    """The cache folders a confined worker writes (Triton's, the run's ahead-of-time one; cuTile's,
    made a folder of it where the environment names none, rather than the user's home; TileLang's
    where named), each made if missing."""
    triton_dir = os.environ.get("TRITON_CACHE_DIR", "")
    if triton_dir:
        os.environ.setdefault("CUDA_TILE_CACHE_DIR", os.path.join(triton_dir, "cutile"))
    folders = []
    for name in ("TRITON_CACHE_DIR", "CUDA_TILE_CACHE_DIR", "TILELANG_CACHE_DIR"):
        folder = os.environ.get(name, "")
        if folder and folder.strip().lower() not in ("0", "off", "none"):
            try:
                os.makedirs(folder, exist_ok=True)
                folders.append(folder)
            except OSError:
                pass
    return folders


def writable_only(folders: list[str], scratch: str) -> str:
    """In the init of a confined worker's namespaces, before it drops its capabilities: every mount
    made read-only (recursively) but `folders` (its working folder, where its result goes, and its
    caches: each bound onto itself first) and /dev/shm, and a private tmpfs on `scratch` (an empty
    folder in the first of them) for its temporary files (TMPDIR). The worker imports the candidate
    (the compile gate, `check`): it can no more plant code in tileloop's source or the repository
    than a kernel process can. "read-only", or "writable: <why>" where nothing was made read-only."""
    if not settings.load().read_only:
        return f"writable: turned off ({settings.READ_ONLY_ENV}=0)"
    libc = _libc()
    # a mount namespace of its own, below the one it shares with its launcher: its view ends with it
    why = _unshare(CLONE_NEWNS)
    if why is not None or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return f"writable: a mount namespace of its own: {why or os.strerror(ctypes.get_errno())}"
    kept = []
    for folder in dict.fromkeys(os.path.realpath(f) for f in folders if os.path.isdir(f)):
        if libc.mount(folder.encode(), folder.encode(), None, MS_BIND, None) != 0:
            return f"writable: a mount of {folder}: {os.strerror(ctypes.get_errno())}"
        kept.append((AT_FDCWD, folder.encode(), 0))
    why = _read_only_but(kept, scratch)
    return "read-only" if why is None else f"writable: {why}"


def ended_as(pid: int) -> int:
    """Wait for the child `pid` and return its exit code; one killed by a signal is mirrored (this
    process killed by the same signal), so that whoever waits for this one sees what it saw."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught: no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status)


def ns_pids(pid: int) -> list[int]:
    """`pid`'s pid in each PID namespace it is in, outermost first (NSpid); [] when unknown."""
    return [int(x) for x in (status_of(pid).get("NSpid") or "").split() if x.isdigit()]
