"""The boundary around kernel processes (`loop/judge/fork.py`, `loop/judge/kernel_process.py`,
`loop/common/processes.py`): a kernel process never a fork of the judge and confined (its zygote and
PID namespace: tests/test_zygote.py), a judge that is not dumpable and a subreaper, trees stopped
between their requests, strays killed and refused; and the adversaries of each class refused under
the interpreter (the same on a GPU: tests/test_adversaries.py, `-m gpu`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl, /proc: Linux")
ADVERSARIES = Path(__file__).parent / "adversaries"


def _as_judge(script: str, timeout: float = 60) -> str:
    """`script` run in a process of its own (a judge: it may become a subreaper, which pytest must not)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr
    return done.stdout


READ_PARENT = textwrap.dedent("""
    import os, sys
    ppid = os.getppid()
    addr = int(sys.argv[1], 16)
    try:
        with open(f"/proc/{ppid}/mem", "rb", buffering=0) as mem:
            mem.seek(addr)
            print("read", mem.read(8).hex())
    except OSError as exc:
        print("refused", exc.errno)
""")


@linux
@pytest.mark.parametrize("guarded", [False, True], ids=["open", "guarded"])
def test_a_confined_child_cannot_read_a_judge_that_is_not_dumpable(guarded):
    """A plain child reads its dumpable parent's memory (so the check can fail); a child confined as
    a kernel process is, of a parent that is not dumpable, is refused (as root too: it has no
    capability left, and root's processes hold more than it)."""
    out = _as_judge(f"""
        import ctypes, subprocess, sys
        from loop.common.processes import confine_child, set_dumpable
        secret = ctypes.create_string_buffer(b"thresholds")
        if {guarded}:
            assert set_dumpable(False)
        child = subprocess.run([sys.executable, "-c", {READ_PARENT!r}, hex(ctypes.addressof(secret))],
                               capture_output=True, text=True, preexec_fn=confine_child if {guarded} else None)
        print(child.stdout.strip(), child.stderr.strip()[-300:])
    """)
    if guarded:
        assert out.startswith("refused"), out
    else:
        assert out.startswith("read " + b"thresholds"[:8].hex()), out


@linux
def test_a_double_forked_daemon_is_a_stray_and_is_killed():
    """A child that double-forks a daemon into a session of its own: orphaned to the judge (a
    subreaper), found by the tree's scan as a stray, and gone after kill_all; a child that stays in
    its group is a member, never a stray."""
    out = _as_judge("""
        import os, subprocess, sys, time
        from loop.common.processes import Tree, become_subreaper, confine_child, kill_all
        assert become_subreaper()
        daemon = ("import os, time\\n"
                  "if os.fork() == 0:\\n"
                  "    os.setsid()\\n"
                  "    if os.fork() == 0:\\n"
                  "        print(os.getpid(), flush=True); time.sleep(60)\\n"
                  "    os._exit(0)\\n"
                  "os.wait(); time.sleep(60)\\n")
        child = subprocess.Popen([sys.executable, "-c", daemon], stdout=subprocess.PIPE, text=True,
                                 preexec_fn=confine_child)
        tree = Tree(child.pid)
        tree.scan()
        stray = int(child.stdout.readline())
        time.sleep(0.2)  # the middle process exits: the daemon is orphaned to this process
        strays = tree.scan()
        print("strays", strays == [stray], "member", child.pid in tree.members)
        kill_all(strays)
        time.sleep(0.2)
        os.waitpid(stray, 0)  # a subreaper reaps its orphans
        print("gone", not os.path.exists(f"/proc/{stray}"))
        child.kill()
    """)
    assert out.split() == ["strays", "True", "member", "True", "gone", "True"], out


@pytest.fixture
def kernels(tmp_path):
    from loop.judge.kernel_process import KernelProcess

    started = [KernelProcess(tmp_path, name, warm=None) for name in ("a", "b")]
    for k in started:
        k.request({"op": "arena"}, "ready")  # torch imported: idle, waiting for requests
    yield started
    for k in started:
        k.close()


def _state(pid: int) -> str:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2:].split()[0]


def _settled(pid: int, want: str) -> bool:
    deadline = time.monotonic() + 5
    while _state(pid) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return _state(pid) == want


