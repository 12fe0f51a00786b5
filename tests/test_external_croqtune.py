"""croq-tune's iteration scripts as an external harness: `verify()` printing `VERIFY: PASS|FAIL ...`
and `bench()` printing `TFLOPS: <v> time_ms: <v>`, driven by `--test-cmd` and `--bench-cmd`. The
lines parsed (a record, a verdict, a malformed line refused in one line), one measurement of a
stand-in script (plain Python, no GPU: its time is what its source says), and a run through the CLI.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from conftest import git
from loop.cli import main
from loop.measure import external
from loop.measure.bench_records import MalformedRecord, failed_verdict, parse_printed
from loop.measure.external import ExternalHarnessError, Harness
from loop.records import gitops

REPO_ROOT = Path(__file__).resolve().parent.parent
PY = shlex.quote(sys.executable)
TARGET = "iter000_matmul.py"
# A stand-in for a croq-tune iteration script: its kernel's time and error are constants of the source,
# so a candidate with a smaller TIME_MS is faster and one with a larger ERR fails its check.
SCRIPT = '''\
"""A stand-in croq-tune iteration script: verify() and bench() print what croq-tune's contract asks."""
M = N = K = 4096
TIME_MS = 2.0
ERR = 0.0
LINE = None  # a bench line printed instead of the contract's


def verify():
    print("VERIFY: PASS" if ERR < 1e-2 else f"VERIFY: FAIL max_abs_err={ERR}")


def bench():
    if LINE is not None:
        print(LINE)
        return
    print(f"TFLOPS: {2 * M * N * K / TIME_MS / 1e9:.2f} time_ms: {TIME_MS:.3f}")


if __name__ == "__main__":
    verify()
    bench()
