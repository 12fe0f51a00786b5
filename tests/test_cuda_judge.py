"""The judge times CUDA C targets: the nvcc backend's availability from the probe, the kernel process's
load of a `.cu` through its language's registry entry (built for the device's architecture at load,
its launches recorded through the language's launch hook), the backend's proof (a library built for
this device and called), and the timing method each form of solve gets (the synchronising form
eagerly, with the reason; the stream form in CUDA graphs). On the CPU a host-only library built by g++
stands in for nvcc's (as in tests/test_cuda_loader.py); the judged measurements on a GPU are marked
`gpu` and skipped without a CUDA device or an nvcc."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from loop.backends import nvcc as nvcc_backend
from loop.common import cuda_c, nvcc
from loop.common.messages import JobImpl, JudgeJob
from loop.common.timing import GRAPH_BELOW_MS, TimingPlan
from loop.judge import choose_forms
from loop.judge.bench import Bench, choose_method

SYNCHRONISING = '''#include <cuda_runtime.h>
__global__ void add_kernel(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}
extern "C" void solve(const float* x, const float* y, float* out, int n) {
    add_kernel<<<(n + 255) / 256, 256>>>(x, y, out, n);
    cudaDeviceSynchronize();
}
'''
STREAM = '''#include <cuda_runtime.h>
__global__ void add_kernel(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}
extern "C" void solve(const float* x, const float* y, float* out, int n, cudaStream_t stream) {
    add_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, y, out, n);
}
'''
# what solve computes, on host memory: the library g++ builds for the CPU's share of the tests
HOST = '''extern "C" void solve(const float* x, const float* y, float* out, int n) {
    for (int i = 0; i < n; ++i) out[i] = x[i] + y[i];
}
'''
SPEC = '''import torch

ENTRY = "solve"
CORRECTNESS_SHAPES = [(37,)]
BENCHMARK_SHAPES = [(1024,)]
DTYPES = ["float32"]
TOLERANCES = {"float32": (1e-6, 1e-6)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device)
    y = torch.randn(shape, generator=g, device=device)
    return {"x": x, "y": y, "out": torch.empty(shape, device=device), "n": shape[0]}


def reference(x, y, out, n):
    return x + y
'''
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build a host-only library")


def _host_library(tmp_path: Path) -> Path:
    src = tmp_path / "host.cpp"
    src.write_text(HOST)
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(tmp_path / "host.so"), str(src)], check=True)
    return tmp_path / "host.so"


def _built(library: Path, arch: str = "sm_90"):
    from loop.worker import cuda_build

    return cuda_build.Build(library, [arch], {"nvcc": "g++ stand-in"}, [], f"key-{arch}", False)


# -- the backend's availability ---------------------------------------------------------------------

def test_nvcc_is_available_where_a_device_is_visible_and_the_probe_found_an_nvcc(monkeypatch):
    from loop.worker import cuda_build

    no_device = nvcc_backend.check({"cuda_available": False, "cuda_reason": "torch is a CPU-only build"})
    assert (no_device.available, no_device.reason) == (False, "torch is a CPU-only build")
    monkeypatch.setattr(nvcc, "toolchain", lambda: None)
    without = nvcc_backend.check({"cuda_available": True, **cuda_build.fingerprint([9, 0])})
    assert not without.available and without.reason == nvcc.why_none()
    assert "pip install -e '.[cuda]'" in without.reason  # what installs one
    found = nvcc.Toolchain("/x/nvcc", "13.0", "V13.0.88", ("sm_90", "sm_100"), "PATH")
    monkeypatch.setattr(nvcc, "toolchain", lambda: found)
    probe = {"cuda_available": True, **cuda_build.fingerprint([9, 0])}
    assert probe["nvcc_release"] == "13.0" and nvcc_backend.check(probe).available
    assert not nvcc_backend.check({**probe, "cuda_available": False}).available


# -- the kernel process ------------------------------------------------------------------------------

@pytest.fixture
def kernel_side(monkeypatch, tmp_path):
    """A kernel process's side in this process: its own Triton cache and the folder it imports from
    left as they are (both are process-wide)."""
    torch = pytest.importorskip("torch")
    from loop.worker import serve

    monkeypatch.setattr(serve, "own_triton_cache", lambda label, source: "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "spec.py").write_text(SPEC)
    (tmp_path / "add_cuda.cu").write_text(SYNCHRONISING)
    yield serve.KernelSide(None), torch
    for name in ("tileloop_spec", "tileloop_impl_candidate"):
        sys.modules.pop(name, None)


def _load(side, tmp_path: Path, device: str) -> dict:
    from loop.worker import serve

    return serve.answer(side, {"op": "load", "spec": str(tmp_path / "spec.py"), "target_dir": str(tmp_path),
                               "device": device, "backend": "nvcc",
                               "impls": [{"label": "candidate", "path": str(tmp_path / "add_cuda.cu")}]})


@needs_gxx
def test_the_kernel_process_loads_a_cu_target_through_its_language_and_records_solve(kernel_side, tmp_path):
    from loop.common.language import get_language
    from loop.worker import cuda_build

    side, torch = kernel_side
    assert _load(side, tmp_path, "cpu") == {"ok": True, "labels": ["candidate"], "marks": side.marks}
    module = side.modules["candidate"]
    assert get_language("cuda").load == "loop.worker.cuda_build:load_target"
    assert isinstance(module.solve, cuda_build._Solve) and module.SIGNATURE == cuda_c.solve_signature(SYNCHRONISING)
    assert module.FORM == cuda_c.SYNCHRONISING and side.language("candidate") == "cuda"
    assert module.solve.built is None  # no device here: nothing built at load
    module.solve.attach(_built(_host_library(tmp_path)), "cpu")
    inputs = {"x": torch.randn(37), "y": torch.randn(37), "out": torch.zeros(37), "n": 37}
    assert side.record({"op": "record", "label": "candidate", "on": True}) == {}
    side.spec.entry(module)(**inputs)
    assert side.record({"op": "record", "label": "candidate", "on": False}) == {"launched": ["solve"], "called": []}
    assert torch.equal(inputs["out"], inputs["x"] + inputs["y"]) and module.solve.calls == 1
    proof = side.proof({"op": "proof"})["proof"]
    assert not proof["ok"] and "not for this device's (no CUDA device)" in proof["detail"]


@needs_gxx
def test_on_a_device_the_kernel_process_builds_for_its_architecture_at_load(kernel_side, tmp_path, monkeypatch):
    from loop.worker import cuda_build

    side, torch = kernel_side
    asked = []

    def build(path, archs, cache_root=None, shown=None):
        asked.append((Path(path).name, archs, shown))
        return _built(_host_library(tmp_path), archs[0])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    monkeypatch.setattr(cuda_build, "build", build)
    assert _load(side, tmp_path, "cuda")["ok"]
    assert asked == [("add_cuda.cu", ["sm_100"], "add_cuda.cu")]
    assert side.modules["candidate"].solve.built.archs == ["sm_100"]
    sys.modules.pop("tileloop_impl_candidate", None)

    def refused(path, archs, cache_root=None, shown=None):
        raise cuda_build.BuildError("add_cuda.cu:7: error: identifier \"blockIdx\" is undefined")

    monkeypatch.setattr(cuda_build, "build", refused)
    failure = _load(side, tmp_path, "cuda")["failure"]  # nvcc's refusal is the candidate's compile error
    assert (failure["status"], failure["label"]) == ("compile_error", "candidate")
    assert "add_cuda.cu:7: error" in failure["message"]


# -- the backend's proof -----------------------------------------------------------------------------

@needs_gxx
def test_the_proof_holds_for_a_library_built_for_this_device_and_called(tmp_path):
    torch = pytest.importorskip("torch")
    from loop.worker import cuda_build
    from loop.worker.proof import backend_proof

    (tmp_path / "add_cuda.cu").write_text(SYNCHRONISING)
    library = _host_library(tmp_path)
    module = cuda_build.load_target("tileloop_impl_candidate", tmp_path / "add_cuda.cu")
    modules = {"candidate": module}
    none = backend_proof(modules, "nvcc", "sm_90")
    assert not none["ok"] and "candidate: no library built" in none["detail"]
    module.solve.attach(_built(library), "cpu")
    never = backend_proof(modules, "nvcc", "sm_90")
    assert not never["ok"] and "candidate: solve was never called" in never["detail"]
    module.solve(x=torch.ones(4), y=torch.ones(4), out=torch.zeros(4), n=4)
    proof = backend_proof(modules, "nvcc", "sm_90")
    assert proof["ok"] and proof["ran"] == "nvcc", proof
    assert "host.so for sm_90 key=key-sm_90" in proof["detail"] and "calls=1" in proof["detail"]
    other = backend_proof(modules, "nvcc", "sm_100")
    assert not other["ok"] and "built for sm_90, not for this device's sm_100" in other["detail"]
    library.unlink()
    gone = backend_proof(modules, "nvcc", "sm_90")
    assert not gone["ok"] and "the library" in gone["detail"] and "is gone" in gone["detail"]
    assert not backend_proof({}, "nvcc", "sm_90")["ok"]  # nothing of CUDA C loaded


# -- the timing method ---------------------------------------------------------------------------------

def _impls(tmp_path: Path, **sources: str) -> tuple[JobImpl, ...]:
    out = []
    for label, source in sources.items():
        path = tmp_path / (f"{label}.py" if source.startswith("import") else f"{label}.cu")
        path.write_text(source)
        out.append(JobImpl(label, str(path)))
    return tuple(out)


def test_a_synchronising_solve_is_timed_eagerly_and_a_stream_form_may_be_captured(tmp_path):
    broken = STREAM.replace("256, 0, stream>>>(x, y, out, n);", "256, 0, stream>>>(x, y, out, n);\n"
                                                                "    cudaDeviceSynchronize();")
    impls = _impls(tmp_path, incumbent=STREAM, candidate=SYNCHRONISING, stream=STREAM, broken=broken,
                   triton="import triton\n")
    why = cuda_c.TIMING[cuda_c.SYNCHRONISING]
    assert choose_forms.eager_only(impls) == {"candidate": why, "broken": why}  # a broken stream form: called as is
    assert choose_forms.eager_only(impls[:1] + impls[2:3] + impls[4:]) == {}
    calls, pair = {"incumbent": 0.05, "candidate": 0.05}, ("incumbent", "candidate")
    graphs = choose_method(calls, list(calls), pair, True, 4, 8, None, {})
    assert graphs.graphs and graphs.calls > 1  # both stream forms: CUDA graphs, as any other language
    eager = choose_method(calls, list(calls), pair, True, 4, 8, None, {"candidate": why})
    assert (eager.graphs, eager.calls, eager.forced) == (False, 1, False)
    assert eager.why == f"{why} (candidate)" and eager.why.startswith("timed eagerly: solve synchronises")
    asked = choose_method(calls, list(calls), pair, True, 4, 8, "graph", {"candidate": why})
    assert not asked.graphs and asked.forced and "method graph" in asked.why and "not tried" in asked.why
    eager_asked = choose_method(calls, list(calls), pair, True, 4, 8, "eager", {})
    assert eager_asked.why == "timed eagerly: asked for (method eager)"


class _Kernel:
    """A kernel process that answers every request and remembers what it was asked."""

    def __init__(self):
        self.asked: list[dict] = []

    def request(self, message: dict, label: str) -> dict:
        self.asked.append(message)
        return {"ok": True, "captured": True}

    def send(self, message: dict, label: str) -> None:
        self.asked.append(message)

    def answer(self, message: dict, label: str) -> dict:
        return {"ok": True, "captured": True}


class _Auditor:
    def timed_as(self, method: str, calls: int, used: int, captured) -> None:
        self.method, self.calls, self.used = method, calls, used


@pytest.mark.parametrize("form, source", [("synchronising", SYNCHRONISING), ("stream", STREAM)])
def test_the_judge_never_asks_to_capture_a_synchronising_solve(tmp_path, form, source):
    impls = _impls(tmp_path, incumbent=source, candidate=source)
    kernels = {"incumbent": _Kernel(), "candidate": _Kernel()}
    job = JudgeJob("spec.py", ".", "cuda", "nvcc", impls, ("candidate",))
    bench = Bench(None, None, None, kernels, job, ("incumbent", "candidate"))
    prepared = {lab: {"call_ms": GRAPH_BELOW_MS / 10} for lab in kernels}
    auditor = _Auditor()
    method, calls, notes = bench.method(prepared, 4, 8, TimingPlan(), auditor)
    ops = [m["op"] for m in kernels["candidate"].asked]
    if form == "synchronising":
        assert (method, calls, ops) == ("cuda_events_l2_flush", 1, ["eager"])
        assert notes == [f"{cuda_c.TIMING[cuda_c.SYNCHRONISING]} (candidate, incumbent)"]
        assert (auditor.method, auditor.used) == ("cuda_events_l2_flush", 4)
    else:
        assert method == "cuda_graph" and ops == ["capture"] and calls > 1


# -- on a GPU: judged measurements ------------------------------------------------------------------------

OP = REPO_ROOT / "kernels" / "vector_add" / "cuda"
# does the work once per input set, in the untimed calls (the checks, the warm-up), and returns at once when
# called again on memory it has seen: the timed calls rotate over sets it has already computed
MEMOISED = '''#include <cuda_runtime.h>
__global__ void vector_add_kernel(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}
static const void* seen[4096][3];
static int nseen = 0;
extern "C" void solve(const float* x, const float* y, float* out, int n) {
    for (int k = 0; k < nseen; ++k)
        if (seen[k][0] == x && seen[k][1] == y && seen[k][2] == out) return;
    vector_add_kernel<<<(n + 255) / 256, 256>>>(x, y, out, n);
    cudaDeviceSynchronize();
    if (nseen < 4096) { seen[nseen][0] = x; seen[nseen][1] = y; seen[nseen][2] = out; ++nseen; }
}
'''
needs_nvcc = pytest.mark.skipif(nvcc.toolchain() is None, reason=nvcc.why_none())


def _judged_on_gpu(tmp_path: Path, candidate: str, incumbent: str | None = None) -> dict:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    from loop import backends
    from loop.common.settings import Settings
    from loop.measure.launch import run_worker

    (tmp_path / "incumbent.cu").write_text(incumbent or (OP / "vector_add_cuda.cu").read_text())
    (tmp_path / "candidate.cu").write_text(candidate)
    job = {"spec": str(OP / "spec.py"), "target_dir": str(OP), "target": str(OP / "vector_add_cuda.cu"),
           "device": "cuda", "backend": "nvcc", "check": ["candidate"], "seed": 3, "bench": True,
           "impls": [{"label": "incumbent", "path": str(tmp_path / "incumbent.cu")},
                     {"label": "candidate", "path": str(tmp_path / "candidate.cu")}],
           "dtypes": ["float32"], "correctness_shapes": [[127], [4097]], "bench_shapes": [[1 << 24]]}
    raw = run_worker(tmp_path, job, backends.get("nvcc"), Settings(), tmp_path / "cache", name="judged")
    (tmp_path / "raw.json").write_text(json.dumps(raw, default=str))
    return raw


@pytest.mark.gpu
@needs_nvcc
def test_a_cuda_c_target_is_judged_against_itself_on_the_gpu(tmp_path, env):
    raw = _judged_on_gpu(tmp_path, (OP / "vector_add_cuda.cu").read_text())
    assert raw["status"] == "ok", raw
    (shape,) = raw["timing"]["shapes"]
    assert shape["method"] == "cuda_events_l2_flush"  # the seed's form synchronises: eager, and said so
    assert f"{cuda_c.TIMING[cuda_c.SYNCHRONISING]} (candidate, incumbent)" in shape["notes"], shape["notes"]
    assert shape["corroboration"]["ok"], shape["corroboration"]
    for label in ("incumbent", "candidate"):
        assert shape["impls"][label]["median_ms"] > 0
    assert raw["correctness"]["launched"]["candidate"] == ["solve"]
    assert raw["proof"]["ok"] and raw["proof"]["ran"] == "nvcc", raw["proof"]
    major, minor = pytest.importorskip("torch").cuda.get_device_capability()
    assert f"for sm_{major}{minor} " in raw["proof"]["detail"]


@pytest.mark.gpu
@needs_nvcc
def test_a_cuda_c_target_that_works_only_in_untimed_calls_is_refused_on_the_gpu(tmp_path, env):
    raw = _judged_on_gpu(tmp_path, MEMOISED)
    assert raw["status"] in ("incorrect", "uncorroborated"), raw
    assert raw["failed_impl"] == "candidate"


@pytest.mark.gpu
@needs_nvcc
def test_a_stream_form_is_judged_in_cuda_graphs_on_the_gpu(tmp_path, env):
    vector_add = STREAM.replace("add_kernel", "vector_add_kernel")
    raw = _judged_on_gpu(tmp_path, vector_add, incumbent=vector_add)
    assert raw["status"] == "ok", raw
    (shape,) = raw["timing"]["shapes"]
    assert shape["method"] == "cuda_graph", shape["notes"]  # captured, as the other languages' kernels are
    assert shape["corroboration"]["ok"] and raw["proof"]["ok"], (shape["corroboration"], raw["proof"])
