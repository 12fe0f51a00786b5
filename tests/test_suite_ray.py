"""`tileloop suite run --ray` on a local Ray cluster (CPU, Triton interpreter): each run a Ray task in
a clone of its own made from a bundle; its branch, refs and records come back into the repository
as a local run leaves them; a run killed part-way goes on with `--resume` from its last finished
iteration, in a new task, from the records that came back; each sealed iteration comes back while
the run goes on (a checkpoint), and a task whose worker process is killed, or whose node dies (a
worker node of a cluster of several on this host, removed mid-run), is sent again once as a resume
from its last checkpoint. Ray found through the driver's PYTHONPATH only (`pip install --target`):
the local cluster's workers import it; with workers that cannot, the suite gives the task up and
its entry says why."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from loop.cli import main
from loop.records.results import Record, append_record
from loop.run import state as st

pytestmark = [pytest.mark.slow]
pytest.importorskip("ray")

TARGETS = ["kernels/vector_add/vector_add_triton.py", "kernels/row_sum/row_sum_triton.py"]


def _records(path) -> list[Record]:
    return [Record.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def test_ray_suite_comes_back_as_local_and_a_killed_run_resumes(tmp_path, clean_env, capsys):
    from tests.conftest import git
    from tests.test_suite_cmd import two_op_repo

    two_op_repo(tmp_path, clean_env)
    start = git(tmp_path, "rev-parse", "HEAD").strip()
    args = ["suite", "run", *TARGETS, "--device", "cpu", "--max-iters", "1", "--archs", "sm_90", "--ray"]
    # every run's tileloop kills itself (SIGKILL) on measuring its first experiment: the task ends with
    # the baseline recorded and that experiment in flight, and returns what it has
    clean_env.setenv("TILELOOP_TEST_KILL_AT", "measure")
    assert main([*args, "--json"]) == 0
    out = capsys.readouterr()
    first = {e["run"]: e for e in json.loads(out.out)["entries"]}
    assert sorted(first) == ["suite-row-sum-triton", "suite-vector-add-triton"], out.err[-3000:]
    assert "[ray] started a local cluster" in out.err
    for run, e in first.items():
        assert "error" not in e and e["node"] == socket.gethostname() and e["iterations"] == 0, (e, out.err[-3000:])
        run_dir = tmp_path / "sandbox" / run  # where a suite without --gpus keeps a run's records
        state = st.view(run_dir.parent.parent, run_dir.name)
        assert state["last_iteration"] == 0 and state["inflight"]["iteration"] == 1
        assert [r.iteration for r in _records(run_dir / "results.jsonl")] == [0]
        # the run's snapshot of the git files (put back before each step) is this repository's, not the clone's
        assert (run_dir / "git-state" / ".git" / "config").read_bytes() == (tmp_path / ".git" / "config").read_bytes()
        # the branch came back: from the suite's commit through the baseline to the experiment in flight
        tip = git(tmp_path, "rev-parse", f"tileloop/{run}").strip()
        assert git(tmp_path, "rev-parse", f"{tip}~1").strip() == state["best_commit"]
        assert "Tileloop-Iteration: 1" in git(tmp_path, "log", "-1", "--format=%B", tip)
        assert git(tmp_path, "merge-base", "--is-ancestor", start, tip) == ""
        assert (tmp_path / "sandbox" / "suite" / f"{run}.json").is_file()
        assert (tmp_path / "sandbox" / "suite" / f"{run}-report.md").is_file()
    assert (tmp_path / "sandbox" / "suite" / "ray-logs").is_dir()
    assert out.err.count(f"came back from {socket.gethostname()}: bundle") == 2
    assert git(tmp_path, "rev-parse", "HEAD").strip() == start and git(tmp_path, "status", "--porcelain") == ""
    assert _clones_from(start) == []  # each task removed its clone before its result came back

    # without --resume, runs that exist are not started again over their branches
    assert main(args) == 2
    assert "exists here already" in capsys.readouterr().err

    clean_env.delenv("TILELOOP_TEST_KILL_AT")
    tips = {run: git(tmp_path, "rev-parse", f"tileloop/{run}").strip() for run in first}
    created = {run: (json.loads((tmp_path / "sandbox" / run / "state.json").read_text())["created"],
                     _records(tmp_path / "sandbox" / run / "results.jsonl")[0].commit) for run in first}
    assert main([*args, "--resume", "--json"]) == 0
    out = capsys.readouterr()
    entries = json.loads(out.out)["entries"]
    assert [e["target"] for e in entries] == TARGETS and "sent with its records (tileloop resume;" in out.err
    for e in entries:
        assert "error" not in e and e["resumed"] is True and e["node"] == socket.gethostname(), (e, out.err[-3000:])
        run_dir = tmp_path / "sandbox" / e["run"]
        recs = _records(run_dir / "results.jsonl")
        # resumed, not started anew: the baseline as it came back, the killed experiment recorded once
        # (as interrupted: it counts against --max-iters 1), and the run stopped
        assert [r.iteration for r in recs] == [0, 1] and recs[1].optimization.endswith("(interrupted)")
        assert recs[0].latency_ms == first[e["run"]]["baseline_ms"] and recs[0].commit == created[e["run"]][1]
        state = st.view(run_dir.parent.parent, run_dir.name)
        assert state["created"] == created[e["run"]][0]
        assert state["inflight"] is None and state["stopped"]["state"] == "stop" and e["iterations"] == 1
        branch = f"tileloop/{e['run']}"
        assert git(tmp_path, "rev-parse", branch).strip() == state["best_commit"]
        # the experiment in flight at the kill lives on under refs/tileloop/ (its message amended by the repair)
        assert git(tmp_path, "rev-parse", f"{recs[1].commit}~1").strip() == git(tmp_path, "rev-parse", f"{tips[e['run']]}~1").strip()
        assert git(tmp_path, "rev-parse", f"refs/tileloop/{e['run']}/1").strip() == recs[1].commit
        best = next(r for r in reversed(recs) if r.status == "keep")
        assert (tmp_path / "sandbox" / "suite" / f"{e['run']}-best.py").read_text() == \
            git(tmp_path, "show", f"{best.commit}:{e['target']}")
        # history from git alone, in this repository, agrees with the records that came back
        assert main(["history", "--run", e["run"], "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        assert [row["status"] for row in rows] == [r.status for r in recs]
        for r in recs:  # every experiment's commit is here: kept on the branch, the others under refs/tileloop/
            assert git(tmp_path, "cat-file", "-t", r.commit).strip() == "commit"
    assert git(tmp_path, "status", "--porcelain") == ""
    assert main(["suite", "summarize", "sandbox/suite", "--out", "suite.md"]) == 0
    text = (tmp_path / "suite.md").read_text()
    assert "| vector_add" in text and "| row_sum" in text


def test_ray_missing_or_misused_is_one_line(kernel_repo, monkeypatch, capsys):
    import sys

    target = "kernels/vector_add/vector_add_triton.py"
    assert main(["suite", "run", target, "--device", "cpu", "--ray", "--gpus", "0"]) == 2
    assert "--ray and --gpus do not go together" in capsys.readouterr().err
    assert main(["suite", "run", target, "--device", "cpu", "--ray", target]) == 2
    assert "put --ray after the targets" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(["suite", "run", target, "--device", "cpu", "--ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install -e ".[ray]"' in err
    assert not (kernel_repo / "sandbox" / "suite").exists()  # refused before anything was written


def test_ray_without_a_gpu_refuses_cuda_runs(kernel_repo, capsys):
    """A cluster with no GPU would leave `num_gpus=1` tasks waiting forever: refused in one line."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the local cluster would have one")
    assert main(["suite", "run", "kernels/vector_add/vector_add_triton.py", "--ray"]) == 2
    err = capsys.readouterr().err
    assert "the Ray cluster has no GPU for the runs (--device cuda)" in err
    assert not (kernel_repo / "sandbox" / "suite-vector-add-triton").exists()


