"""The external harness (`--test-cmd`, `--bench-cmd`): record parsing, one measurement, and whole
runs through the CLI with `--json` in a throw-away repository that carries its own pytest suite.

The toy target sleeps `DELAY_S` per call, and its perf tests time it with a wall clock, so a
candidate with a shorter delay is really faster: no latency in these tests is written down.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import git
from loop.measure import external
from loop.records import gitops
from loop.cli import main
from loop.common.errors import UserError
from loop.measure.external import ExternalHarnessError, Harness, parse_junitxml, parse_printed

PY = shlex.quote(sys.executable)
TARGET = "kernel.py"
KERNEL = '''\
"""A toy kernel: sum of squares. DELAY_S stands for what a call costs."""
import time

DELAY_S = 0.04


def run(xs):
    time.sleep(DELAY_S)
    return sum(x * x for x in xs)
'''
TEST_KERNEL = '''\
import random

import kernel


def test_matches_reference():
    xs = [random.randint(-50, 50) for _ in range(101)]
    assert kernel.run(xs) == sum(x * x for x in xs)
'''
TEST_PERF = '''\
import os
import statistics
import time

import pytest

import kernel


def median_ms(n):
    assert not os.environ.get("TOY_BENCH_BROKEN"), "the bench machinery is broken"
    xs = list(range(n))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        kernel.run(xs)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@pytest.mark.parametrize("n", [64, 256])
def test_perf_property(record_property, n):
    record_property("op", "sumsq")
    record_property("shape", (n,))
    record_property("median_ms", median_ms(n))


@pytest.mark.parametrize("n", [64, 256])
def test_perf_print(n):
    print({"op": "sumsq", "shape": [n], "dtype": "int64", "median_ms": median_ms(n)})
'''
TEST_CMD = f"{PY} -m pytest -q checks/test_kernel.py"
BENCH_PRINT = f"{PY} -m pytest -q -s checks/test_perf.py -k print"
BENCH_JUNIT = f"{PY} -m pytest -q checks/test_perf.py -k property -o junit_family=xunit1 --junitxml={{junitxml}}"


@pytest.fixture
def harness_repo(tmp_path, clean_env):
    """A repository with a toy target, its correctness test and its perf tests, committed; the cwd."""
    clean_env.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the nested pytest runs start faster
    clean_env.delenv("PYTEST_ADDOPTS", raising=False)
    repo = tmp_path / "repo"
    (repo / "checks").mkdir(parents=True)
    (repo / TARGET).write_text(KERNEL)
    (repo / "checks" / "test_kernel.py").write_text(TEST_KERNEL)
    (repo / "checks" / "test_perf.py").write_text(TEST_PERF)
    (repo / "pytest.ini").write_text("[pytest]\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "toy kernel and its tests")
    clean_env.chdir(repo)
    return repo


def call(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv + ["--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


# ----------------------------------------------------------------------------- parsing


def test_printed_records_are_parsed_and_everything_else_is_skipped(tmp_path):
    marker = tmp_path / "evaluated"
    text = "\n".join([
        "============================= test session starts ==============================",
        "checks/test_perf.py::test_perf[4096-1024] {'op': 'softmax', 'shape': (4096, 1024), 'dtype': 'float16', "
        "'median_ms': 0.0123, 'gbps': 812.5} PASSED",
        '{"op": "softmax", "shape": [4096, 1024], "dtype": "float16", "backend": "cutile", "ms": 0.02, "ok": true}',
        "Cutile: {'forward': {'mean': 0.5, 'median': 0.4, 'nrep': 13}, 'backward': {'median': 1.2}} ms",
        ".{'op': 'rmsnorm', 'shape': [8, 8], 'latency_ms': 0.5}",
        "{'op': 'rmsnorm', 'shape': [8, 8], 'latency_ms': 0.7}",  # the same identity again: numbered
        # skipped: malformed, not a dict, no latency, an unusable latency, code instead of a literal
        "{'op': 'softmax', 'median_ms': }",
        "{not a dict}",
        "[1, 2, 3]",
        "plain text with a } and a {",
        "{'op': 'no latency here', 'gbps': 10.0}",
        "{'op': 'negative', 'median_ms': -1.0}",
        "{'op': 'zero', 'median_ms': 0}",
        "{'op': 'text', 'median_ms': 'fast'}",
        "{'op': 'flag', 'median_ms': True}",
        "{'op': 'nan', 'median_ms': float('nan')}",
        f"{{'op': 'code', 'median_ms': __import__('pathlib').Path({str(marker)!r}).touch()}}",
    ])
    records = parse_printed(text)
    assert not marker.exists()
    assert [(r.label, r.latency_ms) for r in records] == [
        ("op=softmax shape=[4096, 1024] dtype=float16", 0.0123),
        ("op=softmax backend=cutile shape=[4096, 1024] dtype=float16", 0.02),
        ("pass=forward", 0.4),
        ("pass=backward", 1.2),
        ("op=rmsnorm shape=[8, 8]", 0.5),
        ("op=rmsnorm shape=[8, 8] #2", 0.7),
    ]
    assert records[0].gbps == 812.5 and records[0].tflops is None
    assert records[0].fields() == {"op": "softmax", "shape": [4096, 1024], "dtype": "float16"}
    assert len({r.key for r in records}) == len(records)
    assert parse_printed("collected 2 items\n{'op': 'x'}\n2 passed in 0.1s") == []


def test_junitxml_records_from_a_real_pytest_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    (tmp_path / "test_bench.py").write_text(textwrap.dedent('''\
        import pytest

        @pytest.mark.parametrize("n", [16, 32])
        def test_flat(record_property, n):
            record_property("op", "toy")
            record_property("shape", (n, 4))
            record_property("dtype", "float16")
            record_property("median_ms", n / 1000)
            record_property("tflops", 1.5)

        def test_tilegym_style(record_property):
            record_property("benchmark", {"forward": {"median": 0.25, "rel_std": 0.01}, "backward": {"median": 0.75}})

        def test_without_records():
            pass
        '''))
    xml = tmp_path / "out.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                    f"--junitxml={xml}", "test_bench.py"], cwd=tmp_path, check=True, capture_output=True)
    records = parse_junitxml(xml)
    assert [(r.fields(), r.latency_ms) for r in records] == [
        ({"name": "test_bench::test_flat[16]", "op": "toy", "shape": [16, 4], "dtype": "float16"}, 0.016),
        ({"name": "test_bench::test_flat[32]", "op": "toy", "shape": [32, 4], "dtype": "float16"}, 0.032),
        ({"name": "test_bench::test_tilegym_style", "pass": "forward", "property": "benchmark"}, 0.25),
        ({"name": "test_bench::test_tilegym_style", "pass": "backward", "property": "benchmark"}, 0.75),
    ]
    assert records[0].tflops == 1.5


def test_a_broken_junitxml_file_is_a_harness_error(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuites><testcase name='x'>")
    with pytest.raises(ExternalHarnessError, match="not a junitxml file"):
        parse_junitxml(bad)


def test_schedule_interleaves_and_alternates_who_goes_first():
    assert external.schedule(3, True) == ["incumbent", "candidate", "candidate", "incumbent", "incumbent", "candidate"]
    assert external.schedule(2, False) == ["baseline", "baseline"]


@pytest.mark.parametrize("test_cmd, bench_cmd, repeats, match", [
    ("pytest", None, None, "go together"),
    (None, "pytest", None, "go together"),
    (None, None, 3, "needs --test-cmd"),
    ("pytest", "pytest", 1, "at least|>= 2"),
    ("  ", "pytest", None, "--test-cmd is empty"),
])
def test_bad_harness_options(test_cmd, bench_cmd, repeats, match):
    with pytest.raises(UserError, match=match):
        external.from_options(test_cmd, bench_cmd, repeats)


def test_no_harness_options_mean_a_spec_run():
    assert external.from_options(None, None, None) is None
    assert Harness.from_json(Harness("t", "b", 4).to_json()) == Harness("t", "b", 4)


# ----------------------------------------------------------------------------- one measurement

BENCH_SCRIPT = '''\
import sys

import kernel

if getattr(kernel, "FAIL_BENCH", False):
    print("bench setup failed")
    sys.exit(3)
if getattr(kernel, "SILENT", False):
    print("warming up {cache}")
    sys.exit(0)
for op in ["toy"] + getattr(kernel, "EXTRA", []):
    print({"op": op, "median_ms": kernel.COST})
if getattr(kernel, "LITTER", False):
    open("litter.txt", "w").write("x")
'''


@pytest.fixture
def script_repo(tmp_path, clean_env):
    """A repository whose bench is a plain script: fast, for the plumbing of one measurement."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / TARGET).write_text("COST = 2.0\n")
    (repo / "bench.py").write_text(BENCH_SCRIPT)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "toy")
    gitops.ensure_excluded(repo, "/sandbox/")  # as a run does: its own outputs are not the harness's litter
    return repo


