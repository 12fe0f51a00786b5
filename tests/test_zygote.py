"""The judge's zygote and the PID namespace around its kernel processes (`loop/worker/zygote.py`,
`loop/judge/fork.py`, `loop/common/namespaces.py`): a kernel process forked by the zygote cannot
signal the judge or the orchestrator (kill, os.kill, pidfd_send_signal on an fd of /proc/<pid>)
where the namespace is in force, and can where it is turned off (so the check can fail); it dies
with the judge; where no zygote is used the judge falls back to a fresh interpreter per kernel
process, and `isolation` says which."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="namespaces, /proc: Linux")

# run by a kernel process as the spec it is asked to load: what its signals to the judge (its
# zygote's TILELOOP_PARENT_PID) and to the orchestrator (the judge's parent) do; signal 0 harms none
SIGNAL_PROBE = textwrap.dedent("""
    import ctypes, errno, json, os
    from pathlib import Path

    here = Path(__file__).parent
    libc = ctypes.CDLL(None, use_errno=True)
    targets = {"judge": int(os.environ["TILELOOP_PARENT_PID"]),
               "orchestrator": int((here / "orchestrator.pid").read_text())}

    def outcome(call):
        try:
            return "ok" if call() == 0 else errno.errorcode[ctypes.get_errno()]
        except OSError as exc:
            return errno.errorcode[exc.errno]

    def pidfd_signal(pid):
        fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
        try:
            return libc.syscall(424, fd, 0, None, 0)  # pidfd_send_signal
        finally:
            os.close(fd)

    got = {}
    for who, pid in targets.items():
        got[who + " kill"] = outcome(lambda: libc.kill(pid, 0))
        got[who + " os.kill"] = outcome(lambda: os.kill(pid, 0) or 0)
        got[who + " pidfd"] = outcome(lambda: pidfd_signal(pid))
    (here / "signals.json").write_text(json.dumps(got))
""")

JUDGE = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from loop.judge import fork
    from loop.judge.kernel_process import KernelProcess

    work = Path(sys.argv[1])
    python = sys.argv[2] if len(sys.argv) > 2 else None
    (work / "orchestrator.pid").write_text(str(os.getppid()))
    kernel = KernelProcess(work, "probe", python=python, warm=None)
    try:
        kernel.request({"op": "load", "spec": str(work / "probe.py"), "target_dir": str(work), "device": "cpu",
                        "backend": "interpreter", "impls": []}, "probe")
    except Exception:
        pass  # not a spec: what it ran at import is all that is asked of it
    print(json.dumps(fork.isolation([kernel.proc.pid])))
    kernel.close()
""")