def test_after_a_driver_kill_resume_sends_what_came_back_and_starts_the_rest(tmp_path, clean_env):
    """What `--resume` does with each target after a driver was killed (no cluster is started): a run
    whose records came back part-way is sent with them, a finished one whose entry is whole keeps it,
    one that came back before its baseline is forgotten and sent anew, as is one that never came back."""
    from loop.common.errors import UserError
    from loop.suite.engines import SuiteCall
    from loop.suite.ray_engine import RayEngine
    from loop.suite.worktrees import run_id_of
    from tests.conftest import git
    from tests.test_suite_cmd import two_op_repo

    two_op_repo(tmp_path, clean_env)
    (tmp_path / "kernels" / "copy").mkdir()
    for name in ("a_triton.py", "b_triton.py"):
        (tmp_path / "kernels" / "copy" / name).write_text("# a target\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "more targets")
    targets = [*TARGETS, "kernels/copy/a_triton.py", "kernels/copy/b_triton.py"]
    out_dir = tmp_path / "sandbox" / "suite"
    out_dir.mkdir(parents=True)
    states = {TARGETS[0]: {"last_iteration": 1, "inflight": None, "stopped": None},  # cut off part-way
              TARGETS[1]: {"last_iteration": 2, "inflight": None, "stopped": {"state": "stop"}},  # finished
              targets[2]: {"last_iteration": -1, "inflight": {"iteration": 0}, "stopped": None}}  # killed before its baseline
    for target, state in states.items():
        run_dir = tmp_path / "sandbox" / run_id_of(target)
        run_dir.mkdir(parents=True)
        last = state.pop("last_iteration")  # what a run recorded is its records' to say
        (run_dir / "state.json").write_text(json.dumps(state))
        for n in range(last + 1):
            append_record(run_dir / "results.jsonl", Record(
                run=run_id_of(target), iteration=n, optimization="a change", status="keep" if n == 0 else "revert",
                correctness="PASS", latency_ms=None, target_backend="interpreter", backends={}, commit="0" * 40, parent=None))
    git(tmp_path, "branch", f"tileloop/{run_id_of(targets[2])}")
    whole = {"schema": "tileloop.suite-entry/1", "run": run_id_of(TARGETS[1]), "target": TARGETS[1], "iterations": 2,
             "final": [{"shape": "1024", "dtype": "float32", "best (ms)": "0.5"}]}
    (out_dir / f"{run_id_of(TARGETS[1])}.json").write_text(json.dumps(whole))
    said = []
    call = SuiteCall(root=tmp_path, start_branch="", start_sha="", targets=tuple(targets), out_dir=out_dir,
                     per_run_s=None, extra=("--device", "cpu"), resume=True, killed_here=None, log=said.append)
    done, todo = RayEngine()._plan(call)
    assert done == {TARGETS[1]: whole} and todo == [TARGETS[0], targets[2], targets[3]]
    assert not (tmp_path / "sandbox" / run_id_of(targets[2])).exists()  # forgotten, branch and all
    assert git(tmp_path, "branch", "--list", f"tileloop/{run_id_of(targets[2])}") == ""
    # without --resume, any run that exists here is refused before a cluster starts
    with pytest.raises(UserError, match="exists here already"):
        RayEngine()._plan(SuiteCall(**{**call.__dict__, "resume": False}))


def test_a_sigterm_to_the_driver_ends_its_runs_and_its_cluster_and_keeps_their_checkpoints(kernel_repo):
    """SIGTERM to `suite run --ray` once its run's first checkpoint (the baseline) came back: the
    suite exits as without --ray (143), no tileloop of the run is left in the task's clone, the local
    cluster is stopped with its logs kept; the checkpoint is in the repository, whole (the records as
    sealed, every commit they name, the branch), and `--resume` sends the run with it."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path

    from loop.measure.launch import with_package_path
    from loop.records import gitops
    from loop.suite.engines import SuiteCall
    from loop.suite.ray_engine import RayEngine, Sender
    from loop.suite.ray_task import sealed_state
    from tests.conftest import git

    target, run = "kernels/vector_add/vector_add_triton.py", "suite-vector-add-triton"
    cmd = [sys.executable, "-m", "loop", "suite", "run", target, "--device", "cpu", "--max-iters", "1", "--archs", "sm_90",
           "--ray"]
    proc = subprocess.Popen(cmd, cwd=kernel_repo, env=with_package_path(dict(os.environ)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    run_dir = kernel_repo / "sandbox" / run
    deadline = time.monotonic() + 300
    while not (run_dir / "state.json").is_file():  # the baseline's checkpoint, taken into this repository
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "slow"
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    clones = Path(tempfile.gettempdir())  # the tasks' clones: a local cluster's workers share this environment

    def in_a_clone(pid: str) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/cwd").startswith(str(clones / "tileloop-task-"))
        except OSError:  # gone meanwhile, or not ours to read
            return False

    time.sleep(2)  # the cluster's workers take their children with them
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and in_a_clone(pid)]
    assert (kernel_repo / "sandbox" / "suite" / "ray-logs").is_dir()
    assert "checkpointed from" in err and not (kernel_repo / "sandbox" / "suite" / f"{run}.json").exists()
    refs = {ref: sha for ref, sha in (line.split() for line in git(
        kernel_repo, "for-each-ref", "--format=%(refname) %(objectname)", f"refs/heads/tileloop/{run}", f"refs/tileloop/{run}/").splitlines())}
    state = sealed_state(kernel_repo, run, refs, f"tileloop/{run}")  # as the run sealed it, the branch at its tip
    assert state is not None and state["last_iteration"] >= 0, err[-3000:]
    recs = _records(run_dir / "results.jsonl")
    assert [r.iteration for r in recs] == list(range(state["last_iteration"] + 1))
    for r in recs:
        assert git(kernel_repo, "cat-file", "-t", r.commit).strip() == "commit"
    assert gitops.ref_sha(kernel_repo, f"refs/heads/tileloop/{run}") == refs[f"refs/heads/tileloop/{run}"]
    # the next `suite run --ray --resume` sends the run with its checkpoint, not from the start
    call = SuiteCall(root=kernel_repo, start_branch=git(kernel_repo, "rev-parse", "--abbrev-ref", "HEAD").strip(),
                     start_sha=git(kernel_repo, "rev-parse", "HEAD").strip(), targets=(target,),
                     out_dir=kernel_repo / "sandbox" / "suite", per_run_s=None, extra=("--device", "cpu"), resume=True,
                     killed_here=None, log=print)
    assert RayEngine()._plan(call) == ({}, [target])

    class Store:  # Ray's object store, as the sender uses it
        put = staticmethod(lambda data: data)

    job = Sender(Store, call, None, ("t", "t@t")).job(target)
    assert job.records is not None and {ref: job.refs[ref] for ref in refs} == refs


def test_a_task_lost_with_its_process_resumes_from_its_last_checkpoint(tmp_path, clean_env, tmp_path_factory, capsys):
    """The task's Ray worker process killed (SIGKILL) once the checkpoint of iteration 1 came back:
    the driver sends the run again as a resume from that checkpoint, and it finishes with the
    baseline, iteration 1 as it came back (not run again) and iteration 2, each recorded once."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path

    from loop.measure.launch import with_package_path
    from tests.conftest import git
    from tests.test_suite_cmd import two_op_repo

    two_op_repo(tmp_path, clean_env)
    start = git(tmp_path, "rev-parse", "HEAD").strip()
    target, run = TARGETS[0], "suite-vector-add-triton"
    err_path = tmp_path_factory.mktemp("driver") / "stderr.txt"
    cmd = [sys.executable, "-m", "loop", "suite", "run", target, "--device", "cpu", "--max-iters", "2", "--archs", "sm_90",
           "--ray", "--json"]
    with open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=with_package_path(dict(os.environ)), stdout=subprocess.PIPE,
                                stderr=err, text=True)
    checkpointed = re.compile(rf"\[ray\] {re.escape(target)}: iteration (\d+) checkpointed from \S+ \(task pid (\d+)\)")
    deadline = time.monotonic() + 180
    while not (found := [m for m in checkpointed.finditer(err_path.read_text()) if int(m.group(1)) >= 1]):
        assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()[-3000:]
        time.sleep(0.2)
    came_back = (tmp_path / "sandbox" / run / "results.jsonl").read_text()  # the checkpoint, in this repository
    pid = found[0].group(2)
    [clone] = [c for c in Path(tempfile.gettempdir()).glob("tileloop-task-*")
               if (c / "task.pid").is_file() and (c / "task.pid").read_text().strip() == pid]
    os.kill(int(pid), signal.SIGKILL)  # the task's worker process, and with it the run's tileloop
    out, _ = proc.communicate(timeout=240)
    said = err_path.read_text()
    assert proc.returncode == 0, said[-3000:]
    assert int(found[0].group(1)) == 1 and "sending it again to resume from iteration 1" in said, said[-3000:]
    [entry] = json.loads(out)["entries"]
    assert "error" not in entry and entry["resumed"] is True, (entry, said[-3000:])
    assert "WorkerCrashedError" in entry["lost_task"] and "after iteration 1 had come back" in entry["lost_task"]
    run_dir = tmp_path / "sandbox" / run
    recs = _records(run_dir / "results.jsonl")
    assert [r.iteration for r in recs] == [0, 1, 2], said[-3000:]  # none lost, none twice
    # the baseline and iteration 1 are those that came back before the kill, not run again
    assert (run_dir / "results.jsonl").read_text().startswith(came_back) and len(_records_text(came_back)) == 2
    state = st.view(run_dir.parent.parent, run_dir.name)
    assert state["last_iteration"] == 2 and state["inflight"] is None and state["stopped"]["state"] == "stop"
    assert git(tmp_path, "rev-parse", f"tileloop/{run}").strip() == state["best_commit"]
    for r in recs:  # every experiment's commit came back into this repository
        assert git(tmp_path, "cat-file", "-t", r.commit).strip() == "commit"
    assert main(["history", "--run", run, "--json"]) == 0  # from git alone, in this repository
    assert [row["status"] for row in json.loads(capsys.readouterr().out)["rows"]] == [r.status for r in recs]
    assert git(tmp_path, "rev-parse", "HEAD").strip() == start and git(tmp_path, "status", "--porcelain") == ""
    # the lost task's run died with it, and the task sent again removed the clone it left
    assert not clone.exists()
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _cwd(p).startswith(str(clone))]


