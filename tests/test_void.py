"""Blame where it belongs: a measurement voided by what is not the candidate's doing (a tracked file
other than the target, the run's records or branch, .git's hooks or config changed while it was
measured; the incumbent failing a check) is recorded as void (status unmeasured, correctness not
checked), kept out of the experience log and the no-gain stop rule, and whatever changed is put
back; the records are the orchestrator's, and a change to them between steps is refused. Measured
by a stand-in for the judge (each test says what happened while the candidate ran), on a real git
repository."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from loop import decide
from loop.common.errors import IntegrityError
from loop.common.messages import Inflight
from loop.common.settings import Settings
from loop.records import experience, gitops, history
from loop.records.perf_table import Row
from loop.records.results import BackendResult
from loop.run import state as st
from loop.run import iteration, measuring
from loop.run.baseline import baseline
from loop.run.core import Run
from loop.run.experiment import open_run

KERNEL = Path(__file__).resolve().parent.parent / "kernels" / "vector_add"
TARGET, SPEC = "kernels/vector_add/vector_add_triton.py", "kernels/vector_add/spec.py"


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


class Judge:
    """Stands in for `measuring.measure_version`: the incumbent at 2 ms and the candidate at 1 ms (a clear keep),
    unless told otherwise; `during` runs while the candidate is 'measured'."""

    def __init__(self):
        self.during, self.raw = None, None

    def __call__(self, exp, n, inc_src, cand_src, ahead=None):
        if self.during is not None and inc_src is not None:
            self.during(exp.root)
        shapes = [{"shape": [4096], "impls": {"incumbent": {"samples_ms": [2.0 + i * 1e-3 for i in range(15)]},
                                              "candidate": {"samples_ms": [1.0 + i * 1e-3 for i in range(15)]}}}]
        raw = self.raw or {"status": "ok", "correctness": {"passed": True}, "timing": {"shapes": shapes}}
        ok = raw["status"] == "ok"
        result = BackendResult("interpreter", True, raw["status"], raw.get("message", ""), 1.0 if ok else None,
                               2.0 if ok else None, "PASS" if ok else "FAIL", "interpreter")
        return {"interpreter": result}, {"interpreter": raw}, {}


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run of vector_add on its branch with a recorded baseline, measured by `Judge`."""
    repo = tmp_path / "repo"
    shutil.copytree(KERNEL, repo / "kernels" / "vector_add", ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "kernel")
    monkeypatch.chdir(repo)
    judge = Judge()
    monkeypatch.setattr(measuring, "measure_version", judge)
    monkeypatch.setattr(measuring, "judge_ahead", lambda run, n: None)
    state = st.RunState(run_id="r", branch="tileloop/r", origin_branch="main", target=TARGET, spec=SPEC,
                        language="triton", op="vector_add", device="cpu", target_backend="interpreter",
                        backends=["interpreter"], availability={"interpreter": {"available": True, "reason": ""}},
                        base_commit=gitops.head_sha(repo), seed=0, env={}, untracked_at_start=[],
                        policy=asdict(decide.Policy()), created="now")
    exp = Run(repo, state, Settings(judge_host=False), log=lambda line: None)
    gitops.ensure_excluded(repo, "/sandbox/")
    exp.save()
    st.set_current(repo, "r")
    gitops.create_branch(repo, state.branch)
    exp.snapshot_git_dir()
    baseline(exp)
    return repo, exp, judge


def edit(repo: Path, block: int) -> None:
    path = repo / TARGET
    path.write_text(path.read_text().replace("BLOCK = 128", f"BLOCK = {block}"))


def evaluate(exp: Run, optimization: str, hypothesis: str = "", key: str | None = None):
    """The agent's edit in the tree, evaluated as `tileloop step -m` does."""
    return iteration.evaluate(exp, iteration.edit(exp, optimization, hypothesis, key=key))


def step(exp: Run, block: int, key: str | None = None):
    edit(exp.root, block)
    return evaluate(exp, f"BLOCK 128 -> {block}", "bigger blocks", key=key)


def assert_void(record, exp: Run, what: str) -> None:
    assert (record.status, record.correctness, record.decision.verdict) == ("unmeasured", "not checked", "void")
    assert what in record.decision.reason and "nothing is charged to the candidate" in record.decision.reason
    backend = record.backends["interpreter"]
    assert (backend.status, backend.correctness, backend.latency_ms) == ("unmeasured", None, None)
    assert record.failure is None and record.speedup is None
    assert experience.load() == []  # the experience log learns nothing from it
    assert exp.state.outcomes[-1] == "unmeasured" and exp.state.verdicts[-1] == "void"
    assert gitops.head_sha(exp.root) == exp.state.best_commit  # gone back as a revert does
    # perf_results.md and the history rebuilt from git alone say so
    assert "| not checked   | unmeasured |" in exp.perf_path.read_text() and "void: " in exp.perf_path.read_text()
    rebuilt = history.rows(exp.root, exp.state.run_id, exp.state.branch)
    assert [(r.status, r.correctness, r.decision) for r in rebuilt] == \
        [(r.status, r.correctness, r.decision) for r in map(Row.from_record, exp.records())]


