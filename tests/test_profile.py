"""`tileloop profile`: ncu's CSV, the bottleneck rules, ncu's failures, and the command it runs.

No GPU here: ncu's output comes from fixtures in the format ncu 2025 writes with
`--csv --page raw --print-units base --log-file` (progress lines, a units row, quoted numbers
with thousands separators, `n/a`), and ncu itself is a stand-in script that records its argv
and plays one scenario. The end-to-end test runs the real worker under the Triton interpreter
as the stand-in's child, exactly as ncu would run it.
"""

from __future__ import annotations

import json
import re
import shlex
import stat
import sys
from pathlib import Path

import pytest

from cli_schema import problems
from conftest import REPO_ROOT, git
from loop import cli
from loop.tools import ncu, profile
from loop.measure import probe as probe_mod
from loop.common import settings as settings_mod
from loop.records.results import Record, append_record
from loop.run import state as st
from playbook.analysis import CUTILE_PRIORITY, TRITON_PRIORITY, analyze, kernel_names

FIXTURES = Path(__file__).parent / "fixtures" / "ncu"
TARGET = "kernels/vector_add/vector_add_triton.py"
# Pinned by hand: a change to the metric set must be deliberate (each name must exist on Hopper).
METRIC_NAMES = [
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
    "launch__grid_size",
    "launch__block_size",
    "launch__waves_per_multiprocessor",
    "device__attribute_multiprocessor_count",
]
GPU_PROBE = {"cuda_available": True, "triton_version": "3.6.0", "gpu": "NVIDIA H200", "capability": [9, 0],
             "nvtriton": False}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# ----------------------------------------------------------------------------- CSV parsing


def test_raw_page_fixture_parses_units_thousands_separators_and_every_launch():
    launches = ncu.parse_raw_csv(fixture("softmax_h200_raw.csv"))
    assert [(x.id, x.kernel) for x in launches] == [(0, "softmax_kernel"), (1, "softmax_kernel"), (2, "softmax_kernel")]
    first = launches[0]
    assert set(first.values) == set(METRIC_NAMES)  # every requested metric came back as a column
    assert first.values["gpu__time_duration.sum"] == 29216.0  # "29,216"
    assert first.values["launch__grid_size"] == 8192.0  # "8,192"
    assert first.values["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == 31.52
    assert first.units["gpu__time_duration.sum"] == "nsecond"
    assert first.units["launch__registers_per_thread"] == "register/thread"
    assert (first.block, first.grid, first.device, first.cc) == ("(256, 1, 1)", "(8192, 1, 1)", "0", "9.0")


def test_summary_takes_the_median_per_kernel_skips_na_and_puts_the_longest_kernel_first():
    kernels = profile.summarize(ncu.parse_raw_csv(fixture("matmul_h200_raw.csv")))
    assert [(k["kernel"], k["launches"]) for k in kernels] == [("matmul_kernel", 2), ("cast_kernel", 1)]
    mm = kernels[0]["metrics"]
    assert mm["duration_ns"] == pytest.approx((1_482_336 + 1_479_904) / 2)
    assert mm["dram_pct"] == 22.48  # the launch that read n/a is no reading, not a zero
    assert mm["registers_per_thread"] == 168
    assert kernels[0]["total_ns"] == pytest.approx(1_482_336 + 1_479_904)
    assert kernels[0]["bottleneck"]["class"] == "compute-bound"
    assert "tensor pipe 71.2% active" in kernels[0]["bottleneck"]["reasons"][0]
    assert (kernels[1]["bottleneck"]["class"], kernels[1]["bottleneck"]["cause"]) == ("latency-bound", "too-few-blocks")


def test_durations_in_any_time_unit_come_out_in_nanoseconds():
    text = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
            '"Device","CC","gpu__time_duration.sum"\n'
            '"","","","","","","","","","","","usecond"\n'
            '"0","7","python","h","k","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","1,234.5"\n')
    (launch,) = ncu.parse_raw_csv(text)
    assert launch.values["gpu__time_duration.sum"] == 1234.5
    assert launch.value("gpu__time_duration.sum") == pytest.approx(1_234_500.0)


@pytest.mark.parametrize("text, value", [("12,345", 12345.0), ("1,482,336", 1482336.0), ("0.03", 0.03),
                                         ("n/a", None), ("", None), (" 7 ", 7.0), ("nan", None)])