def test_a_task_whose_node_dies_resumes_from_its_last_checkpoint_on_another_node(tmp_path, clean_env,
                                                                                   tmp_path_factory):
    """A cluster of a head (no CPU for tasks) and one worker node, on this host: once the checkpoint
    of iteration 1 came back, a second worker node joins and the first one is removed (its raylet
    and workers killed, as when a machine goes). The driver sends the run again, to the node left,
    as a resume from that checkpoint: baseline, iteration 1 (as it came back) and iteration 2, each
    recorded once; nothing of the run is left running on the dead node."""
    import os
    import re
    import subprocess
    import sys
    import shutil
    import tempfile
    import time

    from ray.cluster_utils import Cluster

    from loop.measure.launch import with_package_path
    from tests.test_suite_cmd import two_op_repo

    two_op_repo(tmp_path, clean_env)
    target, run = TARGETS[0], "suite-vector-add-triton"
    env = with_package_path(dict(os.environ))
    clean_env.setenv("PYTHONPATH", env.get("PYTHONPATH", ""))  # the nodes' workers import this tileloop
    short = tempfile.mkdtemp(prefix="tl-ray-test-", dir="/tmp")  # pytest's folder under xdist is too long for Ray's sockets
    clean_env.setenv("TMPDIR", short)
    clean_env.setattr(tempfile, "tempdir", short)
    cluster, proc = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}), None
    try:
        doomed = cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
        cluster.wait_for_nodes()
        err_path = tmp_path_factory.mktemp("driver") / "stderr.txt"
        cmd = [sys.executable, "-m", "loop", "suite", "run", target, "--device", "cpu", "--max-iters", "2", "--archs",
               "sm_90", f"--ray={cluster.address}", "--json"]
        with open(err_path, "w") as err:
            proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        checkpointed = re.compile(rf"\[ray\] {re.escape(target)}: iteration (\d+) checkpointed from \S+ \(task pid (\d+)\)")
        deadline = time.monotonic() + 180
        while not (found := [m for m in checkpointed.finditer(err_path.read_text()) if int(m.group(1)) >= 1]):
            assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.2)
        came_back = (tmp_path / "sandbox" / run / "results.jsonl").read_text()  # the checkpoint, in this repository
        pid = int(found[0].group(2))
        assert _raylet_of(pid) == doomed.all_processes["raylet"][0].process.pid  # the task ran on the doomed node
        [clone] = [c for c in Path(tempfile.gettempdir()).glob("tileloop-task-*")
                   if (c / "task.pid").is_file() and (c / "task.pid").read_text().strip() == str(pid)]
        cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
        cluster.remove_node(doomed, allow_graceful=False)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc is not None and proc.poll() is None:  # a check above failed: the driver goes too
            proc.kill()
            proc.wait()
        cluster.shutdown()
        shutil.rmtree(short, ignore_errors=True)
    said = err_path.read_text()
    assert proc.returncode == 0, said[-3000:]
    assert int(found[0].group(1)) == 1 and "sending it again to resume from iteration 1" in said, said[-3000:]
    [entry] = json.loads(out)["entries"]
    assert "error" not in entry and entry["resumed"] is True, (entry, said[-3000:])
    # Ray says NodeDiedError here (its raylet gone); the node's worker seen dying first would say WorkerCrashedError
    why = re.match(r"the Ray task on \S+ was lost \((\w+)\) after iteration 1 had come back", entry["lost_task"])
    assert why and why.group(1) in ("NodeDiedError", "WorkerCrashedError", "LocalRayletDiedError"), entry["lost_task"]
    run_dir = tmp_path / "sandbox" / run
    recs = _records(run_dir / "results.jsonl")
    assert [r.iteration for r in recs] == [0, 1, 2], said[-3000:]  # none lost, none twice
    assert (run_dir / "results.jsonl").read_text().startswith(came_back) and len(_records_text(came_back)) == 2
    state = st.view(run_dir.parent.parent, run_dir.name)
    assert state["last_iteration"] == 2 and state["inflight"] is None and state["stopped"]["state"] == "stop"
    for r in recs:  # every experiment's commit came back into this repository
        assert git_type(tmp_path, r.commit) == "commit"
    # the driver's cost counts every checkpoint it took in, of both tasks
    assert entry["driver"]["checkpoints"] == len(checkpointed.findall(said)) >= 2 and entry["driver"]["sent_bytes"] > 0
    # the task on the dead node died with it, its run's tileloop too, and the task sent again removed its clone
    assert not os.path.exists(f"/proc/{pid}") and not clone.exists()
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _cwd(p).startswith(str(clone))]


