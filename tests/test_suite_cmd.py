"""`tileloop suite run|summarize` on a CPU run (interpreter): entries agree with the run's records,
the summary shows them, bad input is refused."""

from __future__ import annotations

import json

import pytest

from loop.cli import main
from loop.records.results import Record
from loop.run import state as st


# The correctness shapes of the ops these suite runs tune: each spec's smallest ones. Every check of an
# implementation (the run's first check, each judged measurement's) runs every shape in every dtype under
# the interpreter, and the largest shape took nearly all of it (vector_add's 65537 elements: ~4 s of a
# ~4.5 s check; row_sum's 33x1000 and 64x2053: ~10 s of ~11 s). What is checked here is the suite (its
# runs, worktrees, kills, resumes and entries), not the ops' specs, which tests/test_suite_interpreter.py
# and the fast tier check in full.
SMALL_SHAPES = {"vector_add": [(1,), (127,), (4097,)], "row_sum": [(20, 1), (23, 17)]}


def small_specs(root, ops=("vector_add",)) -> None:
    """The specs of `ops` under root/kernels cut to SMALL_SHAPES and committed."""
    import re

    from tests.conftest import git

    for op in ops:
        spec = root / "kernels" / op / "spec.py"
        text, n = re.subn(r"^CORRECTNESS_SHAPES = .*$", f"CORRECTNESS_SHAPES = {SMALL_SHAPES[op]!r}", spec.read_text(),
                          count=1, flags=re.M)
        assert n == 1, spec
        spec.write_text(text)
    git(root, "commit", "-q", "-am", "small correctness shapes")