@pytest.mark.slow  # two new interpreters import torch
@linux
def test_only_the_kernel_process_asked_runs(kernels):
    """A request resumes its process and stops every other; after its answer it is stopped too;
    the isolation the judge reports is read from /proc, and full here."""
    from loop.judge import fork

    a, b = kernels
    a.request({"op": "arena"}, "a")
    assert _settled(a.proc.pid, "T") and _settled(b.proc.pid, "T")
    os.kill(b.proc.pid, 18)  # SIGCONT from outside (a sibling): the next request to a stops it again
    assert _settled(b.proc.pid, "S")
    a.send({"op": "arena"}, "a")
    assert _settled(b.proc.pid, "T")
    a.answer({"op": "arena"}, "a")
    got = fork.isolation([a.proc.pid, b.proc.pid])
    assert got == {"uid": "same", "ptrace": "blocked", "descendants": "reaped", "exec": "fresh",
                   "stopped": "between requests", "spawn": "zygote", **_namespaces()}, got
    assert fork.full(got) == (got["siblings"] == "hidden" and got["filesystem"] == "read-only")


def _namespaces() -> dict[str, str]:
    """The namespaces a judge's kernel processes get here: their own, and one each below it, unless
    turned off (or, on a system that forbids it, what `loop.common.namespaces` says instead), and
    what that makes of their Triton caches."""
    if os.environ.get("TILELOOP_PID_NAMESPACE") == "0":
        return {"pid_namespace": "unavailable: turned off (TILELOOP_PID_NAMESPACE=0)", "siblings": "visible",
                "triton_cache": "own", "filesystem": "writable"}
    from loop.common.processes import probe_isolation

    got = probe_isolation() or {}
    out = {k: got.get(k, "unavailable: the probe failed") for k in ("pid_namespace", "siblings", "triton_cache", "filesystem")}
    return {**out, "filesystem": out["filesystem"].split(":")[0]}  # a judge reports what it read, not the probe's why


@pytest.mark.slow
@linux
def test_cpu_used_while_stopped_refuses_the_implementation(kernels):
    from loop.judge.kernel_process import IDLE_CPU_S, KernelFailure

    a, _ = kernels
    a.request({"op": "arena"}, "a")
    a.stopped_cpu -= 2 * IDLE_CPU_S  # as if its tree had run while it was stopped
    with pytest.raises(KernelFailure) as failure:
        a.request({"op": "arena"}, "a")
    assert failure.value.status == "uncorroborated" and failure.value.label == "a"


def _judged(tmp_path, name: str) -> dict:
    from test_judge import judged

    return judged(tmp_path, ADVERSARIES / f"{name}.py")


@pytest.mark.slow
@linux
@pytest.mark.parametrize("name, status, says", [
    ("leave_a_daemon", "uncorroborated", "outside its process group"),
    ("call_torch", "uncorroborated", "launched none of the target's kernels"),
    ("recompute_when_poisoned", "incorrect", "audited timed request"),
    ("write_judge_memory", "incorrect", ""),
])
def test_an_adversary_is_refused_and_charged_to_the_candidate(tmp_path, env, name, status, says):
    raw = _judged(tmp_path, name)
    assert raw["status"] == status and raw["failed_impl"] == "candidate", raw
    assert says in raw["message"], raw["message"]
    assert raw["isolation"]["ptrace"] == "blocked", raw["isolation"]


@pytest.mark.slow
@linux
def test_a_candidate_that_stops_its_sibling_slows_nothing(tmp_path, env):
    raw = _judged(tmp_path, "stop_the_sibling")
    assert raw["status"] == "ok", raw
    (shape,) = raw["timing"]["shapes"]
    inc, cand = (shape["impls"][k]["median_ms"] for k in ("incumbent", "candidate"))
    assert inc < 1.5 * cand, (inc, cand)  # the incumbent was resumed for each of its requests


@linux
def test_doctor_reports_the_isolation_a_judge_would_have_and_it_decides_nothing():
    from loop.common.settings import Settings
    from loop.tools import doctor

    check = doctor.isolation_check(Settings())
    assert check["name"] == "kernel process isolation" and check["ok"], check
    assert "ptrace: blocked" in check["detail"] and "descendants: reaped" in check["detail"]
    assert "siblings: " in check["detail"] and "triton_cache: own" in check["detail"], check
    probe = {"cuda_available": False}
    assert doctor.report(probe, None, {**check, "ok": False})["recommendation"] == doctor.report(probe)["recommendation"]
    assert doctor.report(probe, None, check)["checks"][-1] == check


