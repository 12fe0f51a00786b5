"""Backends: availability from probe dicts, the default target, the worker environment each
backend gets, tileiras/CUDA_HOME handling, the backend proof (fallback detection), how a result
shows in perf_results.md, and doctor's recommendation."""

from __future__ import annotations

import json
import os
import stat
import sys
import types
from collections import defaultdict
from pathlib import Path

import pytest

from loop import backends
from loop.tools import doctor
from loop.worker import proof as worker_proof
from loop.worker.failures import load_module
from loop.backends import Availability, availability, default_target, tileiras_environment
from loop.common.errors import UserError
from loop.measure.evaluate import to_backend_result
from loop.records.results import BackendResult
from loop.measure.launch import _worker_env

REPO_ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- synthetic probes


def make_probe(*, cuda: bool = True, cap=(9, 0), nvtriton: bool = False, cutile: bool = True, tileiras: bool = True,
               triton: bool = True, cuda_reason: str | None = None, **extra) -> dict:
    probe = {
        "cuda_available": cuda,
        "cuda_reason": None if cuda else cuda_reason,
        "capability": list(cap) if cuda else None,
        "gpu": "NVIDIA test GPU" if cuda else None,
        "sm_count": 132 if cuda else None,
        "l2_mb": 50.0 if cuda else None,
        "torch_version": "2.13.0",
        "triton_version": "3.6.0" if triton else None,
        "nvtriton": nvtriton,
        "cutile_version": "1.7.0" if cutile else None,
        "tileiras": "/opt/pip/bin/tileiras" if tileiras else None,
        "tileiras_archs": ["sm_90", "sm_100"] if tileiras else [],
    }
    probe.update(extra)
    return probe


def avail(name: str, probe: dict, device: str = "cuda") -> Availability:
    return availability(backends.get(name), probe, device)


NO_GPU = make_probe(cuda=False, cuda_reason="torch is a CPU-only build")
HOPPER = make_probe(cap=(9, 0))
HOPPER_NVTRITON = make_probe(cap=(9, 0), nvtriton=True)
BLACKWELL = make_probe(cap=(10, 0))
BLACKWELL_NVTRITON = make_probe(cap=(10, 0), nvtriton=True)


# --------------------------------------------------------------------------- availability


@pytest.mark.parametrize("name", ["ptx", "tileir", "cutile"])
def test_no_gpu_makes_gpu_backends_unavailable_with_the_probe_reason(name):
    a = avail(name, NO_GPU)
    assert a == Availability(False, "torch is a CPU-only build")


@pytest.mark.parametrize("name", ["ptx", "tileir", "cutile"])
def test_no_gpu_without_a_reason_still_says_why(name):
    a = avail(name, make_probe(cuda=False, cuda_reason=None))
    assert not a.available
    assert "no CUDA device" in a.reason


def test_interpreter_is_available_without_a_gpu_on_cpu():
    assert avail("interpreter", NO_GPU, "cpu") == Availability(True)


def test_interpreter_needs_triton():
    a = avail("interpreter", make_probe(cuda=False, triton=False), "cpu")
    assert not a.available and "triton" in a.reason


def test_interpreter_is_not_a_cuda_backend():
    a = avail("interpreter", BLACKWELL_NVTRITON, "cuda")
    assert not a.available and "--device cpu" in a.reason


def test_ptx_available_on_a_gpu_and_needs_triton():
    assert avail("ptx", HOPPER) == Availability(True)
    a = avail("ptx", make_probe(triton=False))
    assert not a.available and "triton" in a.reason


def test_tileir_on_hopper_without_nvtriton_names_nvtriton():
    a = avail("tileir", HOPPER)
    assert not a.available
    assert "nvtriton" in a.reason
    assert "Blackwell" not in a.reason  # the first missing thing is nvtriton, not the GPU


def test_tileir_on_hopper_with_nvtriton_names_blackwell():
    a = avail("tileir", HOPPER_NVTRITON)
    assert not a.available
    assert "Blackwell" in a.reason and "sm_100" in a.reason
    assert "sm_90" in a.reason  # and says what this GPU is