def git_type(root, sha: str) -> str:
    from tests.conftest import git

    return git(root, "cat-file", "-t", sha).strip()


def _clones_from(start: str) -> list[Path]:
    """The tasks' clones left in this host's temporary folder that hold the commit `start`."""
    import subprocess
    import tempfile

    return [c for c in Path(tempfile.gettempdir()).glob("tileloop-task-*") if (c / "repo").is_dir()
            and subprocess.run(["git", "-C", str(c / "repo"), "cat-file", "-e", f"{start}^{{commit}}"],
                               capture_output=True).returncode == 0]


def _raylet_of(pid: int) -> int | None:
    """The raylet above a process (its Ray worker's parent), or None."""
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # gone meanwhile
            return None
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if name == "raylet":
            return pid
        pid = int(rest[1])  # its parent
    return None


def _cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:  # gone meanwhile, or not ours to read
        return ""


def _records_text(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


class _FakeRay:
    """Ray as the driver uses it, each task's stream scripted: an item is what the task yields, an
    exception what Ray raises for it (a lost worker). No cluster is started."""

    class exceptions:  # noqa: N801 (as Ray names it)
        class RayError(Exception):
            pass

        class WorkerCrashedError(RayError):
            pass

        class NodeDiedError(RayError):
            pass

        class RayTaskError(RayError):
            pass

    def __init__(self, streams: list[list]):
        self.streams, self.sent = streams, []

    def init(self, **kwargs):
        return type("Context", (), {"address_info": {"session_dir": "/nonexistent"}})()

    def shutdown(self):
        pass

    def cluster_resources(self):
        return {"CPU": 1.0}

    def put(self, data):
        return data

    def wait(self, streams, num_returns, timeout):
        return list(streams), []

    def get(self, item):
        if isinstance(item, Exception):
            raise item
        return item

    def remote(self, fn):
        fake = self

        class Remote:
            def options(self, **kwargs):
                assert kwargs["num_returns"] == "streaming" and kwargs["max_retries"] == 0  # no rerun by Ray
                return self

            def remote(self, spec, bundle, records):
                fake.sent.append((spec.target, records is not None))
                return iter(fake.streams.pop(0))

        return Remote()


@pytest.mark.parametrize("second", ["lost", "result"])
def test_a_lost_task_is_sent_again_once(kernel_repo, monkeypatch, second):
    """The driver's part, Ray faked: a task lost before any checkpoint came back is sent again from
    the start, once; lost again, its entry says so and what --resume does; else its entry says why
    its first task was lost."""
    import sys

    from loop.suite.engines import SuiteCall
    from loop.suite.ray_engine import RayEngine
    from loop.suite.ray_task import TaskResult, pack
    from tests.conftest import git

    target, run = "kernels/vector_add/vector_add_triton.py", "suite-vector-add-triton"
    lost = _FakeRay.exceptions
    entry = {"schema": "tileloop.suite-entry/1", "run": run, "target": target, "iterations": 2}
    result = TaskResult(target=target, node="n2", entry=entry, refs={}, bundle=None, archive=pack({}), log=[])
    ray = _FakeRay([[lost.WorkerCrashedError("killed")], [lost.NodeDiedError("gone")] if second == "lost" else [result]])
    monkeypatch.setitem(sys.modules, "ray", ray)
    said = []
    call = SuiteCall(root=kernel_repo, start_branch=git(kernel_repo, "rev-parse", "--abbrev-ref", "HEAD").strip(),
                     start_sha=git(kernel_repo, "rev-parse", "HEAD").strip(), targets=(target,),
                     out_dir=kernel_repo / "sandbox" / "suite", per_run_s=None, extra=("--device", "cpu"), resume=False,
                     killed_here=None, log=said.append)
    [got] = RayEngine().run(call, None)
    assert ray.sent == [(target, False), (target, False)], said  # sent again once, from the start
    assert any("was lost (WorkerCrashedError); sending it again from the start" in line for line in said), said
    if second == "lost":
        assert got["error"].startswith("the Ray task failed (NodeDiedError, a second time)"), got
        assert "suite run --ray --resume starts it anew" in got["error"]
    else:
        assert "error" not in got and got["node"] == "n2" and "before a checkpoint had come back" in got["lost_task"]
        # what the run cost the driver, over both its tasks: the start's bundle sent to each, the result taken in
        from loop.suite.ray_task import make_bundle

        start = len(make_bundle(kernel_repo, [f"refs/heads/{call.start_branch}"]))
        cost = got["driver"]
        assert cost["sent_bytes"] == 2 * start and cost["returned_bytes"] == len(result.archive) and cost["checkpoints"] == 0
        assert cost["driver_s"] == pytest.approx(cost["send_s"] + cost["fetch_s"] + cost["take_s"], abs=1e-3)
    assert json.loads((kernel_repo / "sandbox" / "suite" / f"{run}.json").read_text()) == got


def test_a_temporary_folder_too_long_for_the_cluster_sockets_is_replaced_by_a_short_one(tmp_path, monkeypatch):
    import tempfile

    from loop.suite.ray_cluster import SOCKET_ROOT_MOST
    from loop.suite.ray_engine import RayEngine

    cluster = RayEngine().cluster
    deep = tmp_path / ("d" * (SOCKET_ROOT_MOST + 1))
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    root = cluster.temp_root()["_temp_dir"]
    assert len(root) <= SOCKET_ROOT_MOST and root.startswith("/tmp/") and cluster.own_root.is_dir()
    cluster.own_root.rmdir()
    short = tmp_path.anchor + "t"  # a root that fits is left to Ray
    monkeypatch.setattr(tempfile, "tempdir", short)
    assert RayEngine().cluster.temp_root() == {}


@pytest.fixture(scope="module")
def ray_on_pythonpath(tmp_path_factory) -> tuple[str, str]:
    """An interpreter that finds Ray only through PYTHONPATH, as after `pip install --target DIR`: a
    virtual environment of this Python with no site-packages of its own, and a folder of links to this
    one's site-packages (Ray's among them) for its PYTHONPATH. Ray starts its workers with it."""
    import subprocess
    import sys

    import ray

    home = tmp_path_factory.mktemp("pythonpath-only")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home / "venv")], check=True)
    site, folder = Path(ray.__file__).parent.parent, home / "site"
    folder.mkdir()
    for entry in site.iterdir():
        if entry.suffix != ".pth" and entry.name != "__pycache__":  # .pth files work only in a site folder
            (folder / entry.name).symlink_to(entry)
    python = str(home / "venv" / "bin" / "python")
    assert subprocess.run([python, "-c", "import ray"], cwd=home, capture_output=True).returncode != 0
    return python, str(folder)