def _judge(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[dict, dict]:
    """A judge (a process of its own) whose one kernel process loads SIGNAL_PROBE: (its isolation,
    what the probe's signals did)."""
    (tmp_path / "probe.py").write_text(SIGNAL_PROBE)
    done = subprocess.run([sys.executable, "-c", JUDGE, str(tmp_path), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]), json.loads((tmp_path / "signals.json").read_text())


@pytest.mark.slow  # a zygote imports torch
@linux
def test_a_kernel_process_in_its_pid_namespace_cannot_signal_the_judge_or_the_orchestrator(writable_by_kernels):
    isolation, signals = _judge(writable_by_kernels, {})
    assert isolation["spawn"] == "zygote", isolation
    if isolation["pid_namespace"] != "own":  # a system that forbids it: said, never claimed
        assert isolation["pid_namespace"].startswith("unavailable: "), isolation
        pytest.skip(f"no PID namespace here: {isolation['pid_namespace']}")
    assert isolation["ptrace"] == "blocked" and isolation["descendants"] == "reaped", isolation
    for who in ("judge", "orchestrator"):
        assert signals[f"{who} kill"] == "ESRCH" and signals[f"{who} os.kill"] == "ESRCH", signals
        # its /proc is its namespace's: no /proc/<pid> of the judge to take a pidfd of (were there one,
        # pidfd_send_signal refuses a pid outside the caller's namespace: EINVAL)
        assert signals[f"{who} pidfd"] in ("ENOENT", "EINVAL"), signals


@pytest.mark.slow
@linux
def test_without_the_namespace_the_same_kernel_process_reaches_the_judge(tmp_path):
    """TILELOOP_PID_NAMESPACE=0 (the escape, should CUDA IPC need one namespace): still a zygote's
    fork, the namespace said to be off, and the probe's signals arrive (so the test above can fail)."""
    isolation, signals = _judge(tmp_path, {"TILELOOP_PID_NAMESPACE": "0"})
    assert isolation["spawn"] == "zygote" and isolation["descendants"] == "reaped", isolation
    assert isolation["pid_namespace"] == "unavailable: turned off (TILELOOP_PID_NAMESPACE=0)", isolation
    assert set(signals.values()) == {"ok"}, signals


@pytest.mark.slow
@linux
@pytest.mark.parametrize("how", ["TILELOOP_ZYGOTE=0", "another python"])
def test_without_a_zygote_each_kernel_process_is_a_fresh_interpreter_and_says_so(tmp_path, how):
    python = tmp_path / "python"
    python.symlink_to(sys.executable)
    env, args = ({"TILELOOP_ZYGOTE": "0"}, ()) if how == "TILELOOP_ZYGOTE=0" else ({}, (str(python),))
    isolation, signals = _judge(tmp_path, env, *args)
    assert isolation["spawn"] == "fresh exec" and isolation["pid_namespace"].startswith("unavailable: "), isolation
    assert isolation["ptrace"] == "blocked" and isolation["exec"] == "fresh", isolation
    assert signals["judge kill"] == "ok", signals
    assert not list(tmp_path.glob("*.zygote.log"))


@pytest.mark.slow
@linux
def test_the_zygote_and_its_kernel_processes_die_with_the_judge(tmp_path):
    """A judge killed with SIGKILL: its zygote, the zygote's init and the kernel processes end too
    (the parent-death signal chained through each)."""
    script = textwrap.dedent("""
        import json, os, signal, sys
        from pathlib import Path
        from loop.judge import fork
        from loop.judge.kernel_process import KernelProcess

        kernels = [KernelProcess(Path(sys.argv[1]), name, warm=None) for name in ("a", "b")]
        for k in kernels:
            k.request({"op": "arena"}, "ready")
        zygote = fork._ZYGOTE[os.getpid()]
        print(json.dumps([k.proc.pid for k in kernels] + sorted(zygote.parents())), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    pids = json.loads(done.stdout)
    assert len(pids) >= 3, pids  # two kernel processes and the zygote (and its init, in a namespace)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], pids


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2] not in "ZX"


@linux
def test_a_new_pid_namespace_makes_the_first_child_its_init_and_keeps_the_uid():
    """new_pid_namespace with a user namespace (the path of a judge that is not root), tried in a
    child of a child: the next fork is pid 1 there, two pids deep from outside, with the same uid."""
    script = textwrap.dedent("""
        import json, os
        from loop.common.namespaces import new_pid_namespace, ns_pids
        said = new_pid_namespace(user=True)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            os.write(write, json.dumps([os.getpid(), os.getuid()]).encode())
            os._exit(0)
        inside, uid = json.loads(os.read(read, 100))
        print(json.dumps({"said": said, "inside": inside, "uid": uid, "depth": len(ns_pids(child)),
                          "outer_depth": len(ns_pids(os.getpid()))}))
        os.waitpid(child, 0)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    if got["said"] != "own":
        assert got["said"].startswith("unavailable: ") and got["depth"] == got["outer_depth"], got
        pytest.skip(f"no user namespace here: {got['said']}")
    assert got["inside"] == 1 and got["depth"] == got["outer_depth"] + 1 and got["uid"] == os.getuid(), got


@linux
def test_the_namespace_can_be_turned_off():
    env = {**os.environ, "TILELOOP_PID_NAMESPACE": "0", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", "from loop.common.namespaces import new_pid_namespace as n; print(n())"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.strip() == "unavailable: turned off (TILELOOP_PID_NAMESPACE=0)", done


@pytest.mark.slow
@linux
def test_a_zygote_that_died_before_forking_leaves_fresh_interpreters_that_serve(tmp_path):
    """The zygote killed while it imports: the kernel process already asked of it, and the next
    one, are exec'd instead; both serve, and `isolation` says so."""
    script = textwrap.dedent("""
        import json, os, signal, sys
        from pathlib import Path
        from loop.judge import fork
        from loop.judge.kernel_process import KernelProcess

        work = Path(sys.argv[1])
        first = KernelProcess(work, "first", warm=None)
        zygote = fork._ZYGOTE[os.getpid()]
        os.kill(zygote.proc.pid, signal.SIGKILL)
        zygote.proc.wait()
        second = KernelProcess(work, "second", warm=None)
        for k in (first, second):
            k.request({"op": "arena"}, "ready")
        print(json.dumps(fork.isolation([first.proc.pid, second.proc.pid])))
        for k in (first, second):
            k.close()
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    isolation = json.loads(done.stdout.splitlines()[-1])
    assert isolation["spawn"] == "fresh exec" and isolation["ptrace"] == "blocked", isolation
    assert not list(tmp_path.glob("*.pid")), list(tmp_path.iterdir())