def test_tileir_on_blackwell_without_nvtriton_names_nvtriton():
    a = avail("tileir", BLACKWELL)
    assert not a.available and "nvtriton" in a.reason


@pytest.mark.parametrize("cap", [(10, 0), (10, 3), (12, 0)])
def test_tileir_on_blackwell_with_nvtriton_is_available(cap):
    assert avail("tileir", make_probe(cap=cap, nvtriton=True)) == Availability(True)


def test_cutile_available_with_cuda_tile_and_tileiras():
    assert avail("cutile", HOPPER) == Availability(True)


def test_cutile_without_cuda_tile():
    a = avail("cutile", make_probe(cutile=False))
    assert not a.available
    assert "cuda-tile not installed" in a.reason


def test_cutile_without_tileiras():
    a = avail("cutile", make_probe(tileiras=False))
    assert not a.available
    assert "tileiras not found" in a.reason
    assert "cuda-tile not installed" not in a.reason


@pytest.mark.parametrize("name", ["ptx", "tileir", "cutile"])
@pytest.mark.parametrize("probe", [NO_GPU, BLACKWELL_NVTRITON], ids=["no-gpu", "blackwell"])
def test_device_cpu_makes_gpu_backends_unavailable(name, probe):
    assert avail(name, probe, "cpu") == Availability(False, "--device cpu")


def test_for_language_lists_the_backends_reported_on():
    names = lambda lang, dev: [b.name for b in backends.for_language(lang, dev)]  # noqa: E731
    assert names("triton", "cuda") == ["ptx", "tileir"]
    assert names("cutile", "cuda") == ["cutile"]
    assert names("triton", "cpu") == ["interpreter", "ptx", "tileir"]


# --------------------------------------------------------------------------- default target


def test_default_target_triton_prefers_tileir_when_available():
    assert default_target("triton", "cuda", {"ptx": Availability(True), "tileir": Availability(True)}) == "tileir"


def test_default_target_triton_falls_back_to_ptx():
    assert default_target("triton", "cuda", {"ptx": Availability(True), "tileir": Availability(False, "x")}) == "ptx"
    assert default_target("triton", "cuda", {"ptx": Availability(True)}) == "ptx"


def test_default_target_from_a_probe():
    for probe, expected in ((HOPPER_NVTRITON, "ptx"), (BLACKWELL, "ptx"), (BLACKWELL_NVTRITON, "tileir")):
        av = {b.name: availability(b, probe, "cuda") for b in backends.for_language("triton", "cuda")}
        assert default_target("triton", "cuda", av) == expected


def test_default_target_cutile_is_cutile():
    assert default_target("cutile", "cuda", {"cutile": Availability(True)}) == "cutile"


def test_default_target_on_cpu_is_the_interpreter():
    assert default_target("triton", "cpu", {"tileir": Availability(True)}) == "interpreter"


def test_default_target_cutile_on_cpu_is_a_user_error():
    with pytest.raises(UserError, match="cuTile"):
        default_target("cutile", "cpu", {})


def test_get_unknown_backend_lists_valid_names():
    with pytest.raises(UserError) as info:
        backends.get("cuda")
    msg = info.value.message
    assert "'cuda'" in msg
    for name in ("ptx", "tileir", "cutile", "interpreter"):
        assert name in msg


def test_get_known_backends():
    assert {n: backends.get(n).device for n in ("ptx", "tileir", "cutile", "interpreter")} == {
        "ptx": "cuda", "tileir": "cuda", "cutile": "cuda", "interpreter": "cpu"}
    assert backends.get("interpreter").timing_label == "interpreter"
    assert backends.get("ptx").timing_label == "gpu"


# --------------------------------------------------------------------------- worker environment