def measure(repo: Path, incumbent: str | None, candidate: str, bench: str = f"{PY} bench.py", **kw):
    (repo / TARGET).write_text(candidate)
    harness = Harness(f"{PY} -c pass", bench, 2)
    return external.measure(root=repo, target=TARGET, harness=harness, workdir=repo / "sandbox" / "it",
                            incumbent_src=incumbent, candidate_src=candidate, timeout_s=60,
                            allowed_untracked=set(), **kw)


def test_one_measurement_pairs_the_rounds(script_repo):
    results, raw = measure(script_repo, "COST = 2.0\n", "COST = 1.0\n")
    r = results["harness"]
    assert (r.status, r.correctness, r.latency_ms, r.incumbent_ms) == ("ok", "PASS", 1.0, 2.0)
    (shape,) = raw["harness"]["timing"]["shapes"]
    assert shape["impls"] == {"candidate": {"samples_ms": [1.0, 1.0]}, "incumbent": {"samples_ms": [2.0, 2.0]}}
    assert [(run["command"], run["side"]) for run in raw["harness"]["runs"]] == [
        ("test", "candidate"), ("bench", "incumbent"), ("bench", "candidate"), ("bench", "candidate"), ("bench", "incumbent")]
    assert (script_repo / TARGET).read_text() == "COST = 1.0\n"