def test_a_tracked_file_changed_while_measured_voids_the_measurement(run):
    repo, exp, judge = run
    spec = repo / SPEC
    before = spec.read_text()
    judge.during = lambda root: (root / SPEC).write_text(before + "\nTOLERANCES = {}\n")
    record, stop = step(exp, 1024)
    assert_void(record, exp, SPEC)
    assert spec.read_text() == before and list(exp.dir.glob("refused/*/tracked.patch"))
    assert stop.state == "continue"
    trailers = gitops.parse_trailers(gitops.commit_message(repo, record.commit))
    assert (trailers["Tileloop-Status"], trailers["Tileloop-Correctness"]) == ("unmeasured", "not checked")
    assert trailers["Tileloop-Decision"].startswith("void: ")


def test_the_target_changed_while_measured_is_the_candidates_doing(run):
    repo, exp, judge = run
    judge.during = lambda root: (root / TARGET).write_text((root / TARGET).read_text() + "\nX = 1\n")
    record, _ = step(exp, 1024)
    assert (record.status, record.correctness, record.decision.verdict) == ("revert", "FAIL", "incorrect")
    assert [e.verdict for e in experience.load()] == ["incorrect"]


def test_an_incumbent_that_fails_its_checks_voids_the_measurement(run):
    repo, exp, judge = run
    judge.raw = {"status": "incorrect", "failed_impl": "incumbent", "message": "output wrong at (4096,)",
                 "correctness": {"passed": False}}
    record, _ = step(exp, 1024)
    assert_void(record, exp, "the incumbent failed")
    judge.raw = {**judge.raw, "failed_impl": "candidate"}  # the candidate's own failure is still its own
    git(repo, "checkout", "-q", "--", TARGET)
    record, _ = step(exp, 2048)
    assert (record.status, record.correctness, record.decision.verdict) == ("revert", "FAIL", "incorrect")


def test_void_measurements_count_toward_no_stop_rule_but_the_iteration_limit(run):
    repo, exp, judge = run
    judge.during = lambda root: (root / SPEC).write_text((root / SPEC).read_text() + "\n# touched\n")
    for block, key in ((256, "block=256"), (512, "block=512")):
        git(repo, "checkout", "-q", "--", TARGET)
        _, stop = step(exp, block, key=key)
    assert stop.state == "continue" and exp.state.outcomes == ["unmeasured", "unmeasured"]
    assert exp.progress().iterations == 2  # they are iterations all the same
    assert exp.state.interrupted == ["block=256", "block=512"] and exp.state.tried[-1:] != ["block=512"]  # tried again once
    judge.during = None
    git(repo, "checkout", "-q", "--", TARGET)
    record, _ = step(exp, 1024)
    assert record.status == "keep"  # an honest candidate after them is kept


def test_records_and_branch_rewritten_while_measured_are_put_back(run):
    repo, exp, judge = run
    results_before, best = exp.results_path.read_bytes(), exp.state.best_commit

    def rewrite(root: Path) -> None:
        exp.results_path.write_text(exp.results_path.read_text().replace('"keep"', '"revert"'))
        exp.perf_path.write_text("forged\n")
        data = json.loads(st.state_path(root, "r").read_text())
        st.state_path(root, "r").write_text(json.dumps({**data, "best_commit": "0" * 40}))
        git(root, "update-ref", "refs/heads/tileloop/r", best)
        git(root, "symbolic-ref", "HEAD", "refs/heads/main")

    judge.during = rewrite
    record, _ = step(exp, 1024)
    assert_void(record, exp, "results.jsonl")
    for what in ("state.json", "perf_results.md", "branch tileloop/r"):
        assert what in record.decision.reason
    assert exp.results_path.read_bytes().startswith(results_before) and len(exp.records()) == 2
    assert gitops.current_branch(repo) == "tileloop/r" and gitops.ref_sha(repo, f"refs/tileloop/r/{record.iteration}")
    assert st.load(repo, "r").best_commit == best
    fresh = open_run("r", Settings(judge_host=False), log=lambda line: None)
    fresh.check_records()  # what is on disk now is what tileloop wrote


def test_git_files_planted_while_measured_are_put_back_and_never_run(run, tmp_path):
    repo, exp, judge = run
    marker = tmp_path / "ran"

    def plant(root: Path) -> None:
        for hook in ("post-commit", "post-rewrite", "reference-transaction", "post-checkout"):
            path = root / ".git" / "hooks" / hook
            path.write_text(f"#!/bin/sh\necho {hook} >> '{marker}'\n")
            path.chmod(0o755)
        with open(root / ".git" / "config", "a") as fh:
            fh.write(f"[core]\n\tfsmonitor = touch {marker}\n")

    judge.during = plant
    record, _ = step(exp, 1024)  # the record stage amends, moves a ref and resets the branch
    assert_void(record, exp, ".git/hooks")
    assert not marker.exists() and not (repo / ".git" / "hooks" / "post-commit").exists()
    assert "fsmonitor" not in (repo / ".git" / "config").read_text()