def test_numbers(text, value):
    assert ncu.number(text) == value


def test_output_without_a_table_is_an_error_and_an_empty_table_is_no_launch():
    with pytest.raises(ncu.CsvError, match="no CSV table"):
        ncu.parse_raw_csv(fixture("permission.log"))
    header_and_units = "\n".join(fixture("softmax_h200_raw.csv").splitlines()[5:7])
    assert ncu.parse_raw_csv(header_and_units) == []
    truncated = "\n".join(fixture("softmax_h200_raw.csv").splitlines()[5:8])[:-20]
    with pytest.raises(ncu.CsvError, match="fields"):
        ncu.parse_raw_csv(truncated)


# ----------------------------------------------------------------------------- classification


def metrics(**kw):
    base = {"compute_pct": 30.0, "memory_pct": 30.0, "dram_pct": 25.0, "achieved_occupancy_pct": 70.0,
            "theoretical_occupancy_pct": 100.0, "grid_size": 8192.0, "sm_count": 132.0, "duration_ns": 50_000.0}
    return {**base, **kw}


@pytest.mark.parametrize("m, kind, cause, phrase", [
    (metrics(compute_pct=31.5, memory_pct=89.4, dram_pct=89.0), "memory-bound", None, "memory throughput 89.4%"),
    (metrics(compute_pct=78.4, memory_pct=41.2), "compute-bound", None, "compute (SM) throughput 78.4%"),
    (metrics(compute_pct=80.0, memory_pct=62.0), "compute-bound", None, "against memory"),  # busy, 18 points apart
    (metrics(compute_pct=72.0, memory_pct=81.0), "balanced", None, "within 15 points"),
    (metrics(compute_pct=59.9, memory_pct=59.9), "latency-bound", "stalls", "neither unit is busy"),
    (metrics(grid_size=64.0), "latency-bound", "too-few-blocks", "64 blocks for 132 SMs: 68 SMs have no work"),
    (metrics(achieved_occupancy_pct=12.0, theoretical_occupancy_pct=12.5, block_limit_registers=1.0,
             block_limit_warps=8.0, block_limit_shared_mem=4.0, registers_per_thread=168.0),
     "latency-bound", "low-occupancy", "limited by registers (1 blocks/SM at 168 registers/thread)"),
    (metrics(achieved_occupancy_pct=18.0, block_limit_shared_mem=2.0, block_limit_warps=8.0),
     "latency-bound", "low-occupancy", "limited by shared mem (2 blocks/SM)"),
    (metrics(memory_pct=None), "unknown", None, "no value for memory_pct"),
])
def test_bottleneck_rules(m, kind, cause, phrase):
    b = profile.classify(m)
    assert (b.kind, b.cause) == (kind, cause)
    assert any(phrase in r for r in b.reasons), b.reasons
    assert b.evidence == {k: v for k, v in m.items() if v is not None}


def test_a_short_kernel_says_so():
    b = profile.classify(metrics(compute_pct=5.0, memory_pct=6.0, duration_ns=2_400.0))
    assert b.kind == "latency-bound"
    assert any("2.40 us" in r for r in b.reasons)


# ----------------------------------------------------------------------------- ncu's own failures


def test_permission_refusal_wins_over_no_kernels():
    issue = ncu.diagnose(fixture("permission.log"))
    assert issue.status == "ncu_permission" and "ERR_NVGPUCTRPERM" in issue.message
    assert "NVreg_RestrictProfilingToAdminUsers=0" in issue.hint


def test_no_kernel_lists_what_ncu_saw_and_unknown_metric_names_it():
    issue = ncu.diagnose(fixture("no_kernel.log"))
    assert issue.status == "no_kernel"
    assert issue.available == ("vectorized_elementwise_kernel", "triton_poi_fused_add_0")
    issue = ncu.diagnose(fixture("unknown_metric.log"))
    assert issue.status == "ncu_error" and "sm__pipe_tensor_cycles_active" in issue.message
    assert ncu.diagnose(fixture("softmax_h200_raw.csv")) is None