@pytest.fixture
def inherited(monkeypatch):
    """An orchestrator environment that has TRITON_INTERPRET and ENABLE_TILE set already."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("ENABLE_TILE", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    return monkeypatch


def test_worker_env_ptx(inherited, tmp_path):
    env = _worker_env(backends.get("ptx"), tmp_path / "cache")
    assert env["ENABLE_TILE"] == "0"
    assert "TRITON_INTERPRET" not in env
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache")


def test_worker_env_tileir(inherited, tmp_path):
    inherited.setenv("ENABLE_TILE", "0")
    env = _worker_env(backends.get("tileir"), tmp_path / "cache")
    assert env["ENABLE_TILE"] == "1"
    assert "TRITON_INTERPRET" not in env
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache")


def test_worker_env_interpreter(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("ENABLE_TILE", "1")
    env = _worker_env(backends.get("interpreter"), tmp_path / "c")
    assert env["TRITON_INTERPRET"] == "1"
    assert env["ENABLE_TILE"] == "0"
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "c")


def test_worker_env_cutile_drops_interpret(inherited, tmp_path):
    env = _worker_env(backends.get("cutile"), tmp_path / "c")
    assert "TRITON_INTERPRET" not in env
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "c")


def test_autotune_choices_are_kept_in_the_runs_cache_unless_the_user_says_otherwise(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    assert _worker_env(backends.get("ptx"), tmp_path)["TRITON_CACHE_AUTOTUNING"] == "1"
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "0")
    assert _worker_env(backends.get("ptx"), tmp_path)["TRITON_CACHE_AUTOTUNING"] == "0"


def test_only_the_interpreter_sets_triton_interpret(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for name in ("ptx", "tileir", "cutile", "interpreter"):
        env = _worker_env(backends.get(name), tmp_path)
        assert ("TRITON_INTERPRET" in env) == (name == "interpreter"), name


def test_worker_env_makes_loop_importable(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", "/extra")
    env = _worker_env(None, tmp_path)
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == str(REPO_ROOT) and "/extra" in parts
    assert env["TRITON_CACHE_DIR"] == str(tmp_path)


# --------------------------------------------------------------------------- tileiras and CUDA_HOME


def fake_tileiras(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "tileiras"
    exe.write_text("#!/bin/sh\necho 'fake tileiras'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def test_cuda_home_dropped_when_tileiras_is_not_under_it(tmp_path):
    exe = fake_tileiras(tmp_path / "venv" / "bin")
    (tmp_path / "cuda-12.4").mkdir()
    env = {"CUDA_HOME": str(tmp_path / "cuda-12.4"), "CUDA_PATH": str(tmp_path / "cuda-12.4"),
           "PATH": str(exe.parent)}
    notes = tileiras_environment(env)
    assert "CUDA_HOME" not in env and "CUDA_PATH" not in env
    assert len(notes) == 1 and str(exe) in notes[0] and "cuda-12.4" in notes[0]
    assert env["PATH"] == str(exe.parent)


def test_cuda_path_alone_is_dropped_too(tmp_path):
    exe = fake_tileiras(tmp_path / "venv" / "bin")
    env = {"CUDA_PATH": str(tmp_path / "cuda"), "PATH": str(exe.parent)}
    tileiras_environment(env)
    assert "CUDA_PATH" not in env


def test_cuda_home_kept_when_tileiras_is_under_it(tmp_path):
    home = tmp_path / "cuda-13.1"
    exe = fake_tileiras(home / "bin")
    env = {"CUDA_HOME": str(home), "PATH": f"{exe.parent}{os.pathsep}/usr/bin"}
    assert tileiras_environment(env) == []
    assert env["CUDA_HOME"] == str(home)


def test_cuda_home_kept_when_tileiras_is_under_it_through_a_symlink(tmp_path):
    real = tmp_path / "cuda-13.1"
    fake_tileiras(real / "bin")
    link = tmp_path / "cuda"
    link.symlink_to(real)
    env = {"CUDA_HOME": str(link), "PATH": str(link / "bin")}
    assert tileiras_environment(env) == []
    assert env["CUDA_HOME"] == str(link)


def test_cuda_home_kept_when_no_tileiras_on_path(tmp_path):
    (tmp_path / "empty").mkdir()
    env = {"CUDA_HOME": str(tmp_path / "cuda"), "PATH": str(tmp_path / "empty")}
    assert tileiras_environment(env) == []
    assert env["CUDA_HOME"] == str(tmp_path / "cuda")


def test_cuda_home_that_is_only_a_string_prefix_of_tileiras_is_dropped(tmp_path):
    exe = fake_tileiras(tmp_path / "cuda-13" / "bin")
    (tmp_path / "cuda").mkdir()
    env = {"CUDA_HOME": str(tmp_path / "cuda"), "PATH": str(exe.parent)}
    tileiras_environment(env)
    assert "CUDA_HOME" not in env


def test_worker_env_for_cutile_drops_a_foreign_cuda_home(monkeypatch, tmp_path):
    exe = fake_tileiras(tmp_path / "venv" / "bin")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "old-cuda"))
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert "CUDA_HOME" not in _worker_env(backends.get("cutile"), tmp_path)
    # Triton backends do not run tileiras: their environment keeps CUDA_HOME
    assert _worker_env(backends.get("ptx"), tmp_path)["CUDA_HOME"] == str(tmp_path / "old-cuda")


# --------------------------------------------------------------------------- perf_results cells


def test_cell_unavailable_shows_the_reason():
    r = BackendResult("tileir", False, "unavailable", "nvtriton not installed")
    assert r.cell == "unavailable: nvtriton not installed"


def test_cell_ok_is_a_six_decimal_number():
    r = BackendResult("ptx", True, "ok", "", latency_ms=0.0123456789)
    assert r.cell == "0.012346"
    assert BackendResult("ptx", True, "ok", "", latency_ms=2.0).cell == "2.000000"


@pytest.mark.parametrize("status", ["fallback", "compile_error", "runtime_error", "timeout", "oom", "incorrect"])
def test_cell_is_not_a_number_unless_ok(status):
    r = BackendResult("tileir", True, status, "why", latency_ms=0.5)
    assert r.cell == status
    with pytest.raises(ValueError):
        float(r.cell)


def test_cell_not_run():
    assert BackendResult("ptx", True, "not_run", "target backend tileir failed (fallback)").cell == \
        "not run: target backend tileir failed (fallback)"


# --------------------------------------------------------------------------- backend proof


class FakeTarget:
    """Like triton.backends.compiler.GPUTarget."""

    def __init__(self, backend: str, arch: int = 100):
        self.backend, self.arch, self.warp_size = backend, arch, 32

    def __repr__(self):
        return f"GPUTarget(backend={self.backend!r}, arch={self.arch}, warp_size=32)"


class FakeCompiledKernel:
    def __init__(self, backend: str, asm_kinds):
        self.metadata = types.SimpleNamespace(target=FakeTarget(backend), num_warps=4)
        self.asm = {k: "" for k in asm_kinds}


class FakeJITFunction:
    """Triton 3.6: device_caches[device] = (kernel_cache, kernel_key_cache, target, backend, binder)."""

    def __init__(self, kernels, fn_name="add_kernel"):
        self.fn = lambda *a: None  # a JITFunction's .fn is the Python function
        self.device_caches = defaultdict(lambda: ({}, {}, None, None, None))
        if kernels:
            cache = {f"key{i}": k for i, k in enumerate(kernels)}
            self.device_caches[0] = (cache, {}, FakeTarget(kernels[0].metadata.target.backend), object(), lambda *a: None)
        self.__name__ = fn_name


class FakeAutotuner:
    def __init__(self, jit):
        self.fn = jit


def fake_module(**attrs) -> types.ModuleType:
    m = types.ModuleType("tileloop_impl_candidate")
    m.BLOCK = 128
    m.run = lambda **kw: None
    m.tl = types  # an unrelated module attribute
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


PTX_IR = ("source", "ttir", "ttgir", "llir", "ptx", "cubin")
TILE_IR = ("source", "ttir", "tileir", "cubin")


def test_proof_detects_a_silent_fallback_to_ptx():
    mod = fake_module(add_kernel=FakeJITFunction([FakeCompiledKernel("cuda", PTX_IR)]))
    proof = worker_proof.backend_proof({"candidate": mod}, "tileir")
    assert proof["ok"] is False
    assert proof["ran"] == "ptx"
    assert proof["detail"].startswith("FALLBACK to PTX")
    assert "cuda" in proof["detail"]


def test_proof_ok_for_ptx_compiled_for_cuda():
    mod = fake_module(add_kernel=FakeJITFunction([FakeCompiledKernel("cuda", PTX_IR)]))
    proof = worker_proof.backend_proof({"candidate": mod, "incumbent": mod}, "ptx")
    assert proof["ok"] is True and proof["ran"] == "ptx"
    assert "FALLBACK" not in proof["detail"]


def test_proof_ok_for_tileir():
    mod = fake_module(add_kernel=FakeJITFunction([FakeCompiledKernel("tileir", TILE_IR)]))
    proof = worker_proof.backend_proof({"candidate": mod}, "tileir")
    assert proof["ok"] is True and proof["ran"] == "tileir"


def test_proof_recognises_tile_ir_by_its_ir_kinds_too():
    # a cuda target whose compile produced a Tile IR stage still ran through Tile IR
    mod = fake_module(add_kernel=FakeJITFunction([FakeCompiledKernel("cuda", TILE_IR)]))
    assert worker_proof.backend_proof({"candidate": mod}, "tileir") == {
        "ran": "tileir", "ok": True, "detail": f"targets=['cuda'] ir={sorted(TILE_IR)}"}


def test_proof_mixed_caches_count_as_tileir_only_if_any_kernel_went_through_tile():
    # one module on tile IR, the other through PTX: the run is not purely PTX
    tile = fake_module(add_kernel=FakeJITFunction([FakeCompiledKernel("tileir", TILE_IR)]))
    ptx = fake_module(add_kernel=FakeJITFunction([FakeCompiledKernel("cuda", PTX_IR)]))
    assert worker_proof.backend_proof({"candidate": tile, "incumbent": ptx}, "ptx")["ok"] is False


def test_proof_tileir_when_ptx_was_asked_is_not_ok():
    mod = fake_module(add_kernel=FakeJITFunction([FakeCompiledKernel("tileir", TILE_IR)]))
    proof = worker_proof.backend_proof({"candidate": mod}, "ptx")
    assert proof["ok"] is False and proof["ran"] == "tileir"


def test_proof_looks_through_autotuner_wrappers():
    jit = FakeJITFunction([FakeCompiledKernel("cuda", PTX_IR)])
    mod = fake_module(add_kernel=FakeAutotuner(FakeAutotuner(jit)))
    proof = worker_proof.backend_proof({"candidate": mod}, "tileir")
    assert proof["ok"] is False and proof["detail"].startswith("FALLBACK")


def test_proof_without_compiled_kernels_is_not_ok():
    mod = fake_module(add_kernel=FakeJITFunction([]))
    proof = worker_proof.backend_proof({"candidate": mod}, "tileir")
    assert proof["ok"] is False and proof["ran"] == "unknown"
    assert "no compiled kernels" in proof["detail"]


def test_proof_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert worker_proof.backend_proof({}, "interpreter")["ok"] is True
    monkeypatch.delenv("TRITON_INTERPRET")
    assert worker_proof.backend_proof({}, "interpreter")["ok"] is False


def test_proof_cutile(monkeypatch):
    monkeypatch.setattr(worker_proof, "CUTILE_COMPILES", [])
    assert worker_proof.backend_proof({}, "cutile")["ok"] is False
    monkeypatch.setattr(worker_proof, "CUTILE_COMPILES", [{"kernel": "add_kernel", "cubin_bytes": 4096, "occupancy": 2, "num_ctas": None}])
    proof = worker_proof.backend_proof({}, "cutile")
    assert proof["ok"] is True and proof["ran"] == "cutile" and "add_kernel" in proof["detail"]
    monkeypatch.setattr(worker_proof, "CUTILE_COMPILES", [{"kernel": "add_kernel", "cubin_bytes": 0}])
    assert worker_proof.backend_proof({}, "cutile")["ok"] is False


@pytest.mark.slow
def test_proof_on_real_triton_jit_caches(monkeypatch):
    """The fakes above mimic Triton 3.6; check the proof against a real JITFunction compiled
    ahead of time for sm_90 (a 'cuda' target): asked for tileir, it must report the fallback."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from loop.worker import aot

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    modules = {}

    def load_target():
        return load_module("tileloop_test_proof_va", REPO_ROOT / "kernels" / "vector_add" / "vector_add_triton.py")

    def call_run(module):
        modules["candidate"] = module
        x = torch.randn(1000)
        module.run(x=x, y=x.clone(), out=torch.empty_like(x))

    try:
        compiled = aot._triton_compile(torch, load_target, call_run, 90)
    finally:
        sys.modules.pop("tileloop_test_proof_va", None)
    assert compiled and "cubin" in compiled[0]["ir"]
    proof = worker_proof.backend_proof(modules, "tileir")
    assert proof["ok"] is False and proof["ran"] == "ptx"
    assert proof["detail"].startswith("FALLBACK to PTX") and "'cuda'" in proof["detail"]
    assert worker_proof.backend_proof(modules, "ptx")["ok"] is True