def test_perf_results_says_when_the_isolation_was_weaker_than_full():
    from dataclasses import replace

    from loop.records.perf_table import measurement_lines
    from test_records_tables import make

    full = {"uid": "same", "ptrace": "blocked", "descendants": "reaped", "exec": "fresh", "stopped": "between requests"}

    def record(isolation: dict):
        r = make(1, "keep", speedups=(1.2,), latency=1.0, incumbent=1.2)
        backend = r.backends["interpreter"]
        shapes = [{**s, "isolation": isolation} for s in backend.shapes]
        return replace(r, backends={"interpreter": replace(backend, shapes=shapes)})

    assert not any(line.startswith("isolation:") for line in measurement_lines([record(full)], "interpreter"))
    weak = [line for line in measurement_lines([record(full), record({**full, "ptrace": "open"})], "interpreter")
            if line.startswith("isolation:")]
    assert len(weak) == 1 and "ptrace: open" in weak[0], weak


def test_a_timed_request_that_launched_none_of_the_targets_kernels_is_refused():
    from loop.judge.kernel_process import KernelFailure, require_launches

    require_launches({"launches": [1, 3]}, 2, "candidate")
    with pytest.raises(KernelFailure) as failure:
        require_launches({"launches": [1, 0]}, 2, "candidate")
    assert failure.value.status == "uncorroborated" and failure.value.label == "candidate"
    with pytest.raises(KernelFailure):
        require_launches({"launches": [1]}, 2, "candidate")  # a count per sample, or a broken protocol


@pytest.mark.slow
@linux
def test_a_refusal_of_the_incumbent_is_charged_to_the_incumbent(tmp_path, env):
    """The incumbent's timer scaled down, the candidate honest: the refusal names the incumbent."""
    from loop import backends
    from loop.common.settings import Settings
    from loop.measure.launch import run_worker

    op = REPO_ROOT / "kernels" / "vector_add"
    job = {"spec": str(op / "spec.py"), "target_dir": str(op), "target": str(op / "vector_add_triton.py"),
           "device": "cpu", "backend": "interpreter", "check": ["candidate"], "seed": 3, "bench": True,
           "impls": [{"label": "incumbent", "path": str(ADVERSARIES / "scale_timer.py")},
                     {"label": "candidate", "path": str(op / "vector_add_triton.py")}],
           "dtypes": ["float32"], "correctness_shapes": [[127]], "drawn": False, "bench_shapes": [[2048]],
           "timing": {"min_reps": 6, "max_reps": 8, "budget_s": 0.2}}
    raw = run_worker(tmp_path, job, backends.get("interpreter"), Settings(), tmp_path / "cache", name="judged")
    assert raw["status"] == "uncorroborated" and raw["failed_impl"] == "incumbent", raw


@pytest.mark.gpu
@pytest.mark.parametrize("name, status", [("vector_add", "ok"), ("call_torch", "uncorroborated"),
                                          ("leave_a_daemon", "uncorroborated"), ("write_judge_memory", "incorrect"),
                                          ("recompute_when_poisoned", "uncorroborated"), ("stop_the_sibling", "ok")])
def test_on_a_gpu_the_boundary_holds_and_the_arena_opens(tmp_path, env, name, status):
    """A kernel process without capabilities, forked by the judge's zygote in a PID namespace of its
    own (unless TILELOOP_PID_NAMESPACE=0), opens the CUDA IPC arena of a judge that is not dumpable
    (the honest candidate is measured), and each adversary gets its verdict, charged to it."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from test_judge import judged

    path = REPO_ROOT / "kernels" / "vector_add" / "vector_add_triton.py" if name == "vector_add" else ADVERSARIES / f"{name}.py"
    raw = judged(tmp_path, path, device="cuda")
    if name == "stop_the_sibling" and raw["status"] != "ok" and raw["isolation"]["siblings"] == "visible":
        status = "uncorroborated"  # on an H100, where it could reach its sibling, its tries got it refused: charged to it
    assert raw["status"] == status, raw
    assert status == "ok" or raw["failed_impl"] == "candidate", raw
    off = os.environ.get("TILELOOP_PID_NAMESPACE") == "0"  # the escape, should CUDA IPC need one namespace
    assert raw["isolation"] == {"uid": "same", "ptrace": "blocked", "descendants": "reaped", "exec": "fresh",
                                "stopped": "between requests", "spawn": "zygote",
                                **(_namespaces() if off else {"pid_namespace": "own", "siblings": "hidden",
                                                              "triton_cache": "own, others hidden",
                                                              "filesystem": _namespaces()["filesystem"]})}, raw["isolation"]