def test_the_candidate_is_put_back_after_an_interrupt(script_repo):
    def interrupt(what):
        if what.startswith("bench 2/"):  # the incumbent's source is in the target now
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        measure(script_repo, "COST = 2.0\n", "COST = 1.0\n", on_stage=interrupt)
    assert (script_repo / TARGET).read_text() == "COST = 1.0\n"


def test_a_failing_incumbent_bench_is_a_harness_error(script_repo):
    with pytest.raises(ExternalHarnessError, match="on the incumbent.*bench setup failed"):
        measure(script_repo, "COST = 2.0\nFAIL_BENCH = True\n", "COST = 1.0\n")
    assert (script_repo / TARGET).read_text() == "COST = 1.0\n"


def test_a_failing_candidate_bench_is_a_runtime_error(script_repo):
    results, _ = measure(script_repo, "COST = 2.0\n", "COST = 1.0\nFAIL_BENCH = True\n")
    r = results["harness"]
    assert (r.status, r.correctness) == ("runtime_error", "FAIL") and "exited with code 3" in r.reason


def test_a_candidate_with_other_records_is_incorrect(script_repo):
    results, _ = measure(script_repo, "COST = 2.0\n", "COST = 1.0\nEXTRA = ['sneaky']\n")
    r = results["harness"]
    assert r.status == "incorrect" and "extra: op=sneaky" in r.reason


def test_no_parsable_record_is_a_harness_error_with_the_output_tail(script_repo):
    with pytest.raises(ExternalHarnessError, match=r"no parsable record.*warming up \{cache\}"):
        measure(script_repo, None, "COST = 1.0\nSILENT = True\n")


def test_a_missing_junitxml_file_is_a_harness_error(script_repo):
    with pytest.raises(ExternalHarnessError, match="wrote no junitxml file"):
        measure(script_repo, None, "COST = 1.0\n", bench=f"{PY} bench.py # {{junitxml}}")


def test_a_harness_that_leaves_files_in_the_tree_is_refused(script_repo):
    with pytest.raises(ExternalHarnessError, match="left changes in the working tree.*litter.txt"):
        measure(script_repo, None, "COST = 1.0\nLITTER = True\n")


def test_a_failing_test_command_is_incorrect_and_nothing_is_timed(script_repo):
    (script_repo / TARGET).write_text("COST = 1.0\n")
    harness = Harness(f"{PY} -c \"import sys; print('assert 1 == 2'); sys.exit(1)\"", f"{PY} bench.py", 2)
    results, raw = external.measure(root=script_repo, target=TARGET, harness=harness, workdir=script_repo / "sandbox" / "it",
                                    incumbent_src="COST = 2.0\n", candidate_src="COST = 1.0\n", timeout_s=60,
                                    allowed_untracked=set())
    r = results["harness"]
    assert (r.status, r.correctness) == ("incorrect", "FAIL") and "exited with code 1" in r.reason
    assert "assert 1 == 2" in r.reason
    assert [run["command"] for run in raw["harness"]["runs"]] == ["test"]


# ----------------------------------------------------------------------------- the CLI