def test_kernel_filter_matches_cutile_symbols_and_triton_names_only():
    names = kernel_names((REPO_ROOT / "kernels/softmax/softmax_cutile.py").read_text(), "cutile")
    assert names == ["softmax_kernel"]
    pattern = ncu.kernel_regex(names).removeprefix("regex:")
    assert re.search(pattern, "softmax_kernel_K1_a2f16_a2f16_ci1024")  # cuTile: name + mangled signature
    assert re.search(pattern, "softmax_kernel")  # Triton: the function name
    assert not re.search(pattern, "vectorized_elementwise_kernel")
    assert kernel_names((REPO_ROOT / "kernels/matmul/matmul_triton.py").read_text(), "triton") == ["matmul_kernel"]
    with pytest.raises(ValueError, match="not an identifier"):
        ncu.kernel_regex(["add_kernel|.*"])


# ----------------------------------------------------------------------------- through the CLI

FAKE_NCU = '''#!{python}
"""Stand-in for ncu: answers --version, records its argv, and plays FAKE_NCU_MODE."""
import json, os, subprocess, sys

args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler")
    print("Version 2025.3.1.0 (build 36398880) (public-release)")
    sys.exit(0)
with open(os.environ["FAKE_NCU_ARGV"], "w") as fh:
    json.dump(sys.argv, fh)
log_file = args[args.index("--log-file") + 1]
text = open(os.environ["FAKE_NCU_OUTPUT"]).read()
rc = 0
if os.environ["FAKE_NCU_MODE"] == "table":  # run the application, then print its table
    rc = subprocess.call(args[args.index("-m") - 1:])
    kernel = args[args.index("-k") + 1].removeprefix("regex:^(").rstrip(")").split("|")[0]
    text = text.replace("softmax_kernel", kernel)
with open(log_file, "w") as fh:
    fh.write(text)
sys.exit(rc)
'''


