"""The external harness against a stand-in for TileGym's own pytest suite, laid out as a TileGym
checkout is (`src/<package>/ops/cutile/<op>.py`, `tests/` a package with `conftest.py`,
`common.py`, `config.py` and `ops/test_<op>.py`), its records in exactly the form TileGym's perf
tests leave them:

- `test_perf` calls `record_property("benchmark", result)`, where `result` is what TileGym's
  `common.benchmark_framework(framework, fn)` returns: `{framework: {"forward": stats}}`, the
  stats of `benchmark_fn_cupti` (`mean`, `std`, `rel_std`, `median`, `min`, `max`, `nrep`,
  `peak_mem_mb`, `kernel_name`, `kernel_times`: a list of per-kernel dicts), in milliseconds;
- pytest writes a property's `str()` into the junitxml file only: nothing is printed (TileGym's
  conftest registers `--print-record`, but no code reads it);
- test ids come from TileGym's `ids=` lambda and `pytest_make_parametrize_id` hook
  (`test_perf[cutile-static_persistent-4096-1024-float16]`), the reference framework
  (`pytorch`) is timed by the same test function.

The toy op sleeps `DELAY_S` per call, so a faster candidate is really faster; no latency here is
written down. TileGym itself cannot be collected on a machine without a GPU (its conftest asks
torch for the device's compute capability while adding options, and `import tilegym` queries the
GPU), and its tests are not on PyPI, so this stand-in is what runs here. TileGym's real op modules
(the `tilegym` fixture: the PyPI wheel) are checked for what the worked example in docs/harness.md
does to them: the cuTile candidates it applies are offered.
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
from loop.measure.bench_records import parse_printed
from loop.measure.external import ExternalHarnessError, Harness
from loop.records import gitops

PY = shlex.quote(sys.executable)
TARGET = "src/gymlike/ops/cutile/toy_norm.py"
OP = '''\
"""A toy row norm standing in for a cuTile op module; DELAY_S stands for what a launch costs."""
import time

DELAY_S = 0.03


def toy_norm(rows, mode=None):
    time.sleep(DELAY_S)
    return [[v / max(abs(x) for x in row) for v in row] for row in rows]
'''
CONFTEST = '''\
import pytest


def pytest_addoption(parser):
    parser.addoption("--print-record", action="store_true", default=False,
                     help="Print record_property content in tests")  # registered, read by nothing


def pytest_make_parametrize_id(config, val, argname):
    if isinstance(val, (int, float, str, bool, type(None))):
        return str(val).replace("-", "_")
    return repr(val).replace("-", "_")
'''
COMMON = '''\
import math
import statistics
import time

import pytest

from .config import SEED


class PyTestCase:
    @pytest.fixture(autouse=True)
    def setup_test(self, request):
        self.request = request


def _stats(times_ms, kernel):
    mean = statistics.fmean(times_ms)
    std = statistics.stdev(times_ms) if len(times_ms) > 1 else math.nan
    return {"mean": mean, "std": std, "rel_std": std / mean * 100 if mean > 0 else 0,
            "median": statistics.median(times_ms), "min": min(times_ms), "max": max(times_ms),
            "nrep": len(times_ms), "peak_mem_mb": 0, "kernel_name": kernel,
            "kernel_times": [{"name": kernel, "self_time_us": mean * 1e3, "total_time_us": mean * 1e3, "count": 1}]}


def benchmark(fn, rep=3):
    fn()
    times = []
    for _ in range(rep):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"forward": _stats(times, "toy_norm_kernel(float*, float*, int)")}


def benchmark_framework(framework_name, framework_fn, **benchmark_kwargs):
    return {framework_name: benchmark(framework_fn, **benchmark_kwargs)}
'''
TEST_OP = '''\
import random

import pytest

from gymlike.ops.cutile import toy_norm as op

from .. import common


class Test_ToyNorm(common.PyTestCase):
    @staticmethod
    def reference(rows):
        return [[v / max(abs(x) for x in row) for v in row] for row in rows]

    @pytest.mark.parametrize("m, n", [(3, 5), (4, 17)])
    def test_op(self, m, n):
        rows = [[random.uniform(-2, 2) for _ in range(n)] for _ in range(m)]
        got, want = op.toy_norm(rows), self.reference(rows)
        assert all(abs(a - b) < 1e-9 for ra, rb in zip(got, want) for a, b in zip(ra, rb))

    @pytest.mark.parametrize("m,n,dtype", [(4096, 1024, "float16")],
                             ids=lambda x: x.__name__ if hasattr(x, "__name__") else str(x))
    @pytest.mark.parametrize("mode", ["static_persistent", "multi_wave_reload"])
    @pytest.mark.parametrize("framework", ["cutile", "pytorch"])
    def test_perf(self, m, n, dtype, mode, framework, record_property):
        rows = [[1.0, -2.0, 3.0]]
        if framework == "pytorch":
            fn = lambda: self.reference(rows)
        else:
            fn = lambda: op.toy_norm(rows, mode=mode)
        result = common.benchmark_framework(framework, fn)
        record_property("benchmark", result)
'''
TEST_CMD = f"PYTHONPATH=src {PY} -m pytest -q tests/ops/test_toy_norm.py -k test_op"
BENCH_CMD = (f"PYTHONPATH=src {PY} -m pytest -q tests/ops/test_toy_norm.py -k 'test_perf and cutile' "
             "-o junit_family=xunit1 --junitxml={junitxml}")


@pytest.fixture
def gym_repo(tmp_path, clean_env):
    """A TileGym-like checkout: the op in a src/ layout, its pytest suite, committed; the cwd."""
    clean_env.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the nested pytest runs start faster
    clean_env.delenv("PYTEST_ADDOPTS", raising=False)
    clean_env.delenv("PYTHONPATH", raising=False)
    repo = tmp_path / "gym"
    files = {TARGET: OP, "src/gymlike/__init__.py": "", "src/gymlike/ops/__init__.py": "",
             "src/gymlike/ops/cutile/__init__.py": "", "tests/__init__.py": "from . import config\n",
             "tests/config.py": "SEED = 0\n", "tests/conftest.py": CONFTEST, "tests/common.py": COMMON,
             "tests/ops/__init__.py": "", "tests/ops/test_toy_norm.py": TEST_OP,
             "pytest.ini": "[pytest]\ntestpaths = tests\n"}
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a TileGym-like checkout")
    gitops.ensure_excluded(repo, "/sandbox/")
    clean_env.chdir(repo)
    return repo


def measure(repo: Path, bench: str, incumbent: str | None, candidate: str, test: str = TEST_CMD):
    (repo / TARGET).write_text(candidate)
    return external.measure(root=repo, target=TARGET, harness=Harness(test, bench, 2),
                            workdir=repo / "sandbox" / "run" / "logs" / "iter-000", incumbent_src=incumbent,
                            candidate_src=candidate, timeout_s=120, allowed_untracked=set())


def test_a_benchmark_property_is_one_record_per_framework_and_pass_and_nan_statistics_parse():
    """str() of TileGym's result dict, as pytest writes it: repr()s of floats (a std of one sample
    is `nan`), the CUPTI kernel list; a dict nested deeper than {framework: {pass: stats}} is none."""
    stats = {"mean": 0.5, "std": float("nan"), "rel_std": float("nan"), "median": 0.4, "min": 0.4, "max": 0.6,
             "nrep": 1, "peak_mem_mb": 3, "kernel_name": "k(float*)", "kernel_times": [{"name": "k(float*)", "count": 1}]}
    line = str({"cutile": {"forward": stats, "backward": {**stats, "median": 1.2}}, "pytorch": {"forward": stats}})
    records = parse_printed(f"tests/ops/test_x.py::Test_X::test_perf[4096-1024] {line}\n"
                            f"{ {'a': {'b': {'c': {'median': 1.0}}}} }\n{ {'median': float('-inf')} }")
    assert [(r.label, r.latency_ms) for r in records] == [("backend=cutile pass=forward", 0.4),
                                                        ("backend=cutile pass=backward", 1.2),
                                                        ("backend=pytorch pass=forward", 0.4)]


def test_tilegym_benchmark_records_are_read_from_the_junitxml(gym_repo):
    results, raw = measure(gym_repo, BENCH_CMD, None, OP)
    r = results["harness"]
    assert (r.status, r.correctness) == ("ok", "PASS"), r.reason
    shapes = raw["harness"]["timing"]["shapes"]
    assert [s["record"] for s in shapes] == [
        {"name": f"tests.ops.test_toy_norm.Test_ToyNorm::test_perf[cutile-{mode}-4096-1024-float16]",
         "backend": "cutile", "pass": "forward", "property": "benchmark"}
        for mode in ("static_persistent", "multi_wave_reload")]
    assert shapes[0]["shape"] == ["name=Test_ToyNorm::test_perf[cutile-static_persistent-4096-1024-float16] "
                                  "backend=cutile pass=forward property=benchmark"]
    for s in shapes:  # each round's median of a 30 ms sleep, in ms
        assert len(s["impls"]["baseline"]["samples_ms"]) == 2 and min(s["impls"]["baseline"]["samples_ms"]) >= 30
    assert [run["imported_target"] for run in raw["harness"]["runs"]] == [True, True, True]
    assert git(gym_repo, "status", "--porcelain") == ""  # no __pycache__, no .pytest_cache, no junitxml in the tree


def test_printing_nothing_is_a_harness_error_that_names_the_junitxml(gym_repo):
    bench = f"PYTHONPATH=src {PY} -m pytest -q tests/ops/test_toy_norm.py -k 'test_perf and cutile' --print-record"
    with pytest.raises(ExternalHarnessError, match="no parsable record") as err:
        measure(gym_repo, bench, None, OP, test=f"{PY} -c pass")
    assert "--junitxml={junitxml}" in err.value.hint and "record_property" in err.value.hint


def test_commands_that_import_an_installed_copy_are_refused(gym_repo, tmp_path, clean_env):
    """Without PYTHONPATH=src the tests import whatever `gymlike` is installed: no change to the
    target would reach them, and every experiment would time the same code."""
    site = tmp_path / "site"
    (site / "gymlike" / "ops" / "cutile").mkdir(parents=True)
    for rel in ("gymlike/__init__.py", "gymlike/ops/__init__.py", "gymlike/ops/cutile/__init__.py"):
        (site / rel).write_text("")
    (site / "gymlike" / "ops" / "cutile" / "toy_norm.py").write_text(OP)
    clean_env.setenv("PYTHONPATH", str(site))
    bench = BENCH_CMD.replace("PYTHONPATH=src ", "")
    with pytest.raises(ExternalHarnessError, match=f"imported {TARGET} from this working tree") as err:
        measure(gym_repo, bench, None, OP, test=TEST_CMD.replace("PYTHONPATH=src ", ""))
    assert "PYTHONPATH=src" in err.value.hint
    results, _ = measure(gym_repo, BENCH_CMD, None, OP)  # the same suite on the tree's source is accepted
    assert results["harness"].status == "ok"


@pytest.mark.slow
def test_unattended_run_on_a_tilegym_like_checkout(gym_repo, capsys, clean_env, tmp_path_factory):
    """`tileloop run` on the op module, TileGym-style: the first experiment (halving the delay) is
    kept on every record, the second (a wrong result) fails the test command and is reverted."""
    inject = tmp_path_factory.mktemp("inject")
    (inject / "faster.py").write_text(OP.replace("DELAY_S = 0.03", "DELAY_S = 0.015"))
    (inject / "wrong.py").write_text(OP.replace("DELAY_S = 0.03", "DELAY_S = 0.015").replace("v / max", "v * max"))
    clean_env.setenv("TILELOOP_TEST_INJECT", f"1:{inject / 'faster.py'},2:{inject / 'wrong.py'}")
    code = main(["run", TARGET, "--device", "cpu", "--branch", "tileloop/gym", "--test-cmd", TEST_CMD,
                 "--bench-cmd", BENCH_CMD, "--bench-repeats", "2", "--max-iters", "2", "--no-early-stop", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert [(r["iteration"], r["status"]) for r in out["records"]] == [(0, "keep"), (1, "keep"), (2, "revert")]
    kept = out["records"][1]
    assert kept["speedup"] > 1.4 and kept["decision"]["verdict"] == "improved"
    assert {s["record"]["backend"] for s in kept["backends"]["harness"]["shapes"]} == {"cutile"}  # not pytorch
    assert out["records"][2]["decision"]["verdict"] == "incorrect"
    assert "DELAY_S = 0.015" in (gym_repo / TARGET).read_text() and "v / max" in (gym_repo / TARGET).read_text()
    assert git(gym_repo, "status", "--porcelain") == ""
    assert "harness_ms" in (gym_repo / out["perf_results"]).read_text()
    assert main(["report", "--json"]) == 0
    report = (gym_repo / json.loads(capsys.readouterr().out)["report"]).read_text()
    assert "Test_ToyNorm::test_perf[cutile-multi_wave_reload-4096-1024-float16]" in report



@pytest.mark.slow
@pytest.mark.parametrize("op, keys", [
    ("rms_norm", ["cutile-hint:_rms_norm_kernel_gather.occupancy=2", "cutile-latency:latency=4", "cutile-approx:ftz"]),
    ("softmax", ["cutile-store-no-tma:allow_tma=False", "cutile-latency:latency=4", "cutile-hint:_softmax_kernel.occupancy=8"]),
])
def test_the_recipes_of_the_worked_example_apply_to_tilegyms_op_modules(tilegym, capsys, op, keys):
    """TileGym's op modules as PyPI ships them: the cuTile candidates that docs/harness.md's worked
    example applies to them are offered (a recipe that stopped recognising them would leave a
    TileGym run nothing to try)."""
    target = tilegym / "ops" / "cutile" / f"{op}.py"
    for key in keys:
        assert main(["playbook", "apply", key.split(":")[0], str(target), "--dry-run", "--json"]) == 0
        offered = [c["key"] for c in json.loads(capsys.readouterr().out)["candidates"]]
        assert key in offered, (key, offered)
