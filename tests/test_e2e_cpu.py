"""End to end on a real git repository in tmp_path, under the Triton interpreter (--device cpu):
init, agent steps that keep, revert, crash and cannot be measured (a launch-only change),
perf_results.md, report.md and the JSON with every speedup recomputed from results.jsonl, trailers,
history == records, an unattended run, and resume after an interruption."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from speedups import check_records_json, check_run, table_rows

from loop.records import gitops, history
from loop.cli import main
from loop.records.results import read_records
from loop.records.perf_table import Row

pytestmark = pytest.mark.slow
KERNELS = Path(__file__).resolve().parent.parent / "kernels"
SMALL_SPEC = '''
import torch

CORRECTNESS_SHAPES = [(1,), (127,), (1000,)]
BENCHMARK_SHAPES = [(1 << 20,)]
INTERPRETER_SHAPES = [(4096,)]
DTYPES = ["float32"]
TOLERANCES = {"float32": (1e-6, 1e-6)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device, dtype=dtype)
    y = torch.randn(shape, generator=g, device=device, dtype=dtype)
    return {"x": x, "y": y, "out": torch.empty(shape, device=device, dtype=dtype)}


def reference(x, y, out):
    return x + y


def flops(shape):
    return shape[0]


def bytes_moved(shape, dtype):
    return 12 * shape[0]
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def small_repo(tmp_path, monkeypatch):
    op = tmp_path / "kernels" / "vector_add"
    op.mkdir(parents=True)
    shutil.copy(KERNELS / "vector_add" / "vector_add_triton.py", op)
    (op / "spec.py").write_text(SMALL_SPEC)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "kernel")
    monkeypatch.chdir(tmp_path)
    return tmp_path


TARGET = "kernels/vector_add/vector_add_triton.py"


def edit(repo: Path, old: str, new: str) -> None:
    path = repo / TARGET
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def run_json(capsys, argv) -> dict:
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_agent_session_keep_revert_crash(small_repo, capsys):
    out = run_json(capsys, ["init", TARGET, "--device", "cpu", "--branch", "tileloop/e2e"])
    assert out["timings"] == "interpreter" and out["target_backend"] == "interpreter"
    run_id = out["run"]

    edit(small_repo, "BLOCK = 128", "BLOCK = 1024")  # 8x fewer interpreted programs: faster
    keep = run_json(capsys, ["step", "-m", "BLOCK 128 -> 1024", "--hypothesis", "fewer programs"])
    assert keep["status"] == "keep" and keep["correctness"] == "PASS" and keep["speedup"] > 1

    edit(small_repo, "NUM_WARPS = 1", "NUM_WARPS = 4")  # the interpreter ignores num_warps: nothing to time
    un = run_json(capsys, ["step", "-m", "num_warps 1 -> 4", "--hypothesis", "more warps"])
    assert (un["status"], un["correctness"], un["decision"]["verdict"]) == ("unmeasured", "PASS", "unmeasured")
    assert un["speedup"] is None and un["latency_ms"] is None and un["backends"]["interpreter"]["latency_ms"] is None
    assert "launch settings (num_warps)" in un["decision"]["reason"] and "interpreter" in un["decision"]["reason"]
    assert un["change"]["kinds"] == ["launch"] and un["change"]["measurable"] is False
    assert un["stop"] == {"state": "continue", "reason": "", "timing": "interpreter"}
    assert "NUM_WARPS = 1" in (small_repo / TARGET).read_text()  # back to the best version

    edit(small_repo, "x + y", "x - y")  # wrong values
    wrong = run_json(capsys, ["step", "-m", "subtract instead of add"])
    assert (wrong["status"], wrong["correctness"], wrong["decision"]["verdict"]) == ("revert", "FAIL", "incorrect")
    assert "x + y" in (small_repo / TARGET).read_text()  # reverted to the best version

    edit(small_repo, "pid = tl.program_id(0)", "pid = tl.program_id(0) +")  # does not even parse
    crash = run_json(capsys, ["step", "-m", "syntax error"])
    assert crash["status"] == "crash" and crash["decision"]["verdict"] == "compile_error"

    run_dir = small_repo / "sandbox" / run_id
    records = read_records(run_dir / "results.jsonl")
    assert [r.status for r in records] == ["keep", "keep", "unmeasured", "revert", "crash"]
    assert all(r.env.get("python") and r.source_hash for r in records)

    # perf_results.md: the fixed five columns first, then what makes it self-contained, then one per backend
    perf = (run_dir / "perf_results.md").read_text()
    header = next(line for line in perf.splitlines() if line.startswith("|"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols == ["iteration", "optimization", "latency_ms", "correctness", "status", "hypothesis", "decision",
                    "speedup_vs_incumbent", "incumbent_ms", "cumulative_speedup", "commit", "ref",
                    "interpreter_ms", "ptx_ms", "tileir_ms"]
    assert "Triton interpreter timings" in perf and "the median at one shape (4096 float32)" in perf
    row = table_rows(perf)[2]
    assert (row["status"], row["correctness"], row["ref"]) == ("unmeasured", "PASS", f"refs/tileloop/{run_id}/2")
    assert row["speedup_vs_incumbent"] == "" and row["latency_ms"] == "" and row["interpreter_ms"] == "unmeasured"

    # every experiment is one commit with trailers; the tip is the best kept one; rejected ones live under refs
    exps = history.experiments(small_repo, run_id, "tileloop/e2e")
    assert [int(t["Tileloop-Iteration"]) for _, t in exps] == [0, 1, 2, 3, 4]
    for sha, t in exps:
        for key in ("Tileloop-Run", "Tileloop-Iteration", "Tileloop-Optimization", "Tileloop-Status",
                    "Tileloop-Correctness", "Tileloop-Latency-Ms", "Tileloop-Interpreter-Ms", "Tileloop-Speedup",
                    "Tileloop-Cumulative-Speedup", "Tileloop-Decision", "Tileloop-Timing"):
            assert key in t, (sha, key)
    assert git(small_repo, "rev-parse", "HEAD").strip() == records[1].commit
    refs = gitops.refs_under(small_repo, f"refs/tileloop/{run_id}")
    assert sorted(refs) == [f"refs/tileloop/{run_id}/{n}" for n in (2, 3, 4)]
    assert git(small_repo, "status", "--porcelain", "--untracked-files=no") == ""

    # history, from git alone, equals the records
    hist = run_json(capsys, ["history"])
    from_records = [Row.from_record(r) for r in records]
    assert history.rows(small_repo, run_id, "tileloop/e2e") == from_records
    assert [row["status"] for row in hist["rows"]] == ["keep", "keep", "unmeasured", "revert", "crash"]

    # every speedup published (perf_results.md, report.md, the JSON) recomputed from results.jsonl
    report = run_json(capsys, ["report"])
    text = (small_repo / report["report"]).read_text()
    path = text[text.index("## Optimization path"):]
    assert table_rows(path)[2]["status"] == "unmeasured" and "launch settings (num_warps)" in path
    assert check_run(run_dir) >= 5
    check_records_json(run_json(capsys, ["results"])["records"], records)


def test_integrity_refuses_other_files(small_repo, capsys):
    run_json(capsys, ["init", TARGET, "--device", "cpu", "--branch", "tileloop/integrity"])
    spec = small_repo / "kernels" / "vector_add" / "spec.py"
    spec.write_text(spec.read_text().replace("(1e-6, 1e-6)", "(1.0, 1.0)"))  # loosen the tolerance: cheating
    edit(small_repo, "BLOCK = 128", "BLOCK = 256")
    head = git(small_repo, "rev-parse", "HEAD")
    assert main(["step", "-m", "looser spec"]) == 2
    assert "other than the target" in capsys.readouterr().err
    assert git(small_repo, "rev-parse", "HEAD") == head


def test_unattended_run_and_resume(small_repo, capsys, monkeypatch):
    out = run_json(capsys, ["run", TARGET, "--device", "cpu", "--branch", "tileloop/auto", "--max-iters", "2"])
    assert out["stop"]["state"] in ("stop", "escalate")
    records = out["records"]
    assert records[0]["optimization"] == "baseline" and len(records) == 3
    assert "@triton.autotune" in records[1]["optimization"]  # memory-bound: the autotune space first
    # the interpreter runs an autotuned kernel's first config, here the current one: nothing it can time
    assert records[1]["status"] == "unmeasured" and records[1]["change"]["kinds"] == ["autotune_configs"]
    assert records[2]["optimization"].startswith(("BLOCK", "NUM_WARPS")), records[2]["optimization"]
    # the run's experiments were judged by judges forked from the run's judge host (torch imported once),
    # started before the baseline; the baseline's judge is a new process (the host was not ready yet)
    for n in (1, 2):
        (judged,) = (small_repo / "sandbox" / out["run"] / "logs" / f"iter-00{n}").glob("worker-*.result.json")
        assert json.loads(judged.read_text())["judge_started"] == "forked by the run's judge host", n
    assert not list((small_repo / "sandbox" / out["run"] / "judges").glob("*.pid"))

    # interrupt the next iteration during its measurement, then resume: recorded once, as crash (interrupted)
    from loop.run import measuring

    real = measuring.measure

    def killed(**kwargs):
        if kwargs["check"] != ["candidate"]:  # a sweep's measurement of its values, before the commit, runs
            return real(**kwargs)
        raise KeyboardInterrupt  # the iteration's own measurement is cut off

    monkeypatch.setattr(measuring, "measure", killed)
    assert main(["resume", "--max-iters", "3"]) == 130
    capsys.readouterr()
    monkeypatch.undo()
    monkeypatch.chdir(small_repo)
    resumed = run_json(capsys, ["resume", "--no-continue"])
    recs = resumed["records"]
    assert len(recs) == 4 and recs[3]["status"] == "crash" and recs[3]["optimization"].endswith("(interrupted)")
    assert recs[3]["correctness"] == "not checked" and recs[3]["decision"]["verdict"] == "interrupted"
    run_id = resumed["run"]
    assert history.rows(small_repo, run_id, "tileloop/auto") == [
        Row.from_record(r) for r in read_records(small_repo / "sandbox" / run_id / "results.jsonl")]
    best = [r for r in recs if r["status"] == "keep"][-1]["commit"]
    assert git(small_repo, "rev-parse", "HEAD").strip() == best
    assert git(small_repo, "status", "--porcelain", "--untracked-files=no") == ""

    # the kill said nothing about the candidate: the loop tries it again, once
    again = run_json(capsys, ["resume", "--max-iters", "4"])["records"]
    assert len(again) == 5 and again[4]["status"] != "crash"
    before, after = recs[3]["optimization"].removesuffix(" (interrupted)"), again[4]["optimization"]
    if "(swept " in before or again[4].get("sweep"):
        # a sweep times its values again: the value it keeps follows the new timings ("BLOCK 1024 -> 4096
        # (swept ...)" may come back as "BLOCK 1024 -> 8192 (swept ...)"), the variable and its start do not
        assert after.split(" -> ")[0] == before.split(" -> ")[0]
    else:
        assert after == before and again[4]["key"] == recs[3]["key"]


def test_an_exhausted_playbook_says_why_each_recipe_has_nothing_left(small_repo, capsys):
    """Every recipe but one skipped: after its one candidate the playbook is exhausted, and the stop
    says per recipe why it has nothing left (tried, skipped, does not apply, or its own reason)."""
    from playbook import recipes

    keep = "eviction-policy"
    skip = [r.id for r in recipes() if "triton" in r.languages and r.id != keep]
    argv = ["run", TARGET, "--device", "cpu", "--branch", "tileloop/x", "--max-iters", "5"]
    for rid in skip:
        argv += ["--skip-recipe", rid]
    assert main(argv + ["--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["stop"]["reason"].startswith("playbook exhausted") and len(out["records"]) == 2
    state = json.loads((small_repo / "sandbox" / out["run"] / "state.json").read_text())
    why = state["stopped"]["recipes"]
    assert why[keep] == "1 candidate(s), all tried"
    assert {why[rid] for rid in skip} == {"skipped (--skip-recipe)"}
    assert not any(rid.startswith("cutile-") for rid in why)  # only the kernel's language
    assert f"  {keep}: 1 candidate(s), all tried" in captured.err
    status = run_json(capsys, ["status"])
    assert status["stopped"]["recipes"] == why