@pytest.mark.slow  # whole runs under the Triton interpreter
def test_suite_run_then_summarize(kernel_repo, capsys):
    small_specs(kernel_repo)
    target = "kernels/vector_add/vector_add_triton.py"
    assert main(["suite", "run", target, "--device", "cpu", "--max-iters", "1", "--archs", "sm_90",
                 "--out-dir", "out", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    (entry,) = payload["entries"]
    recs = [Record.from_json(json.loads(line)) for line in (kernel_repo / "out" / "suite-vector-add-triton-results.jsonl").read_text().splitlines()]
    best = next(r for r in reversed(recs) if r.status == "keep")
    assert entry["baseline_ms"] == recs[0].latency_ms and entry["best_ms"] == best.latency_ms
    assert entry["iterations"] == len(recs) - 1 == 1
    assert entry["target_backend"] == "interpreter" and entry["device"].startswith("CPU")
    assert entry["largest_shape"]["shape"] == max((s["shape"] for s in recs[0].backends["interpreter"].shapes), key=lambda s: s[0])
    # the suite leaves the repository on the branch it started from, with the run on its own branch
    from tests.conftest import git
    assert git(kernel_repo, "rev-parse", "--abbrev-ref", "HEAD").strip() in ("main", "master")
    assert "tileloop/suite-vector-add-triton" in git(kernel_repo, "branch", "--list")
    best_src = (kernel_repo / "out" / "suite-vector-add-triton-best.py").read_text()
    assert best_src == git(kernel_repo, "show", f"{best.commit}:{target}")
    for name in ("report.md", "latency.png", "perf_results.md"):
        assert (kernel_repo / "out" / f"suite-vector-add-triton-{name}").is_file()
    assert json.loads((kernel_repo / "out" / "suite-targets.json").read_text())["targets"] == [target]

    assert main(["suite", "summarize", "out", "--out", "suite.md"]) == 0
    text = (kernel_repo / "suite.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| vector_add"))
    assert f"{recs[0].latency_ms:.6f}" in row and f"{best.latency_ms:.6f}" in row and "triton/interpreter" in row
    assert "CPU (Triton interpreter)" in text


def test_suite_refuses_bad_input(kernel_repo, capsys):
    assert main(["suite", "run", "kernels/nope.py", "--device", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["suite", "summarize", "kernels"]) == 2
    assert "no suite entries" in capsys.readouterr().err
    (kernel_repo / "kernels" / "vector_add" / "spec.py").write_text("# edited\n")
    assert main(["suite", "run", "kernels/vector_add/vector_add_triton.py", "--device", "cpu"]) == 2
    assert "uncommitted changes" in capsys.readouterr().err
    from tests.conftest import git
    git(kernel_repo, "checkout", "-q", "--", "kernels")
    target = "kernels/vector_add/vector_add_triton.py"
    assert main(["suite", "run", target, "--device", "cpu", "--restart", target]) == 2
    assert "--restart goes with --resume" in capsys.readouterr().err
    assert main(["suite", "run", target, "--device", "cpu", "--resume", "--restart", "kernels/row_sum/row_sum_triton.py"]) == 2
    assert "is not one of the suite's targets" in capsys.readouterr().err


def test_largest_shape_prefers_bytes():
    from loop.suite.summary import largest

    shapes = [{"shape": [4096, 4096], "bytes": 10.0}, {"shape": [2048, 16384], "bytes": 20.0}, {"shape": [8192, 1024], "bytes": 20.0}]
    assert largest(shapes)["shape"] == [2048, 16384]
    assert largest([]) is None


def test_suite_per_run_must_be_positive(kernel_repo, capsys):
    assert main(["suite", "run", "kernels/vector_add/vector_add_triton.py", "--per-run", "-3"]) == 2
    assert "--per-run" in capsys.readouterr().err
    assert main(["suite", "run", "kernels/vector_add/vector_add_triton.py", "--per-run", "0"]) == 2
    assert "--per-run must be positive" in capsys.readouterr().err


def two_op_repo(root, env) -> None:
    """`root` as a git repository with vector_add and row_sum committed (SMALL_SHAPES), the cwd, with a git identity."""
    import shutil

    from tests.conftest import REPO_ROOT, git

    for op in ("vector_add", "row_sum"):
        shutil.copytree(REPO_ROOT / "kernels" / op, root / "kernels" / op, ignore=shutil.ignore_patterns("__pycache__"))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "kernels")
    small_specs(root, ("vector_add", "row_sum"))
    env.chdir(root)
    for name, value in (("GIT_AUTHOR_NAME", "t"), ("GIT_AUTHOR_EMAIL", "t@t"), ("GIT_COMMITTER_NAME", "t"), ("GIT_COMMITTER_EMAIL", "t@t")):
        env.setenv(name, value)


@pytest.mark.slow  # whole runs under the Triton interpreter
def test_suite_on_several_gpus_uses_one_worktree_per_gpu(tmp_path, clean_env, capsys):
    """--gpus: targets spread over the devices, each in its own worktree; entries and branches as for one."""
    from tests.conftest import git

    two_op_repo(tmp_path, clean_env)
    targets = ["kernels/vector_add/vector_add_triton.py", "kernels/row_sum/row_sum_triton.py"]
    assert main(["suite", "run", *targets, "--device", "cpu", "--max-iters", "1", "--archs", "sm_90",
                 "--gpus", "0,1", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert [e["target"] for e in entries] == targets and all("error" not in e for e in entries)
    assert sorted(e["gpu"] for e in entries) == ["0", "1"]
    trees = git(tmp_path, "worktree", "list", "--porcelain")
    assert trees.count("worktree ") == 3 and trees.count("detached") == 2  # the runs' branches are free again
    for e in entries:
        tip = git(tmp_path, "rev-parse", f"tileloop/{e['run']}").strip()
        assert git(tmp_path, "show", f"{tip}:{e['target']}") == (tmp_path / "sandbox" / "suite" / f"{e['run']}-best.py").read_text()
    assert git(tmp_path, "status", "--porcelain") == ""  # the worktrees and outputs live under the ignored sandbox/
    assert main(["suite", "run", *targets, "--gpus", "0,0", "--device", "cpu"]) == 2
    assert "distinct device ids" in capsys.readouterr().err


@pytest.mark.slow  # whole runs under the Triton interpreter
def test_resume_with_fewer_gpus_goes_on_where_the_runs_live(tmp_path, clean_env, capsys):
    """A suite run on GPUs 0 and 1, then `--resume` with GPU 0 alone and with no --gpus: the run in
    gpu1's worktree is found there; nothing starts anew and no branch is forgotten (an earlier
    version looked only in the worktrees of the GPUs given, deleted the run's branch as a run
    killed before its baseline, and tuned the target again from scratch)."""
    from tests.conftest import git

    two_op_repo(tmp_path, clean_env)
    targets = ["kernels/vector_add/vector_add_triton.py", "kernels/row_sum/row_sum_triton.py"]
    # no compile gate (--archs none): where the runs live is checked, not the gate, which the suite runs of
    # test_suite_run_then_summarize and test_suite_on_several_gpus_uses_one_worktree_per_gpu pass through
    args = ["suite", "run", *targets, "--device", "cpu", "--max-iters", "1", "--archs", "none"]
    assert main([*args, "--gpus", "0,1", "--json"]) == 0
    first = {e["run"]: e for e in json.loads(capsys.readouterr().out)["entries"]}
    tips = {run: git(tmp_path, "rev-parse", f"tileloop/{run}").strip() for run in first}
    where = {run: e["gpu"] for run, e in first.items()}
    assert sorted(where.values()) == ["0", "1"]
    for gpus in (["--gpus", "0"], []):
        assert main([*args, *gpus, "--resume", "--json"]) == 0
        out = capsys.readouterr()
        entries = json.loads(out.out)["entries"]
        assert all("error" not in e for e in entries), entries
        assert "tileloop run (" not in out.err and "reporting it again" in out.err
        assert {run: git(tmp_path, "rev-parse", f"tileloop/{run}").strip() for run in first} == tips
        for run, gpu in where.items():  # each run's records stay in the one worktree that holds them
            held = [g for g in ("0", "1") if (tmp_path / "sandbox" / "suite-worktrees" / f"gpu{g}" / "sandbox" / run).is_dir()]
            assert held == [gpu] and not (tmp_path / "sandbox" / run).exists()
        assert [e["iterations"] for e in entries] == [first[e["run"]]["iterations"] for e in entries]
    assert git(tmp_path, "status", "--porcelain") == ""
    assert git(tmp_path, "worktree", "list", "--porcelain").count("detached") == 2


@pytest.mark.slow
def test_a_killed_suite_resumes_each_run_where_it_stopped(tmp_path, clean_env, capsys):
    """SIGTERM to `suite run --gpus` once both runs have their baseline, then `suite run --resume`:
    each run goes on in the worktree that holds it (same GPU), its interrupted experiment is
    recorded once, no iteration is counted twice, and the entries say the runs were resumed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from loop.measure.launch import with_package_path
    from tests.conftest import git

    two_op_repo(tmp_path, clean_env)
    targets = ["kernels/vector_add/vector_add_triton.py", "kernels/row_sum/row_sum_triton.py"]
    # no compile gate (--archs none): the kill and the resume in each worktree are checked, the gate by the
    # other suite tests here
    args = ["suite", "run", *targets, "--device", "cpu", "--max-iters", "2", "--archs", "none", "--gpus", "0,1"]
    proc = subprocess.Popen([sys.executable, "-m", "loop", *args], cwd=tmp_path, env=with_package_path(dict(os.environ)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    trees = {g: tmp_path / "sandbox" / "suite-worktrees" / f"gpu{g}" for g in ("0", "1")}

    def states():
        found = [p for t in trees.values() for p in (t / "sandbox").glob("suite-*/state.json")]
        return [st.view(p.parent.parent.parent, p.parent.name) for p in found]

    deadline = time.monotonic() + 600
    while not (len(states()) == 2 and all(s["last_iteration"] >= 0 for s in states())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "slow"
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    owner = {s["target"]: g for g, t in trees.items() for s in
             [st.view(t, p.parent.name) for p in (t / "sandbox").glob("suite-*/state.json")]}
    assert sorted(owner) == sorted(targets)

    assert main([*args, "--resume", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert [e["target"] for e in entries] == targets and all("error" not in e for e in entries), entries
    for e in entries:
        assert e["gpu"] == owner[e["target"]] and e["resumed"] is True
        run_dir = trees[e["gpu"]] / "sandbox" / e["run"]
        recs = [Record.from_json(json.loads(line)) for line in (run_dir / "results.jsonl").read_text().splitlines()]
        assert [r.iteration for r in recs] == list(range(len(recs))) and len(recs) == 3  # baseline + 2, none twice
        state = st.view(run_dir.parent.parent, run_dir.name)
        assert state["inflight"] is None and state["stopped"]["state"] == "stop"
        assert git(tmp_path, "rev-parse", f"tileloop/{e['run']}").strip() == state["best_commit"]
    # a second --resume finds the runs finished and runs nothing. An entry holding a final measurement
    # (a GPU run's) stands as it is, not measured again; one without (a CPU run's, or one whose
    # report was killed) is reported again.
    out_dir = tmp_path / "sandbox" / "suite"
    measured = json.loads((out_dir / "suite-vector-add-triton.json").read_text())
    measured["final"] = [{"shape": "1024", "dtype": "float32", "best (ms)": "0.5"}]
    (out_dir / "suite-vector-add-triton.json").write_text(json.dumps(measured))
    assert main([*args, "--resume", "--json"]) == 0
    out = capsys.readouterr()
    again = json.loads(out.out)["entries"]
    assert [e["iterations"] for e in again] == [e["iterations"] for e in entries]
    assert "vector_add_triton.py: finished before; its entry stands" in out.err
    assert "row_sum_triton.py: finished before; reporting it again (its entry has no final measurement)" in out.err
    assert again[0]["final"] == measured["final"] and again[0]["gpu"] == owner[targets[0]]
    # --restart forgets one run (branch, records in its worktree, entry) and runs it anew; the other is reported
    # again. The new run is given one iteration (--max-iters 1, its own; the finished run is not run again
    # whatever the limit): that it starts from nothing is what is checked, not a second experiment
    old_dir = trees[owner[targets[1]]] / "sandbox" / "suite-row-sum-triton"
    old_created = json.loads((old_dir / "state.json").read_text())["created"]
    (old_dir / "marker").write_text("from the first run\n")
    at = args.index("--max-iters") + 1
    one = [*args[:at], "1", *args[at + 1:]]
    assert main([*one, "--resume", "--restart", targets[1], "--json"]) == 0
    out = capsys.readouterr()
    fresh = json.loads(out.out)["entries"]
    assert "row_sum_triton.py: restart: forgot sandbox/suite-worktrees/gpu" in out.err
    assert "branch tileloop/suite-row-sum-triton, sandbox/suite/suite-row-sum-triton-best.py" in out.err
    assert fresh[0].get("resumed") is True and fresh[0]["iterations"] == entries[0]["iterations"]
    assert "resumed" not in fresh[1] and "error" not in fresh[1] and fresh[1]["iterations"] == 1
    new_dir = trees[fresh[1]["gpu"]] / "sandbox" / "suite-row-sum-triton"
    assert json.loads((new_dir / "state.json").read_text())["created"] != old_created
    assert not (new_dir / "marker").exists()
    recs = [json.loads(line) for line in (new_dir / "results.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [0, 1]
    assert sum((t / "sandbox" / "suite-row-sum-triton").is_dir() for t in trees.values()) == 1


@pytest.mark.slow
def test_a_killed_one_gpu_suite_resumes_from_the_run_branch_it_left(kernel_repo, capsys):
    """Without --gpus the runs use the repository itself: a SIGTERM leaves it on the run's branch
    (maybe with the candidate uncommitted); `suite run --resume` from there repairs and finishes
    the run and returns to the branch the suite started from."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from loop.measure.launch import with_package_path
    from tests.conftest import git

    small_specs(kernel_repo)
    target = "kernels/vector_add/vector_add_triton.py"
    # no compile gate (--archs none): what is checked is the kill and the resume, not the gate, which
    # the other suite runs here pass through; it took a third of this test's time
    args = ["suite", "run", target, "--device", "cpu", "--max-iters", "3", "--archs", "none"]
    start = git(kernel_repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    proc = subprocess.Popen([sys.executable, "-m", "loop", *args], cwd=kernel_repo, env=with_package_path(dict(os.environ)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    state_path = kernel_repo / "sandbox" / "suite-vector-add-triton" / "state.json"
    deadline = time.monotonic() + 600
    def mid_experiment() -> bool:  # committed and not yet decided: a kill there is recorded as interrupted
        if not state_path.is_file():
            return False
        state = st.view(kernel_repo, state_path.parent.name)
        return state["last_iteration"] >= 1 and (state["inflight"] or {}).get("stage") in ("commit", "verify", "measure")

    while not mid_experiment():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "slow"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert git(kernel_repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "tileloop/suite-vector-add-triton"
    # the run killed mid-experiment is repaired by --resume; forgetting it from under its own branch is refused
    assert main([*args, "--resume", "--restart", target]) == 2
    assert "killed mid-experiment" in capsys.readouterr().err
    assert state_path.is_file() and git(kernel_repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "tileloop/suite-vector-add-triton"

    # the run's process group is killed outright: a git commit of it killed mid-way leaves its lock behind
    lock = kernel_repo / ".git" / "index.lock"
    lock.touch()
    assert main([*args, "--resume", "--json"]) == 0
    assert not lock.exists()
    (entry,) = json.loads(capsys.readouterr().out)["entries"]
    assert entry["resumed"] is True and "error" not in entry
    recs = [Record.from_json(json.loads(line)) for line in
            (kernel_repo / "sandbox" / "suite-vector-add-triton" / "results.jsonl").read_text().splitlines()]
    assert [r.iteration for r in recs] == [0, 1, 2, 3]
    assert any(r.optimization.endswith("(interrupted)") for r in recs[2:])  # the in-flight one, recorded once
    assert git(kernel_repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == start
    assert git(kernel_repo, "status", "--porcelain", "--untracked-files=no") == ""


def _entry(op, lang, final, largest_shape, frac_loop=None):
    return {"op": op, "language": lang, "final": final, "final_largest": max(final, key=lambda r: float(r["best (ms)"])),
            "largest_shape": largest_shape, "largest_best": {"frac_clone_bw": frac_loop} if frac_loop is not None else {}}


def test_targets_are_met_only_when_every_measurement_clears_them():
    from loop.suite.summary import target_rows

    mm = _entry("matmul", "triton", [
        {"shape": "4096x4096x4096", "dtype": "bfloat16", "best (ms)": "0.221600", "torch eager (ms)": "0.198596",
         "torch.compile (ms)": "0.198628"}], {"flops": 1.1e12, "bytes": 1e8})
    rows = {r["target"]: r for r in target_rows([mm])}
    assert rows["bf16 4096x4096x4096: torch.matmul time / ours"]["result"] == "not met"  # 0.896, shown as 0.90
    # a memory-bound op whose final measurement clears the target but whose loop timing does not
    rs = _entry("row_sum", "cutile", [
        {"shape": "32768x8192", "dtype": "float16", "best (ms)": "0.140920", "torch eager (ms)": "0.191448",
         "torch.compile (ms)": "0.191560", "best, fraction of clone bandwidth": "0.90"}],
        {"flops": 2.7e8, "bytes": 5.4e8}, frac_loop=0.78)
    (clone, vs_compile) = target_rows([rs])
    assert (clone["measured"], clone["loop's measurement"], clone["result"]) == ("0.90", "0.78", "not met")
    assert vs_compile["result"] == "met"
    rs["largest_best"]["frac_clone_bw"] = 0.93
    assert target_rows([rs])[0]["result"] == "met"
    # compute-bound (attention): no clone-bandwidth target, only torch.compile
    att = _entry("attention", "triton", [
        {"shape": "4x32x4096x64x1", "dtype": "bfloat16", "best (ms)": "1.0", "torch eager (ms)": "0.7",
         "torch.compile (ms)": "0.7"}], {"flops": 1.4e11, "bytes": 1.3e8})
    assert [r["result"] for r in target_rows([att])] == ["not met"]
    # no final measurement: not measured, never met
    none = dict(rs, final=[], final_largest={})
    assert {r["result"] for r in target_rows([none])} == {"not measured"}


@pytest.mark.slow
def test_a_run_cut_off_by_per_run_goes_on_with_resume(tmp_path, clean_env, capsys):
    """`suite run --gpus 0 --per-run`: a run whose experiment hangs is cut off, repaired and given an
    entry that says so; `summarize --unattended-json` lists it as unfinished; `suite run --resume`
    continues it in its worktree (not anew), after which it is finished."""
    from tests.conftest import REPO_ROOT, git

    two_op_repo(tmp_path, clean_env)
    target = "kernels/vector_add/vector_add_triton.py"
    # no compile gate (--archs none): the cut-off and the resume are checked, not the gate, which the suite runs
    # of test_suite_run_then_summarize and test_suite_on_several_gpus_uses_one_worktree_per_gpu pass through
    args = ["suite", "run", target, "--device", "cpu", "--max-iters", "2", "--archs", "none", "--gpus", "0"]
    clean_env.setenv("TILELOOP_TEST_INJECT", f"1:{REPO_ROOT / 'tests' / 'faults' / 'infinite_loop.py'}")
    clean_env.setenv("TILELOOP_WORKER_TIMEOUT", "900")  # the hang outlasts --per-run
    # the test waits the limit out: the baseline is recorded and experiment 1 hangs well under 26 s after the
    # start on an idle 2-core machine (26 s with the gate's build of the baseline); 70 s leaves room for a loaded one
    assert main([*args, "--per-run", "70", "--json"]) == 0
    out = capsys.readouterr()
    (cut,) = json.loads(out.out)["entries"]
    assert "cut off after 70 s" in out.err and cut["cut_off"] is True and "error" not in cut, (cut, out.err[-2000:])
    run_dir = tmp_path / "sandbox" / "suite-worktrees" / "gpu0" / "sandbox" / cut["run"]
    recs = [Record.from_json(json.loads(line)) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r.iteration for r in recs] == [0, 1] and recs[1].optimization.endswith("(interrupted)")
    assert cut["iterations"] == 1 and cut["experiment_wall_s"] == []  # the interrupted experiment has no wall time
    page = tmp_path / "u.md"
    assert main(["suite", "summarize", "sandbox/suite", "--unattended-json", str(page.with_suffix(".json"))]) == 0
    capsys.readouterr()
    assert (f"{target}: unfinished, cut off by --per-run: 1 experiment(s); `suite run --resume` continues it"
            in page.read_text())

    clean_env.delenv("TILELOOP_TEST_INJECT")
    tip = git(tmp_path, "rev-parse", f"tileloop/{cut['run']}").strip()
    assert main([*args, "--per-run", "600", "--resume", "--json"]) == 0
    out = capsys.readouterr()
    (done,) = json.loads(out.out)["entries"]
    assert "tileloop resume (branch tileloop/suite-vector-add-triton, 1 experiments recorded)" in out.err
    assert done["resumed"] is True and done["cut_off"] is False and done["iterations"] == 2, done
    assert done["stop"]["state"] == "stop"
    recs = [Record.from_json(json.loads(line)) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r.iteration for r in recs] == [0, 1, 2]  # continued, not started anew
    assert git(tmp_path, "merge-base", "--is-ancestor", tip, f"tileloop/{cut['run']}") == ""
    assert main(["suite", "summarize", "sandbox/suite", "--unattended-json", str(page.with_suffix(".json"))]) == 0
    assert "unfinished" not in page.read_text().split("## Not finished")[1]