# --------------------------------------------------------------------------- to_backend_result


def worker_result(proof: dict | None, median_ms=(0.5, 2.0)) -> dict:
    shapes = []
    for i, med in enumerate(median_ms):
        shapes.append({"shape": [1 << (20 + i)], "dtype": "float16", "method": "cuda_graph", "calls_per_sample": 8,
                       "notes": [], "impls": {"candidate": {"median_ms": med, "iqr_ms": 0.01, "samples_ms": [med] * 5},
                                              "incumbent": {"median_ms": med * 2, "iqr_ms": 0.01, "samples_ms": [med * 2] * 5}}})
    raw = {"status": "ok", "correctness": {"passed": True, "checks": []}, "timing": {"dtype": "float16", "shapes": shapes}}
    if proof is not None:
        raw["proof"] = proof
    return raw


def test_failed_proof_becomes_fallback(tmp_path):
    proof = {"ran": "ptx", "ok": False, "detail": "FALLBACK to PTX: targets=['cuda'] ir=['ptx']"}
    r = to_backend_result("tileir", worker_result(proof), "candidate", tmp_path / "sandbox" / "iter-001", tmp_path)
    assert r.status == "fallback"
    assert r.available is True
    assert r.latency_ms is None
    assert "FALLBACK" in r.reason
    assert r.proof == proof
    assert r.cell == "fallback"
    with pytest.raises(ValueError):
        float(r.cell)
    assert r.worker_dir == os.path.join("sandbox", "iter-001")