def test_records_changed_between_steps_are_refused(run):
    repo, exp, _ = run
    state_file = st.state_path(repo, "r")
    data = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**data, "outcomes": ["keep"]}, indent=1))
    tampered = state_file.read_text()
    edit(repo, 1024)
    with pytest.raises(IntegrityError, match=r"changed outside tileloop .*state\.json"):
        evaluate(open_run("r", Settings(judge_host=False), log=lambda line: None), "BLOCK 128 -> 1024")
    assert state_file.read_text() == tampered and gitops.head_sha(repo) == exp.state.best_commit  # nothing written
    state_file.write_text(json.dumps(data, indent=1, sort_keys=True))  # put back: accepted again
    with open(exp.results_path, "a") as fh:
        fh.write(exp.results_path.read_text().splitlines()[0] + "\n")  # a second baseline appended
    with pytest.raises(IntegrityError, match="results.jsonl"):
        open_run("r", Settings(judge_host=False), log=lambda line: None).check_records()


def test_a_perf_results_rewritten_alone_is_regenerated(run):
    repo, exp, _ = run
    text = exp.perf_path.read_text()
    exp.perf_path.write_text(text.replace("| keep", "| kept"))
    lines = []
    again = open_run("r", Settings(judge_host=False), log=lines.append)
    again.check_records()
    assert exp.perf_path.read_text() == text and "regenerated" in lines[0]
    assert list(again.dir.glob("refused/*/perf_results.md"))


def test_a_record_written_but_not_yet_sealed_is_not_taken_for_a_rewrite(run):
    """A kill between appending an iteration's record and sealing it leaves one record past the seal:
    resume finishes that iteration; any other record past the seal is refused."""
    repo, exp, _ = run
    baseline = json.loads(exp.results_path.read_text().splitlines()[0])
    exp.state.inflight = Inflight(1, "record")
    exp.save()
    with open(exp.results_path, "a") as fh:
        fh.write(json.dumps({**baseline, "iteration": 1}) + "\n")
    assert exp.records_changed() == []
    with open(exp.results_path, "a") as fh:
        fh.write(json.dumps({**baseline, "iteration": 0}) + "\n")
    assert exp.records_changed() == ["results.jsonl"]


def test_a_state_rewritten_within_a_run_is_refused_at_the_next_iteration(run):
    """An unattended run holds its state in memory: a state.json another process wrote between two of
    its iterations is found before the next one runs, and nothing is written over it."""
    repo, exp, _ = run
    fresh = open_run("r", Settings(judge_host=False), log=lambda line: None)  # a step's process, state just read
    path = st.state_path(repo, "r")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "seed": data["seed"] + 7}, indent=1, sort_keys=True))  # a setting forged
    forged = path.read_text()
    edit(repo, 1024)
    for held in (exp, fresh):
        with pytest.raises(IntegrityError, match=r"state\.json"):
            evaluate(held, "BLOCK 128 -> 1024")
        assert path.read_text() == forged


def test_a_file_staged_while_measured_is_unstaged_and_set_aside(run):
    """Kernel code could stage files for the record stage's amend: a staged change to a tracked file and
    a staged new file are both put back, and neither reaches the experiment's commit."""
    repo, exp, judge = run

    def stage(root: Path) -> None:
        (root / "planted.py").write_text("X = 1\n")
        (root / SPEC).write_text((root / SPEC).read_text() + "\n# staged\n")
        git(root, "add", "planted.py", SPEC)
        git(root, "checkout", "--", SPEC)  # the working tree as it was: only the index differs

    judge.during = stage
    record, _ = step(exp, 1024)
    assert_void(record, exp, "planted.py")
    assert git(repo, "status", "--porcelain") == "" and not (repo / "planted.py").exists()
    assert list(exp.dir.glob("refused/*/untracked/planted.py"))
    assert git(repo, "show", "--name-only", "--format=", record.commit) == TARGET


def test_a_void_decision_is_pure_and_the_stop_rules_skip_it():
    d = decide.void("the incumbent failed")
    assert (d.action, d.verdict, d.reason, d.speedup) == ("unmeasured", "void", "the incumbent failed", None)
    policy = decide.Policy()

    def stop(*outcomes):
        return decide.stop_state(policy, decide.Progress(iterations=len(outcomes), elapsed_s=0.0, outcomes=outcomes,
                                                         timing="gpu")).state

    assert stop("revert", "revert") == "stop"  # what two `incorrect` records used to do
    assert stop("unmeasured", "unmeasured") == "continue" and stop("revert", "unmeasured", "unmeasured") == "continue"
    assert not experience.learned_from("void") and experience.learned_from("incorrect")
