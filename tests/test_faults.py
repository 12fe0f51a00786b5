"""The fault suite (tests/faults/) stepped through the loop on the CPU (Triton interpreter):
each fault gets its typed status, the loop goes on, and the branch stays consistent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from loop.cli import main
from loop.records.results import read_records
from test_e2e_cpu import TARGET, git, small_repo  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
FAULTS = Path(__file__).parent / "faults"
EXPECTED = json.loads((FAULTS / "expected.json").read_text())
CPU_FAULTS = [name for name, e in EXPECTED.items() if not e.get("gpu_only")]


def test_every_fault_file_has_an_expectation():
    files = {p.stem for p in FAULTS.glob("*.py")}
    assert files == set(EXPECTED)


def test_cpu_faults_through_the_loop(small_repo, capsys, monkeypatch):
    monkeypatch.setenv("TILELOOP_WORKER_TIMEOUT", "40")  # the infinite loop must end as a timeout
    assert main(["init", TARGET, "--device", "cpu", "--branch", "tileloop/faults", "--archs", "sm_90", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run"]
    baseline = git(small_repo, "rev-parse", "HEAD").strip()
    original = (small_repo / TARGET).read_text()
    for name in CPU_FAULTS:
        shutil.copy(FAULTS / f"{name}.py", small_repo / TARGET)
        assert main(["step", "-m", f"fault: {name}", "--json"]) == 0, name
        out = json.loads(capsys.readouterr().out)
        want = EXPECTED[name]
        assert (out["status"], out["decision"]["verdict"]) == (want["status"], want["verdict"]), (name, out["decision"])
        assert out["correctness"] == "FAIL"
        # the loop goes on from the same best version, and nothing is left in the tree
        assert git(small_repo, "rev-parse", "HEAD").strip() == baseline
        assert (small_repo / TARGET).read_text() == original
        assert git(small_repo, "status", "--porcelain", "--untracked-files=no") == ""
    records = read_records(small_repo / "sandbox" / run_id / "results.jsonl")
    assert [r.iteration for r in records] == list(range(len(CPU_FAULTS) + 1))
    refs = git(small_repo, "for-each-ref", "--format=%(refname)", f"refs/tileloop/{run_id}").split()
    assert len(refs) == len(CPU_FAULTS)
    # and a correct change is still kept afterwards
    (small_repo / TARGET).write_text(original.replace("BLOCK = 128", "BLOCK = 1024"))
    assert main(["step", "-m", "BLOCK 128 -> 1024", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "keep"


# softmax's correctness shapes without its largest (64x2053: ~7 s of each ~11 s check under the interpreter,
# and a run checks every implementation it judges): the planted fault (every value 1% low) fails at every
# shape, and 33x1000 still takes several column blocks; tests/test_suite_interpreter.py runs the full spec.
SMALL_SHAPES = {"softmax": [(1, 1), (5, 17), (33, 1000)]}


@pytest.mark.parametrize("op", ["softmax", "matmul"])
def test_op_fault_variants_planted_in_an_unattended_run(tmp_path, clean_env, capsys, op):
    """The per-op faults (for overnight runs on those kernels) are planted mid-run: classified, and the run
    goes on (softmax's spec with SMALL_SHAPES as its correctness shapes)."""
    from conftest import REPO_ROOT, materialise

    source = (REPO_ROOT / "kernels" / op / f"{op}_triton.py").read_text()
    materialise(tmp_path / "kernels", op, "triton", source,
                **({"CORRECTNESS_SHAPES": SMALL_SHAPES[op]} if op in SMALL_SHAPES else {}))
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", op)
    clean_env.chdir(tmp_path)
    names = sorted(p.stem for p in (FAULTS / op).glob("*.py"))
    assert names == ["illegal_memory_access", "wrong_values"]
    clean_env.setenv("TILELOOP_TEST_INJECT", f"1:{FAULTS / op / 'wrong_values.py'}")
    # no compile gate (--archs none): the planted fault is caught by the correctness check, not the gate, and
    # the gate's build of every config of the autotune candidate that follows it took half of matmul's time
    assert main(["run", f"kernels/{op}/{op}_triton.py", "--device", "cpu", "--max-iters", "2", "--no-early-stop",
                 "--archs", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = [(r["iteration"], r["status"], r["decision"].get("verdict")) for r in out["records"]]
    assert rows[1] == (1, "revert", "incorrect"), rows
    # the run went on after the fault (its next candidate, the autotune space whose first config is the current
    # launch, is one the interpreter cannot time: unmeasured)
    assert len(rows) == 3 and rows[2][1] in ("keep", "revert", "unmeasured")
    assert git(tmp_path, "status", "--porcelain", "--untracked-files=no") == ""