def test_passing_proof_gives_a_latency(tmp_path):
    proof = {"ran": "tileir", "ok": True, "detail": "targets=['tileir']"}
    r = to_backend_result("tileir", worker_result(proof), "candidate", tmp_path / "w", tmp_path)
    assert r.status == "ok"
    assert r.latency_ms == pytest.approx(1.0)  # geometric mean of 0.5 and 2.0
    assert r.incumbent_ms == pytest.approx(2.0)
    assert r.correctness == "PASS"
    assert r.cell == "1.000000"


def test_worker_failure_is_its_status(tmp_path):
    raw = {"status": "compile_error", "message": "CompilationError: boom"}
    r = to_backend_result("ptx", raw, "candidate", tmp_path / "w", tmp_path)
    assert r.status == "compile_error" and r.correctness == "FAIL" and r.cell == "compile_error"


# --------------------------------------------------------------------------- doctor


def test_doctor_report_availability_no_gpu():
    rep = doctor.report(NO_GPU)
    assert set(rep["backends"]) == {"ptx", "tileir", "cutile", "interpreter", "nvcc", "tilelang"}
    for name in ("ptx", "tileir", "cutile", "nvcc", "tilelang"):
        assert rep["backends"][name] == {"available": False, "reason": "torch is a CPU-only build"}
    assert rep["backends"]["interpreter"]["available"] is True