@pytest.fixture
def fake_ncu(tmp_path_factory, monkeypatch):
    where = tmp_path_factory.mktemp("fake-ncu")
    exe = where / "ncu"
    exe.write_text(FAKE_NCU.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_NCU_ARGV", str(where / "argv.json"))

    def play(mode: str, output: str) -> Path:
        monkeypatch.setenv("FAKE_NCU_MODE", mode)
        monkeypatch.setenv("FAKE_NCU_OUTPUT", str(FIXTURES / output))
        return exe

    play.argv = lambda: json.loads((where / "argv.json").read_text())
    return play


@pytest.fixture
def gpu_probe(monkeypatch):
    monkeypatch.setattr(probe_mod, "probe_environment", lambda root, settings: dict(GPU_PROBE))


def run_cli(capsys, *argv) -> tuple[int, dict, str]:
    code = cli.main(["profile", TARGET, "--json", *argv])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def test_ncu_absent_is_reported_with_its_exit_code_before_anything_runs(kernel_repo, capsys, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("probed the environment although ncu is missing")

    monkeypatch.setattr(probe_mod, "probe_environment", refuse)
    code, payload, err = run_cli(capsys, "--ncu", str(kernel_repo / "no" / "ncu"))
    assert code == 3 == profile.EXIT_CODES["ncu_missing"]
    assert payload["status"] == "ncu_missing" and payload["ok"] is False
    assert "no/ncu not found" in payload["error"] and "--ncu" in payload["hint"]
    assert payload["ncu_command"] is None and payload["bottleneck"] is None
    assert err.startswith("error: ")
    monkeypatch.setenv("PATH", str(kernel_repo))  # and no ncu on PATH either
    code, payload, _ = run_cli(capsys)
    assert (code, payload.get("status")) == (3, "ncu_missing") and "ncu on PATH not found" in payload["error"], payload


def test_no_matching_kernel_says_which_filter_and_what_ncu_saw(kernel_repo, capsys, fake_ncu, gpu_probe):
    exe = fake_ncu("log", "no_kernel.log")
    code, payload, _ = run_cli(capsys, "--ncu", str(exe))
    assert code == 5 == profile.EXIT_CODES["no_kernel"]
    assert payload["status"] == "no_kernel"
    assert "regex:^(add_kernel)" in payload["error"]
    assert "ncu saw: vectorized_elementwise_kernel, triton_poi_fused_add_0" in payload["error"]
    assert "--kernel" in payload["hint"]
    assert "No kernels were profiled" in payload["ncu_output_tail"]
    assert payload["ncu_version"] == "Version 2025.3.1.0 (build 36398880) (public-release)"


def test_the_command_printed_is_the_command_that_ran(kernel_repo, capsys, fake_ncu, gpu_probe):
    exe = fake_ncu("log", "no_kernel.log")
    code, payload, _ = run_cli(capsys, "--ncu", str(exe), "--launches", "2", "--backend", "ptx")
    cmd = payload["ncu_command"]
    assert fake_ncu.argv() == cmd  # exactly what ran, as a list
    log_file = Path(cmd[cmd.index("--log-file") + 1])
    assert log_file.name == "ncu.csv"
    work = log_file.parent
    assert cmd == [
        str(exe), "--target-processes", "all", "--profile-from-start", "off", "--kernel-name-base", "function",
        "-k", "regex:^(add_kernel)", "--launch-count", "2", "--cache-control", "all", "--clock-control", "base",
        "--metrics", ",".join(METRIC_NAMES), "--csv", "--page", "raw", "--print-units", "base",
        "--log-file", str(log_file),
        sys.executable, "-m", "loop.worker", "--result", str(work / "profile.result.json"),
        "--job", str(work / "profile.job.json"),
    ]
    assert shlex.split(payload["ncu_command_line"]) == cmd
    assert payload["backend"] == "ptx" and payload["run"] is None and payload["stored"] is None


def test_permission_refusal_and_unknown_metric_exit_codes(kernel_repo, capsys, fake_ncu, gpu_probe):
    code, payload, _ = run_cli(capsys, "--ncu", str(fake_ncu("log", "permission.log")))
    assert (code, payload["status"]) == (4, "ncu_permission")
    assert "ERR_NVGPUCTRPERM" in payload["error"] and "ERR_NVGPUCTRPERM" in payload["ncu_output_tail"]
    code, payload, _ = run_cli(capsys, "--ncu", str(fake_ncu("log", "unknown_metric.log")))
    assert (code, payload["status"]) == (6, "ncu_error")
    assert "sm__pipe_tensor_cycles_active" in payload["error"]


def test_bad_input_is_a_user_error(kernel_repo, capsys, fake_ncu, gpu_probe):
    exe = str(fake_ncu("log", "no_kernel.log"))
    assert cli.main(["profile", TARGET, "--ncu", exe, "--backend", "cutile"]) == 2
    assert "does not apply to a triton target" in capsys.readouterr().err
    assert cli.main(["profile", TARGET, "--ncu", exe, "--kernel", "add_kernel;rm"]) == 2
    assert "not an identifier" in capsys.readouterr().err
    assert cli.main(["profile", TARGET, "--shape", "4096xfoo"]) == 2  # argparse's refusal: the one error contract
    assert "--shape" in capsys.readouterr().err


# ----------------------------------------------------------------------------- end to end, inside a run


def start_fake_run(root: Path) -> st.RunState:
    head = git(root, "rev-parse", "HEAD").strip()
    state = st.RunState(run_id="vector_add-test", branch="main", origin_branch="main", target=TARGET,
                        spec="kernels/vector_add/spec.py", language="triton", op="vector_add", device="cpu",
                        target_backend="interpreter", backends=["interpreter"], availability={}, base_commit=head,
                        seed=0, env={}, untracked_at_start=[], policy={}, best_commit=head, last_iteration=0)
    st.save(root, state)
    st.set_current(root, state.run_id)
    # its baseline recorded: the run's best commit is the records' to say
    append_record(st.results_path(root, state.run_id), Record(
        run=state.run_id, iteration=0, optimization="baseline", status="keep", correctness="PASS", latency_ms=None,
        target_backend="interpreter", backends={}, commit=head, parent=None))
    return state


def test_profile_inside_a_run_is_stored_and_reorders_the_playbook(kernel_repo, fake_ncu, monkeypatch):
    monkeypatch.setattr(probe_mod, "probe_environment",
                        lambda root, settings: {"cuda_available": False, "triton_version": "3.6.0"})
    state = start_fake_run(kernel_repo)
    exe = fake_ncu("table", "softmax_h200_raw.csv")
    payload, code = profile.run(TARGET, shape=[4097], dtype="float32", backend="interpreter", device="cpu",
                                ncu_path=str(exe), settings=settings_mod.load())
    assert code == 0, payload
    assert problems({"schema": cli.CLI_SCHEMA, "command": "profile", **payload}) == []  # what profile --json prints
    assert payload["status"] == "ok" and payload["correctness"] == "PASS"  # the worker really ran, as ncu's child
    assert (payload["shape"], payload["dtype"]) == ([4097], "float32")
    assert payload["kernels"][0]["kernel"] == "add_kernel" and payload["kernels"][0]["launches"] == 3
    assert payload["bottleneck"]["class"] == "memory-bound" and payload["bottleneck"]["kernel"] == "add_kernel"
    static, order = TRITON_PRIORITY["element-wise"], payload["priority"]
    promoted = ["whole-row", "block", "eviction", "store-tma", "tma", "num_stages"]
    assert order[:6] == promoted and order[-2:] == ["exp2", "sigmoid"]  # math rewrites cannot help: last
    assert sorted(order) == sorted(set(static) | set(promoted))
    middle = order[6:-2]
    assert middle == [k for k in static if k in middle]  # the rest keeps the static order
    assert order != static
    run_dir = st.run_dir(kernel_repo, state.run_id)
    assert payload["stored"] == f"sandbox/{state.run_id}/profile-0.json"
    stored = json.loads((kernel_repo / payload["stored"]).read_text())
    assert stored["schema"] == "tileloop.profile/1" and stored["ncu_command"] == fake_ncu.argv()
    job = json.loads((kernel_repo / payload["workdir"] / "profile.job.json").read_text())
    assert (job["mode"], job["shape"], job["launches"]) == ("profile", [4097], 3)
    source = (kernel_repo / TARGET).read_text()
    assert profile.stored_bottleneck(run_dir, source) == "memory-bound"
    assert profile.stored_bottleneck(run_dir, source + "\n# another version\n") is None


def test_a_wrong_kernel_is_reported_as_such_not_profiled(kernel_repo, fake_ncu, monkeypatch):
    monkeypatch.setattr(probe_mod, "probe_environment",
                        lambda root, settings: {"cuda_available": False, "triton_version": "3.6.0"})
    state = start_fake_run(kernel_repo)
    (kernel_repo / TARGET).write_text((Path(__file__).parent / "faults" / "nan_output.py").read_text())
    payload, code = profile.run(TARGET, shape=[4097], dtype="float32", backend="interpreter", device="cpu",
                                ncu_path=str(fake_ncu("table", "softmax_h200_raw.csv")), settings=settings_mod.load())
    assert code == 1 == profile.EXIT_CODES["incorrect"]
    assert (payload["status"], payload["correctness"], payload["bottleneck"]) == ("incorrect", "FAIL", None)
    assert "NaN" in payload["error"]
    assert payload["stored"] is None and "not yet stepped" in payload["context"]
    assert not list(st.run_dir(kernel_repo, state.run_id).glob("profile-*.json"))


def test_an_edit_not_yet_stepped_is_profiled_but_not_stored(kernel_repo):
    start_fake_run(kernel_repo)
    source = (kernel_repo / TARGET).read_text()
    assert profile._run_context(kernel_repo, None, TARGET, source)[:2] == ("vector_add-test", 0)
    run, iteration, note = profile._run_context(kernel_repo, None, TARGET, source + "\n# edited\n")
    assert (run, iteration) == (None, None) and "not yet stepped" in note


def test_default_point_is_the_largest_benchmark_shape_and_the_first_dtype():
    from loop.worker.failures import SpecError, load_module
    from loop.worker.jobs import profile_point
    from loop.common.spec import Spec

    torch = pytest.importorskip("torch")
    spec = Spec(torch, load_module("vector_add_spec_for_profile", REPO_ROOT / "kernels/vector_add/spec.py"))
    assert profile_point(spec, None, None) == ((1 << 28,), "float16")
    assert profile_point(spec, [4097], "float32") == ((4097,), "float32")
    with pytest.raises(SpecError, match="not one of the spec's DTYPES"):
        profile_point(spec, None, "float64")
    with pytest.raises(SpecError, match="2 dimension"):
        profile_point(spec, [64, 64], None)


# ----------------------------------------------------------------------------- the playbook's use of it


def test_priority_is_unchanged_without_a_profile_and_moves_with_one():
    src = (REPO_ROOT / "kernels/softmax/softmax_cutile.py").read_text()
    assert analyze(src).priority() == CUTILE_PRIORITY[analyze(src).kernel_class]
    latency = analyze(src, bottleneck="latency-bound").priority()
    assert latency[:4] == ["occupancy", "tileir-configs", "persistent", "block"]
    assert analyze(src, bottleneck="balanced").priority() == analyze(src).priority()
    with pytest.raises(ValueError, match="bottleneck must be one of"):
        analyze(src, bottleneck="slow")