@pytest.mark.slow
def test_agent_session_through_the_cli(harness_repo, capsys, clean_env):
    code, init = call(capsys, ["init", TARGET, "--device", "cpu", "--branch", "tileloop/toy", "--test-cmd", TEST_CMD,
                               "--bench-cmd", BENCH_PRINT, "--bench-repeats", "2"])
    assert code == 0, init
    assert init["harness"] == {"test_cmd": TEST_CMD, "bench_cmd": BENCH_PRINT, "bench_repeats": 2}
    assert (init["timings"], init["target_backend"], init["archs"]) == ("harness", "harness", [])
    base = init["baseline"]["backends"]["harness"]
    assert [s["record"] for s in base["shapes"]] == [{"op": "sumsq", "shape": [64], "dtype": "int64"},
                                                    {"op": "sumsq", "shape": [256], "dtype": "int64"}]
    assert base["latency_ms"] >= 40.0  # a wall-clock median of a 40 ms sleep
    target = harness_repo / TARGET
    original = target.read_text()

    def step(name, source):
        target.write_text(source)
        return call(capsys, ["step", "-m", name, "--hypothesis", f"h: {name}"])

    # keep: half the delay is measurably faster on every record
    code, out = step("DELAY_S 0.04 -> 0.02", original.replace("DELAY_S = 0.04", "DELAY_S = 0.02"))
    assert code == 0 and (out["status"], out["correctness"], out["decision"]["verdict"]) == ("keep", "PASS", "improved")
    assert 1.4 < out["speedup"] < 2.6 and out["noise_band"]["lo"] > 1.0
    assert len(out["noise_band"]["per_shape"]) == 2
    for shape in out["backends"]["harness"]["shapes"]:
        assert shape["candidate"]["median_ms"] < 0.75 * shape["incumbent"]["median_ms"]
        assert shape["candidate"]["nrep"] == shape["incumbent"]["nrep"] == 2
    best = target.read_text()

    # revert: a wrong result fails the test command
    code, out = step("wrong values", best.replace("x * x for x", "x * x + 1 for x"))
    assert (out["status"], out["correctness"], out["decision"]["verdict"]) == ("revert", "FAIL", "incorrect")
    assert out["failure"]["status"] == "incorrect" and "exited with code 1" in out["failure"]["message"]
    assert target.read_text() == best

    # crash: a candidate that outruns the time limit is killed and classified
    clean_env.setenv("TILELOOP_WORKER_TIMEOUT", "5")
    code, out = step("hang", best.replace("DELAY_S = 0.02", "DELAY_S = 120"))
    clean_env.delenv("TILELOOP_WORKER_TIMEOUT")
    assert (out["status"], out["decision"]["verdict"]) == ("crash", "timeout")
    assert target.read_text() == best

    # a harness that breaks is not the candidate's fault: exit 2, the iteration left for resume
    clean_env.setenv("TOY_BENCH_BROKEN", "1")
    code, out = step("DELAY_S 0.02 -> 0.015", best.replace("DELAY_S = 0.02", "DELAY_S = 0.015"))
    clean_env.delenv("TOY_BENCH_BROKEN")
    assert code == 2 and "on the incumbent" in out["error"] and " failed" in out["error"]  # the tail of the harness output
    assert "tileloop resume" in out["hint"]
    assert "DELAY_S = 0.015" in target.read_text()  # the candidate is back in place, committed, in flight
    code, out = call(capsys, ["resume"])
    assert code == 0 and out["records"][-1]["status"] == "crash"
    assert out["records"][-1]["backends"]["harness"]["status"] == "not_run"
    assert target.read_text() == best

    code, hist = call(capsys, ["history"])
    assert [(r["iteration"], r["status"]) for r in hist["rows"]] == [(0, "keep"), (1, "keep"), (2, "revert"),
                                                                      (3, "crash"), (4, "crash")]
    message = git(harness_repo, "log", "-1", "--format=%B", "tileloop/toy")
    assert f"Tileloop-Bench-Cmd: {BENCH_PRINT}" in message and f"Tileloop-Test-Cmd: {TEST_CMD}" in message
    assert "Tileloop-Timing: harness" in message and "Tileloop-Bench-Repeats: 2" in message
    assert git(harness_repo, "status", "--porcelain") == ""  # the harness left nothing behind
    perf = (harness_repo / init["perf_results"]).read_text()
    assert "bench command" in perf and "harness_ms" in perf
    code, out = call(capsys, ["report"])
    assert code == 0 and "op=sumsq shape=[256] dtype=int64" in (harness_repo / out["report"]).read_text()


