"""Ahead-of-time compilation (`tileloop compile`): every included target compiles for sm_90 and
sm_100 without a GPU, with registers reported per kernel; a kernel that cannot compile is a
typed compile error that names the architecture.

cuda-tile runs its pip tileiras with CUDA_HOME unset; loop.backends handles that, so these tests
leave CUDA_HOME alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loop.cli import main
from loop.target.contract import spec_dtypes as contract_spec_dtypes

REPO_ROOT = Path(__file__).resolve().parent.parent
ARCHS = ["sm_90", "sm_100"]


def _targets() -> list[str]:
    # evaluated at collection: a target added under kernels/ is picked up by the next run
    found = sorted(REPO_ROOT.glob("kernels/*/*_triton.py")) + sorted(REPO_ROOT.glob("kernels/*/*_cutile.py"))
    return [str(p.relative_to(REPO_ROOT)) for p in found]


TARGETS = _targets()
# the fast tier builds one kernel per language; the slow tier builds every other one
TIERED = [pytest.param(t, marks=() if "vector_add" in t else pytest.mark.slow) for t in TARGETS]


def spec_dtypes(spec: Path) -> list[str]:
    dtypes = contract_spec_dtypes(spec)
    assert dtypes, f"{spec} has no literal DTYPES"
    return dtypes


def compile_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["compile", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_the_glob_finds_both_languages():
    assert any(t.endswith("_triton.py") for t in TARGETS)
    assert any(t.endswith("_cutile.py") for t in TARGETS)


@pytest.mark.parametrize("target", TIERED)
def test_every_included_target_compiles_for_hopper_and_blackwell(target, env, capsys):
    env.chdir(REPO_ROOT)
    rc, out = compile_json(capsys, target, "--arch", ",".join(ARCHS))
    assert rc == 0, out.get("message")
    assert out["ok"] is True and out["status"] == "ok", out.get("message")
    assert out["target"] == target
    assert out["language"] == ("cutile" if target.endswith("_cutile.py") else "triton")
    assert out["archs"] == ARCHS
    rows = out["kernels"]
    assert rows, "no kernel rows"
    assert {r["arch"] for r in rows} == set(ARCHS)
    dtypes = spec_dtypes(REPO_ROOT / Path(target).parent / "spec.py")
    assert {(r["arch"], r["dtype"]) for r in rows} == {(a, d) for a in ARCHS for d in dtypes}
    for r in rows:
        assert r["ok"] is True, r
        assert r["kernel"], r
        assert isinstance(r["registers"], int) and r["registers"] > 0, r


# --------------------------------------------------------------------------- broken kernels

SPEC = '''
import torch

CORRECTNESS_SHAPES = [(1000,)]
BENCHMARK_SHAPES = [(1 << 20,)]
DTYPES = ["float32"]
TOLERANCES = {"float32": (1e-6, 1e-6)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device, dtype=dtype)
    return {"x": x, "out": torch.empty(shape, device=device, dtype=dtype)}


def reference(x, out):
    return x * 2


def flops(shape):
    return shape[0]


def bytes_moved(shape, dtype):
    return 8 * shape[0]
'''

TRITON_TARGET = '''
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, {ARANGE})
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def run(x, out):
    n = out.numel()
    double_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, num_warps=4)
    return out
'''

CUTILE_TARGET = '''
import cuda.tile as ct
import torch

TILE = {TILE}


@ct.kernel
def double_kernel(x, out, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    a = ct.load(x, index=(bid,), shape=(TILE,))
    ct.store(out, index=(bid,), tile=a * 2)


def run(x, out):
    n = out.numel()
    ct.launch(torch.cuda.current_stream(), (ct.cdiv(n, TILE), 1, 1), double_kernel, (x, out, TILE))
    return out
'''


def write_op(tmp_path: Path, name: str, source: str) -> Path:
    op = tmp_path / "kernels" / "double"
    op.mkdir(parents=True)
    (op / "spec.py").write_text(SPEC)
    target = op / name
    target.write_text(source)
    return target


@pytest.mark.slow
def test_the_tmp_triton_kernel_compiles_when_it_is_not_broken(tmp_path, env, capsys):
    """The negative test below differs from this one in the arange only."""
    target = write_op(tmp_path, "double_triton.py", TRITON_TARGET.replace("{ARANGE}", "BLOCK"))
    rc, out = compile_json(capsys, str(target), "--arch", "sm_90")
    assert rc == 0 and out["ok"] is True, out.get("message")
    assert [r["kernel"] for r in out["kernels"]] == ["double_kernel"]
    assert out["kernels"][0]["num_warps"] == 4


@pytest.fixture(params=["one-worker", "parallel"])
def parallel(request, monkeypatch):
    """The compile gate with one worker for everything, and with one worker per (arch, dtype) at
    once (what a machine with cores to spare does; CI has 2 cores and would run one worker)."""
    import loop.measure.compile_gate

    if request.param == "parallel":
        monkeypatch.setattr(loop.measure.compile_gate, "compile_parallelism", lambda n_jobs: n_jobs)
    return request.param


@pytest.mark.slow
@pytest.mark.parametrize("archs", [["sm_90", "sm_100"], ["sm_100", "sm_90"]], ids=["sm_90-first", "sm_100-first"])
def test_triton_compile_error_is_typed_and_names_the_arch(tmp_path, env, capsys, archs, parallel):
    target = write_op(tmp_path, "double_triton.py", TRITON_TARGET.replace("{ARANGE}", "100"))  # not a power of 2
    rc, out = compile_json(capsys, str(target), "--arch", ",".join(archs))
    assert rc == 1
    assert out["ok"] is False
    assert out["status"] == "compile_error"
    assert out["message"].startswith(f"{archs[0]} float32: ")
    assert "power of 2" in out["message"]
    rows = out["kernels"]
    assert {r["arch"] for r in rows} == set(archs)  # every arch was tried and reported
    assert all(r["ok"] is False and "power of 2" in r["error"] for r in rows)


@pytest.mark.slow
def test_parallel_compile_gate_reports_what_one_worker_reports(tmp_path, env, capsys, monkeypatch):
    import loop.measure.compile_gate

    target = write_op(tmp_path, "double_triton.py", TRITON_TARGET.replace("{ARANGE}", "BLOCK"))
    (target.parent / "spec.py").write_text(SPEC.replace('DTYPES = ["float32"]', 'DTYPES = ["float32", "float16"]'))
    rc, one = compile_json(capsys, str(target), "--arch", "sm_90,sm_100")
    spawned = []
    real = loop.measure.compile_gate.run_worker

    def counting(*args, **kwargs):
        spawned.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(loop.measure.compile_gate, "compile_parallelism", lambda n_jobs: n_jobs)
    monkeypatch.setattr(loop.measure.compile_gate, "run_worker", counting)
    rc2, par = compile_json(capsys, str(target), "--arch", "sm_90,sm_100")
    assert rc == rc2 == 0 and one["ok"] and par["ok"]
    assert [(j["archs"], j["dtypes"]) for j in spawned] == [(["sm_90"], ["float32"]), (["sm_90"], ["float16"]),
                                                             (["sm_100"], ["float32"]), (["sm_100"], ["float16"])]
    key = lambda r: (r["arch"], r["dtype"], r["kernel"], r["registers"], r["num_warps"])  # noqa: E731
    assert [key(r) for r in par["kernels"]] == [key(r) for r in one["kernels"]]
    assert [(r["arch"], r["dtype"]) for r in par["kernels"]] == [("sm_90", "float32"), ("sm_90", "float16"),
                                                                 ("sm_100", "float32"), ("sm_100", "float16")]


def test_spec_dtypes_reads_a_literal_list_only(tmp_path):
    spec = tmp_path / "spec.py"
    spec.write_text('DTYPES = ["float16", "bfloat16"]\n')
    assert contract_spec_dtypes(spec) == ["float16", "bfloat16"]
    for text in ("DTYPES = [d for d in ('float16',)]\n", 'DTYPES = ["float8"]\n', "X = 1\n", "DTYPES = [\n"):
        spec.write_text(text)
        assert contract_spec_dtypes(spec) is None, text  # the worker reads such a spec itself


@pytest.mark.slow
def test_triton_run_that_launches_nothing_fails(tmp_path, env, capsys):
    source = TRITON_TARGET.replace("{ARANGE}", "BLOCK").replace(
        "    double_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, num_warps=4)\n", "    out.copy_(x * 2)\n")
    target = write_op(tmp_path, "double_triton.py", source)
    rc, out = compile_json(capsys, str(target), "--arch", "sm_90")
    assert rc == 1 and out["ok"] is False
    assert "launched no kernel" in out["message"] and out["message"].startswith("sm_90")


@pytest.mark.slow
def test_the_tmp_cutile_kernel_compiles_when_it_is_not_broken(tmp_path, env, capsys):
    target = write_op(tmp_path, "double_cutile.py", CUTILE_TARGET.replace("{TILE}", "128"))
    rc, out = compile_json(capsys, str(target), "--arch", "sm_100")
    assert rc == 0 and out["ok"] is True, out.get("message")
    assert out["language"] == "cutile"
    assert [r["kernel"] for r in out["kernels"]] == ["double_kernel"]
    assert out["kernels"][0]["registers"] > 0


def _broken_cutile(tmp_path, capsys):
    target = write_op(tmp_path, "double_cutile.py", CUTILE_TARGET.replace("{TILE}", "100"))  # not a power of two
    return compile_json(capsys, str(target), "--arch", "sm_90,sm_100")


@pytest.mark.slow
def test_cutile_compile_error_fails_and_names_the_arch(tmp_path, env, capsys):
    rc, out = _broken_cutile(tmp_path, capsys)
    assert rc == 1
    assert out["ok"] is False
    assert out["status"] != "ok"
    assert out["message"].startswith("sm_90 float32: ")
    assert "power of two" in out["message"]
    rows = out["kernels"]
    assert {r["arch"] for r in rows} == {"sm_90", "sm_100"}
    assert all(r["ok"] is False for r in rows)


@pytest.mark.slow
def test_cutile_compile_error_is_typed_compile_error(tmp_path, env, capsys):
    rc, out = _broken_cutile(tmp_path, capsys)
    assert rc == 1
    assert out["status"] == "compile_error"


def test_an_interrupted_parallel_compile_gate_leaves_no_worker_behind(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM reaches the main thread only: the gate kills the workers its threads started."""
    import os
    import signal
    import subprocess
    import threading
    import time

    import loop.measure.compile_gate
    from loop.common.settings import Settings

    started = []
    lock = threading.Lock()

    def fake_worker(workdir, job, backend, settings, cache_dir, name="worker", procs=None, **kw):
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        procs.append(proc)
        with lock:
            started.append(proc)
            if len(started) == 2:  # Ctrl-C once both workers run (a timer raced a loaded machine)
                os.kill(os.getpid(), signal.SIGINT)
        proc.wait()
        return {"status": "ok", "compile": {"ok": True, "results": []}}

    monkeypatch.setattr(loop.measure.compile_gate, "compile_parallelism", lambda n_jobs: n_jobs)
    monkeypatch.setattr(loop.measure.compile_gate, "run_worker", fake_worker)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises, whatever ran before
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.measure.compile_gate.compile_gate(workdir=tmp_path, spec_path=tmp_path / "spec.py", target_dir=tmp_path,
                                       target=tmp_path / "t.py", language="triton", archs=["sm_90"],
                                       settings=Settings(), cache_root=tmp_path, dtypes=["float32", "float16"])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(started) == 2 and all(p.wait(timeout=10) is not None for p in started)  # killed, not left sleeping
    assert time.monotonic() - t0 < 30