def test_recommend_no_gpu():
    rec = doctor.report(NO_GPU)["recommendation"]
    assert rec.startswith("no GPU") and "--device cpu" in rec
    assert "tileloop compile" in rec  # tileiras is here: ahead-of-time compilation still works
    rec = doctor.report(make_probe(cuda=False, tileiras=False))["recommendation"]
    assert rec.startswith("no GPU") and "tileloop compile" not in rec


def test_recommend_hopper_without_nvtriton():
    rep = doctor.report(HOPPER)
    rec = rep["recommendation"]
    assert "sm_90" in rec and "ptx" in rec and "Blackwell" in rec
    assert "cuTile targets run on cutile" in rec
    assert rep["backends"]["tileir"]["available"] is False and "nvtriton" in rep["backends"]["tileir"]["reason"]
    assert rep["backends"]["ptx"]["available"] is True


def test_recommend_hopper_without_cutile_says_why():
    rec = doctor.report(make_probe(cap=(9, 0), cutile=False))["recommendation"]
    assert "cuTile unavailable" in rec and "cuda-tile not installed" in rec


def test_recommend_blackwell_without_nvtriton():
    rec = doctor.report(BLACKWELL)["recommendation"]
    assert "Blackwell" in rec and "nvtriton" in rec and "install" in rec
    assert "ptx" in rec