@pytest.mark.slow
def test_unattended_run_with_junitxml_records(harness_repo, capsys, clean_env, tmp_path_factory):
    faster = tmp_path_factory.mktemp("inject") / "faster.py"
    faster.write_text(KERNEL.replace("DELAY_S = 0.04", "DELAY_S = 0.02"))
    clean_env.setenv("TILELOOP_TEST_INJECT", f"1:{faster}")
    code, out = call(capsys, ["run", TARGET, "--device", "cpu", "--branch", "tileloop/toy-run", "--test-cmd", TEST_CMD,
                              "--bench-cmd", BENCH_JUNIT, "--bench-repeats", "2", "--max-iters", "1"])
    assert code == 0, out
    assert [(r["iteration"], r["status"]) for r in out["records"]] == [(0, "keep"), (1, "keep")]
    shapes = out["records"][1]["backends"]["harness"]["shapes"]
    assert [s["record"]["name"] for s in shapes] == ["checks.test_perf::test_perf_property[64]",
                                                     "checks.test_perf::test_perf_property[256]"]
    assert out["records"][1]["speedup"] > 1.4
    assert out["stop"] == {"state": "stop", "reason": "reached 1 iterations", "timing": "harness"}
    state = json.loads((harness_repo / "sandbox" / "toy-run" / "state.json").read_text())
    assert state["harness"]["bench_cmd"] == BENCH_JUNIT and state["mode"] == "run"


@pytest.mark.slow
def test_a_bench_without_records_fails_init_cleanly(harness_repo, capsys):
    refs = git(harness_repo, "for-each-ref", "--format=%(refname)")
    bench = f"{PY} -c \"print('warming up'); print({{'op': 'sumsq'}})\""
    code, out = call(capsys, ["init", TARGET, "--device", "cpu", "--test-cmd", TEST_CMD, "--bench-cmd", bench])
    assert code == 2 and "no parsable record" in out["error"] and "warming up" in out["error"]
    assert git(harness_repo, "for-each-ref", "--format=%(refname)") == refs
    assert git(harness_repo, "rev-parse", "--abbrev-ref", "HEAD").strip() in ("master", "main")


@pytest.mark.parametrize("extra, match", [
    (["--test-cmd", "true"], "go together"),
    (["--test-cmd", "true", "--bench-cmd", "true", "--archs", "sm_90"], "--archs does not apply"),
    (["--test-cmd", "true", "--bench-cmd", "true", "--target-backend", "ptx"], "--target-backend does not apply"),
    (["--test-cmd", "true", "--bench-cmd", "true", "--bench-repeats", "1"], "--bench-repeats"),
])
def test_option_errors_touch_nothing(harness_repo, capsys, extra, match):
    refs = git(harness_repo, "for-each-ref", "--format=%(refname) %(objectname)")
    code, out = call(capsys, ["init", TARGET, "--device", "cpu", *extra])
    assert code == 2 and re.search(match, out["error"]), out
    assert git(harness_repo, "for-each-ref", "--format=%(refname) %(objectname)") == refs
    assert not (harness_repo / "sandbox").exists()


@pytest.mark.parametrize("live_harness, given, refused", [
    (True, [], False),        # the run's own commands, read from its state (TileGym on an H100: refused before)
    (True, ["--test-cmd", "t", "--bench-cmd", "b"], False),
    (False, ["--test-cmd", "t", "--bench-cmd", "b"], True),  # a spec run is not continued as a harness run
    (False, [], False),
])
def test_run_continues_a_run_in_progress_without_repeating_its_commands(monkeypatch, tmp_path, live_harness, given,
                                                                        refused):
    from types import SimpleNamespace

    from loop.cli import lifecycle
    from loop.cli.lifecycle import _run_in_progress, add_run

    live = SimpleNamespace(run_id="r", target=TARGET, device="cuda", target_backend="harness" if live_harness else "ptx",
                           harness=object() if live_harness else None)
    monkeypatch.setattr(lifecycle.gitops, "find_root", lambda cwd: tmp_path)
    monkeypatch.setattr(lifecycle, "resolve_target", lambda target, root: (None, target))
    monkeypatch.setattr(lifecycle, "in_progress", lambda root, target: live)
    monkeypatch.setattr(lifecycle, "describe", lambda run: run.run_id)
    parser = argparse.ArgumentParser()
    add_run(parser.add_subparsers().add_parser("run"))
    args = parser.parse_args(["run", TARGET, *given])
    if refused:
        with pytest.raises(UserError, match="another --test-cmd"):
            _run_in_progress(args)
    else:
        assert _run_in_progress(args) is live