'''
MODULE = TARGET.removesuffix(".py")
TEST_CMD = f'{PY} -c "import {MODULE} as it; it.verify()"'
BENCH_CMD = f'{PY} -c "import {MODULE} as it; it.bench()"'


def version(**values) -> str:
    source = SCRIPT
    for name, value in values.items():
        old = next(line for line in source.splitlines() if line.startswith(f"{name} = "))
        source = source.replace(old, f"{name} = {value!r}")
    return source


# ----------------------------------------------------------------------------- the lines


def test_a_croq_tune_line_is_a_record_with_its_time_and_tflops():
    text = "compiling...\nVERIFY: PASS\nTFLOPS: 512.34 time_ms: 0.268\n.TFLOPS: 498.00 time_ms: 0.276\n"
    records = parse_printed(text)
    assert [(r.label, r.latency_ms, r.tflops) for r in records] == [("record", 0.268, 512.34),
                                                                   ("record #2", 0.276, 498.0)]
    assert len({r.key for r in records}) == 2
    mixed = parse_printed("{'op': 'softmax', 'median_ms': 0.5}\nTFLOPS: 1.5 time_ms: 0.7")
    assert [(r.label, r.latency_ms) for r in mixed] == [("op=softmax", 0.5), ("record", 0.7)]


@pytest.mark.parametrize("line", [
    "TFLOPS: fast time_ms: 0.268",
    "TFLOPS: 512.34 time_ms: 0.000",  # printed with too few digits
    "TFLOPS: 512.34 time_ms: -0.2",
    "TFLOPS: nan time_ms: 0.268",
    "TFLOPS: 512.34 time_ms: inf",
    "TFLOPS: 512.34",
    "time_ms: 0.268",
    "TFLOPS: 512.34 time_ms: 0.268 ms",
])
def test_a_malformed_croq_tune_line_is_refused_in_one_line(line):
    with pytest.raises(MalformedRecord) as caught:
        parse_printed(f"VERIFY: PASS\n{line}\n")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("output line 2 is not `TFLOPS: <v> time_ms: <v>`")
    assert repr(line) in message


def test_verdicts_other_than_pass_are_failures():
    assert failed_verdict("VERIFY: PASS\nTFLOPS: 1 time_ms: 1") is None
    assert failed_verdict("no verdict at all") is None
    assert failed_verdict("VERIFY: PASS\n  VERIFY: FAIL max_abs_err=0.5  \n") == "VERIFY: FAIL max_abs_err=0.5"
    assert failed_verdict("VERIFY:") == "VERIFY:"
    assert failed_verdict("VERIFY: PASSED") == "VERIFY: PASSED"


# ----------------------------------------------------------------------------- one measurement


@pytest.fixture
def croq_repo(tmp_path, clean_env):
    """A repository holding one committed stand-in iteration script (the target)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / TARGET).write_text(SCRIPT)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "croq-tune iteration 0")
    gitops.ensure_excluded(repo, "/sandbox/")
    clean_env.chdir(repo)
    return repo


def measure(repo, incumbent: str | None, candidate: str, test_cmd: str = TEST_CMD):
    (repo / TARGET).write_text(candidate)
    return external.measure(root=repo, target=TARGET, harness=Harness(test_cmd, BENCH_CMD, 2),
                            workdir=repo / "sandbox" / "it", incumbent_src=incumbent, candidate_src=candidate,
                            timeout_s=60, allowed_untracked=set())


def test_a_passing_faster_script_is_timed_against_the_incumbent(croq_repo):
    results, raw = measure(croq_repo, version(TIME_MS=2.0), version(TIME_MS=1.5))
    r = results["harness"]
    assert (r.status, r.correctness, r.latency_ms, r.incumbent_ms) == ("ok", "PASS", 1.5, 2.0)
    (entry,) = r.shapes
    assert entry["shape"] == ["record"] and entry["candidate"]["tflops"] > entry["incumbent"]["tflops"]
    (shape,) = raw["harness"]["timing"]["shapes"]
    assert shape["impls"] == {"candidate": {"samples_ms": [1.5, 1.5]}, "incumbent": {"samples_ms": [2.0, 2.0]}}
    assert all(run["imported_target"] for run in raw["harness"]["runs"])


def test_a_script_whose_verify_prints_fail_is_incorrect_and_not_timed(croq_repo):
    results, raw = measure(croq_repo, version(), version(TIME_MS=0.5, ERR=0.5))
    r = results["harness"]
    assert (r.status, r.correctness) == ("incorrect", "FAIL")
    assert "printed 'VERIFY: FAIL max_abs_err=0.5'" in r.reason
    assert [run["command"] for run in raw["harness"]["runs"]] == ["test"]  # exit status 0, refused all the same


def test_a_bench_that_prints_fail_is_incorrect_for_the_candidate(croq_repo):
    both = f'{PY} -c "import {MODULE} as it; it.verify(); it.bench()"'
    (croq_repo / TARGET).write_text(version(ERR=0.5))
    results, _ = external.measure(root=croq_repo, target=TARGET, harness=Harness(f"{PY} -c pass", both, 2),
                                  workdir=croq_repo / "sandbox" / "it", incumbent_src=version(),
                                  candidate_src=version(ERR=0.5), timeout_s=60, allowed_untracked=set())
    r = results["harness"]
    assert r.status == "incorrect" and "bench command printed 'VERIFY: FAIL max_abs_err=0.5' on the candidate" in r.reason


def test_a_malformed_line_is_the_candidates_fault_or_the_harnesss(croq_repo):
    bad = version(LINE="TFLOPS: 900.00 time_ms: 0.000")
    results, _ = measure(croq_repo, version(), bad)
    r = results["harness"]
    assert r.status == "incorrect" and "is not `TFLOPS: <v> time_ms: <v>`" in r.reason and "\n" not in r.reason
    with pytest.raises(ExternalHarnessError, match=r"is not `TFLOPS.*on the incumbent, run 1/4") as caught:
        measure(croq_repo, bad, version())
    assert "\n" not in str(caught.value)
    with pytest.raises(ExternalHarnessError, match=r"on the baseline, run 1/2"):
        measure(croq_repo, None, bad)
    assert (croq_repo / TARGET).read_text() == bad  # the candidate is put back


# ----------------------------------------------------------------------------- through the CLI


def call(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv + ["--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_a_croq_tune_script_tuned_through_the_cli(croq_repo, capsys):
    code, init = call(capsys, ["init", TARGET, "--device", "cpu", "--branch", "tileloop/croq", "--test-cmd", TEST_CMD,
                               "--bench-cmd", BENCH_CMD, "--bench-repeats", "2"])
    assert code == 0, init
    base = init["baseline"]["backends"]["harness"]
    assert (base["status"], base["latency_ms"]) == ("ok", 2.0) and base["shapes"][0]["baseline"]["tflops"] > 0
    target = croq_repo / TARGET

    def step(name, source):
        target.write_text(source)
        return call(capsys, ["step", "-m", name, "--hypothesis", f"h: {name}"])

    code, out = step("TIME_MS 2.0 -> 1.0", version(TIME_MS=1.0))
    assert code == 0 and (out["status"], out["correctness"]) == ("keep", "PASS") and out["speedup"] == 2.0
    best = target.read_text()
    code, out = step("faster but wrong", version(TIME_MS=0.5, ERR=0.5))
    assert (out["status"], out["correctness"], out["decision"]["verdict"]) == ("revert", "FAIL", "incorrect")
    assert "VERIFY: FAIL max_abs_err=0.5" in out["failure"]["message"]
    code, out = step("prints no time", version(TIME_MS=0.5, LINE="TFLOPS: 900.00 time_ms: 0.000"))
    assert (out["status"], out["decision"]["verdict"]) == ("revert", "incorrect")
    assert target.read_text() == best
    assert git(croq_repo, "status", "--porcelain") == ""


# ----------------------------------------------------------------------------- the worked example

EXAMPLE = REPO_ROOT / "examples" / "croq_tune" / "iter000_matmul_bf16.py"


@pytest.mark.slow  # drives the example script and plans it: the fast tier stays under five minutes
def test_the_worked_example_drives_the_example_script_and_the_recipes_read_it(capsys):
    """docs/harness.md's commands import the example script and call its verify() and bench(); the
    script is a TileLang target whose pinned constants the TileLang recipes rewrite."""
    import ast
    import re

    doc = (REPO_ROOT / "docs" / "harness.md").read_text()
    section = doc[doc.index("## Worked example: croq-tune"):]
    calls = re.findall(r"--(test|bench)-cmd\s+'python3 -c \"import (\w+) as it; it\.(\w+)\(\)\"'", section)
    assert calls == [("test", EXAMPLE.stem, "verify"), ("bench", EXAMPLE.stem, "bench")]
    assert f"tileloop init {EXAMPLE.name} " in section
    tree = ast.parse(EXAMPLE.read_text())
    assert {"verify", "bench"} <= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert main(["playbook", "plan", str(EXAMPLE), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["language"], plan["kernel_class"]) == ("tilelang", "dot")
    assert {"tilelang-block-size", "tilelang-num-stages"} <= {a["id"] for a in plan["applicable"]}