def test_recommend_blackwell_with_nvtriton():
    rec = doctor.report(make_probe(cap=(10, 0), nvtriton=True, triton_active_target="tileir"))["recommendation"]
    assert "Tile IR through nvtriton is available" in rec
    rec = doctor.report(make_probe(cap=(10, 0), nvtriton=True, triton_active_target="cuda"))["recommendation"]
    assert "ENABLE_TILE=1" in rec


def test_doctor_render_has_a_row_per_backend():
    text = doctor.render(doctor.report(HOPPER))
    for name in ("ptx", "tileir", "cutile", "interpreter"):
        assert f"| {name} |" in text
    assert "recommendation:" in text and "sm_90" in text


@pytest.mark.slow
def test_doctor_cli_on_this_machine(capsys, monkeypatch):
    """The real probe (in a worker subprocess) through `tileloop doctor --json`."""
    from loop.cli import main

    for name in ("TILELOOP_WORKER_TIMEOUT", "TILELOOP_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    assert main(["doctor", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "tileloop.cli/1" and out["command"] == "doctor"
    assert set(out["backends"]) == {"ptx", "tileir", "cutile", "interpreter", "nvcc", "tilelang"}
    probe = out["probe"]
    if not probe["cuda_available"]:
        assert probe["cuda_reason"]
        for name in ("ptx", "tileir", "cutile"):
            assert out["backends"][name] == {"available": False, "reason": probe["cuda_reason"]}
        assert out["recommendation"].startswith("no GPU")
    assert out["backends"]["interpreter"]["available"] is bool(probe["triton_version"])
    # the interpreter ran a loop to a runtime bound here (numpy < 2.4 is a runtime dependency)
    assert out["checks"][0]["name"].startswith("Triton interpreter") and out["checks"][0]["ok"] is True, out["checks"]


def test_doctor_names_the_known_bad_triton_numpy_pair_and_its_fix():
    from loop.tools import doctor

    bad = {**make_probe(cuda=False, cuda_reason="torch is a CPU-only build"), "numpy_version": "2.4.1"}
    (check,) = doctor.known_bad(bad)
    assert check["ok"] is False and check["fix"] == "pip install 'numpy<2.4'" and "numpy 2.4.1" in check["name"]
    assert doctor.known_bad({**bad, "numpy_version": "2.3.5"}) == []
    assert doctor.known_bad({**bad, "triton_version": "3.7.0"}) == []  # the pair is Triton 3.6's
    rep = doctor.report(bad, {"ok": False, "error": "InterpreterError: TypeError('only 0-dimensional arrays')"})
    assert [c["ok"] for c in rep["checks"]] == [False, False]
    assert rep["checks"][0]["fix"] == "pip install 'numpy<2.4'"
    assert rep["recommendation"].startswith("fix first:") and "numpy<2.4" in rep["recommendation"]
    assert "FAILED: Triton interpreter" in doctor.render(rep)
    on_a_gpu = doctor.report({**HOPPER, "numpy_version": "2.4.1"}, {"ok": False, "error": "InterpreterError"})
    assert on_a_gpu["recommendation"].startswith("sm_90") and "for --device cpu, fix first" in on_a_gpu["recommendation"]