def test_a_local_cluster_s_workers_import_a_ray_found_through_the_driver_s_pythonpath(ray_on_pythonpath, tmp_path):
    """The driver's Ray found through PYTHONPATH only: the local cluster's workers import it, and this
    tileloop, from the PYTHONPATH they are given (once tileloop's root alone: every worker died at start)."""
    import subprocess

    python, site = ray_on_pythonpath
    script = """
import json, sys
from pathlib import Path
from loop.suite.engines import SuiteCall
from loop.suite.ray_engine import RayEngine

out = Path(sys.argv[1])
call = SuiteCall(root=out, start_branch="", start_sha="", targets=(), out_dir=out, per_run_s=None, extra=(),
                 resume=False, killed_here=None, log=lambda line: print(line, file=sys.stderr))
engine = RayEngine()
session = engine.cluster.start(1, call.log)
ray = engine.ray

def where():
    import loop, ray
    return ray.__file__, loop.__file__

ready, _ = ray.wait([ray.remote(where).remote()], timeout=40)
print(json.dumps(ray.get(ready[0]) if ready else None))
engine.cluster.stop(session, out)
"""
    from loop.measure.launch import SOURCE_ROOT

    proc = subprocess.run([python, "-c", script, str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{SOURCE_ROOT}{os.pathsep}{site}"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where = json.loads(proc.stdout.strip().splitlines()[-1])
    assert where is not None, "the task never ran: " + proc.stderr[-3000:]
    assert where == [f"{site}/ray/__init__.py", str(SOURCE_ROOT / "loop" / "__init__.py")]


def test_a_suite_whose_workers_die_at_start_ends_with_the_reason_in_its_entry(ray_on_pythonpath, kernel_repo):
    """The local cluster's workers unable to import Ray (given tileloop's root alone as PYTHONPATH, as
    before the fix above): the task never begins, the suite gives it up after START_S instead of
    waiting for good, its entry says why with the workers' own error, and the cluster's logs are kept."""
    import subprocess

    from loop.measure.launch import SOURCE_ROOT

    python, site = ray_on_pythonpath
    script = """
import sys
from loop.measure.launch import with_package_path
from loop.suite import ray_cluster, ray_deadlines

ray_deadlines.START_S = 15.0
ray_cluster.worker_env_vars = lambda: with_package_path({})  # tileloop's root alone: the workers find no Ray
from loop.cli import main

sys.exit(main(sys.argv[1:]))
"""
    target, run = "kernels/vector_add/vector_add_triton.py", "suite-vector-add-triton"
    proc = subprocess.run([python, "-c", script, "suite", "run", target, "--device", "cpu", "--ray", "--json"],
                          cwd=kernel_repo, capture_output=True, text=True, timeout=150,
                          env={**os.environ, "PYTHONPATH": f"{SOURCE_ROOT}{os.pathsep}{site}"})
    [entry] = json.loads(proc.stdout)["entries"]
    error = entry["error"]
    assert error.startswith("the Ray task failed (it had not begun 15 s after it was sent: a worker of the local "
                            "cluster died at start: ModuleNotFoundError: No module named 'ray' (ray-logs/"), error
    assert error.endswith("suite run --ray --resume starts it anew") and "\n" not in error
    logs = kernel_repo / "sandbox" / "suite" / "ray-logs"
    named = error.split("(ray-logs/", 1)[1].split(")", 1)[0]
    assert "ModuleNotFoundError: No module named 'ray'" in (logs / named).read_text()
    assert json.loads((kernel_repo / "sandbox" / "suite" / f"{run}.json").read_text()) == entry
    assert not (kernel_repo / "sandbox" / run).exists()  # nothing of the run came back: --resume starts it anew
