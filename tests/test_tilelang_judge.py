"""The judge times TileLang targets: the tilelang backend's availability from the probe, the kernel
process's load of a TileLang target (its kernel cache in the implementation's own folder and its
default target the device's, both set before TileLang is imported), launches recorded at the
registry's hook (a compiled kernel called, in the lazy and the eager form), and the backend's proof
(every kernel built for this device's target, compiled in this process or loaded from the
implementation's own cache). Without a GPU a kernel is compiled for sm_90a with an explicit target
(as the compile gate does); the judged measurements on a GPU are marked `gpu` and skipped without a
CUDA device or TileLang."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from loop.backends import tilelang as tilelang_backend
from loop.common import tilelang_install
from loop.common.language import LANGUAGES, resolve
from loop.worker import proof as proof_module
from loop.worker.proof import tilelang_proof

needs_tilelang = pytest.mark.skipif(not tilelang_install.status()["importable"],
                                    reason=f"tilelang: {tilelang_install.status()['reason']} (CI installs the extra)")

LAZY = '''import tilelang
import tilelang.language as T

BLOCK = 64


@tilelang.jit
def scale(n, block, dtype):
    @T.prim_func
    def main(x: T.Tensor((n,), dtype), y: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
            for i in T.Parallel(block):
                if bx * block + i < n:
                    y[bx * block + i] = x[bx * block + i] * 2

    return main


def run(x, y):
    scale(x.numel(), BLOCK, str(x.dtype).removeprefix("torch."))(x, y)
    return y
'''
# the same kernel kept compiled at the first call: the entry point never calls the @tilelang.jit function again
KEPT = LAZY.replace('''def run(x, y):
    scale(x.numel(), BLOCK, str(x.dtype).removeprefix("torch."))(x, y)
    return y
''', '''KEPT = {}


def run(x, y):
    if x.numel() not in KEPT:
        KEPT[x.numel()] = scale(x.numel(), BLOCK, str(x.dtype).removeprefix("torch."))
    KEPT[x.numel()](x, y)
    return y
''')
EAGER = '''import tilelang
import tilelang.language as T


@tilelang.jit
def twice(X, block: int = 64):
    N = T.const("N")
    X: T.Tensor((N,), T.float32)
    Y = T.empty((N,), T.float32)
    with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
        for i in T.Parallel(block):
            if bx * block + i < N:
                Y[bx * block + i] = X[bx * block + i] * 2
    return Y


def run(x):
    return twice(x)
'''
SPEC = '''import torch

CORRECTNESS_SHAPES = [(37,)]
BENCHMARK_SHAPES = [(1024,)]
DTYPES = ["float32"]
TOLERANCES = {"float32": (1e-6, 1e-6)}
OUTPUTS = ("y",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    return {"x": torch.randn(shape, generator=g, device=device), "y": torch.empty(shape, device=device)}


def reference(x, y):
    return x * 2
'''


# -- the backend's availability ---------------------------------------------------------------------

def test_tilelang_is_available_where_a_device_is_visible_and_the_probe_found_it_importable(monkeypatch):
    from loop.worker import environment

    no_device = tilelang_backend.check({"cuda_available": False, "cuda_reason": "torch is a CPU-only build"})
    assert (no_device.available, no_device.reason) == (False, "torch is a CPU-only build")
    monkeypatch.setattr(tilelang_install, "version", lambda: None)
    probe = environment.probe()
    assert (probe["tilelang_version"], probe["tilelang_importable"]) == (None, False)
    missing = tilelang_backend.check({**probe, "cuda_available": True})
    assert not missing.available and missing.reason == "not installed: pip install -e '.[tilelang]'"
    monkeypatch.setattr(tilelang_install, "version", lambda: "0.1.15")
    monkeypatch.setattr(tilelang_install, "missing", lambda: ["tvm_ffi"])
    broken = tilelang_backend.check({**environment.probe(), "cuda_available": True})
    assert not broken.available and "tvm_ffi not found" in broken.reason and "'.[tilelang]'" in broken.reason
    monkeypatch.setattr(tilelang_install, "missing", lambda: [])
    probe = environment.probe()
    assert (probe["tilelang_version"], probe["tilelang_importable"]) == ("0.1.15", True)
    assert tilelang_backend.check({**probe, "cuda_available": True}).available
    assert not tilelang_backend.check({**probe, "cuda_available": False}).available
    assert not tilelang_backend.check({"cuda_available": True}).available  # a probe that says nothing of it


def test_auto_picks_the_target_tileloop_pins_on_an_sm_90_device(monkeypatch):
    """TileLang's own `target="auto"` on a GPU asks torch for the capability and adds the arch-specific
    suffix from sm_90 on: what `target_of` pins in the kernel process, so the two never disagree."""
    pytest.importorskip("tilelang", reason=tilelang_install.status()["reason"] or "tilelang")
    import torch
    from tilelang.cuda import target as cuda_target

    from loop.worker.tilelang_build import target_of

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for cap in ((9, 0), (10, 0), (8, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        assert cuda_target._detect_torch_cuda_arch() == target_of(cap[0] * 10 + cap[1])["arch"]


# -- the kernel process ------------------------------------------------------------------------------

@pytest.fixture
def kernel_side(monkeypatch, tmp_path):
    """A kernel process's side in this process, on a device that says it is an sm_90 (nothing runs on
    it): its own cache folder under tmp_path, TileLang's environment and compile hook put back after."""
    torch = pytest.importorskip("torch")
    if not tilelang_install.status()["importable"]:
        pytest.skip(f"tilelang: {tilelang_install.status()['reason']}")
    from tilelang.jit.kernel import JITKernel

    from loop.worker import serve

    own = tmp_path / "implementations" / "candidate-0123"
    monkeypatch.setattr(serve, "own_triton_cache", lambda label, source: str(own))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for name in ("TILELANG_CACHE_DIR", "TILELANG_DEFAULT_TARGET", "TILELANG_DISABLE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(JITKernel, "_compile_and_create_adapter", JITKernel._compile_and_create_adapter)
    monkeypatch.setattr(proof_module, "TILELANG_COMPILES", [])
    (tmp_path / "spec.py").write_text(SPEC)
    (tmp_path / "scale_tilelang.py").write_text(LAZY)
    yield serve.KernelSide(None), torch, own
    for name in ("tileloop_spec", "tileloop_impl_candidate"):
        sys.modules.pop(name, None)


def _load(side, tmp_path: Path, name: str = "scale_tilelang.py") -> dict:
    from loop.worker import serve

    return serve.answer(side, {"op": "load", "spec": str(tmp_path / "spec.py"), "target_dir": str(tmp_path),
                               "device": "cuda", "backend": "tilelang",
                               "impls": [{"label": "candidate", "path": str(tmp_path / name)}]})


def test_the_kernel_process_loads_a_tilelang_target_with_its_own_cache_and_the_device_target(kernel_side, tmp_path):
    import os

    from tilelang import env

    side, torch, own = kernel_side
    loaded = _load(side, tmp_path)
    assert loaded["ok"] and loaded["labels"] == ["candidate"], loaded
    assert side.language("candidate") == "tilelang" and side.tilelang_cache == str(own / "tilelang")
    assert os.environ["TILELANG_CACHE_DIR"] == str(own / "tilelang") == env.TILELANG_CACHE_DIR  # TileLang reads it
    assert json.loads(os.environ["TILELANG_DEFAULT_TARGET"]) == {"kind": "cuda", "arch": "sm_90a"}
    assert env.get_default_target() == {"kind": "cuda", "arch": "sm_90a"}
    assert (own / "tilelang").is_dir() and type(side.modules["candidate"].scale).__name__ == "JITImpl"
    proof = side.proof({"op": "proof"})["proof"]  # nothing compiled yet: nothing proven
    assert not proof["ok"] and "no TileLang kernel compiled" in proof["detail"]


def test_without_a_cache_folder_of_its_own_tilelang_caches_nothing(kernel_side, tmp_path, monkeypatch):
    import os

    from loop.worker import serve

    side, torch, own = kernel_side
    monkeypatch.setattr(serve, "own_triton_cache", lambda label, source: "")
    assert _load(side, tmp_path)["ok"]
    assert side.tilelang_cache == "" and os.environ["TILELANG_DISABLE_CACHE"] == "1" and not own.exists()


# -- launches ----------------------------------------------------------------------------------------------

def _stand_in_compile(monkeypatch):
    """JITImpl's compile replaced by a kernel that runs on the CPU (doubles its first tensor into the
    second, or returns the double), so that the launch path is TileLang's own from the call on."""
    from tilelang.jit import JITImpl
    from tilelang.jit.kernel import JITKernel

    def compiled(self, *args, **kwargs):
        kernel = object.__new__(JITKernel)
        kernel.torch_function = lambda x, y=None: x * 2 if y is None else y.copy_(x * 2)
        return kernel

    monkeypatch.setattr(JITImpl, "compile", compiled)


@needs_tilelang
@pytest.mark.parametrize("source, calls", [(LAZY, "lazy"), (KEPT, "kept"), (EAGER, "eager")])
def test_a_launch_is_a_compiled_kernel_called_in_either_form(tmp_path, monkeypatch, source, calls):
    """The registry's hook is where a compiled kernel is called: the lazy form's `kernel(n, ...)(x, y)`, a
    kernel the entry point keeps (its @tilelang.jit function called once) and the eager form's call all
    launch there, each launch counted once and attributed to the target's @tilelang.jit function."""
    import torch
    from tilelang.jit.kernel import JITKernel

    from loop.common.spec import load_module
    from loop.worker.launches import LaunchRecorder

    assert resolve(LANGUAGES["tilelang"].launch_hook) is JITKernel.__call__
    _stand_in_compile(monkeypatch)
    module = load_module(f"launched_{calls}", _write(tmp_path, f"{calls}_tilelang.py", source))
    x = torch.randn(5)
    args = (x,) if calls == "eager" else (x, torch.empty(5))
    recorder = LaunchRecorder(module, "tilelang", host=False)
    kernel = recorder.kernels[0]
    with recorder:
        for _ in range(3):
            out = module.run(*args)
    assert torch.equal(out, x * 2)
    assert recorder.launched == {kernel} and recorder.count == 3
    assert JITKernel.__call__.__name__ == "__call__"  # put back


def _write(folder: Path, name: str, text: str) -> Path:
    (folder / name).write_text(text)
    return folder / name


@needs_tilelang
def test_a_kernel_of_another_module_is_not_the_targets_launch(tmp_path, monkeypatch):
    """A compiled kernel the target's @tilelang.jit functions do not hold (another module's) launches
    no kernel of the target: recorded as nothing of its own, counted only where it defines none."""
    import torch

    from loop.common.spec import load_module
    from loop.worker.launches import LaunchRecorder

    _stand_in_compile(monkeypatch)
    other = load_module("other_kernels", _write(tmp_path, "other.py", LAZY))
    _write(tmp_path, "borrow_tilelang.py", LAZY.replace(
        '    scale(x.numel(), BLOCK, str(x.dtype).removeprefix("torch."))(x, y)',
        '    import other_kernels\n    other_kernels.scale(x.numel(), BLOCK, "float32")(x, y)'))
    module = load_module("borrowing", tmp_path / "borrow_tilelang.py")
    sys.modules["other_kernels"] = other
    try:
        with LaunchRecorder(module, "tilelang") as recorder:
            module.run(torch.randn(4), torch.empty(4))
    finally:
        sys.modules.pop("other_kernels", None)
    assert recorder.launched == set() and recorder.count == 0 and recorder.called == {"run"}


# -- the backend's proof -----------------------------------------------------------------------------

def _row(kernel_id: int, arch: str | None = "sm_90a", cache_path: str | None = None) -> dict:
    return {"kernel": "scale", "symbol": "main", "arch": arch, "cache_path": cache_path, "id": kernel_id}


def test_the_proof_holds_for_kernels_compiled_here_or_loaded_from_its_own_cache():
    own = "/runs/cache/implementations/candidate-01/tilelang"
    compiled = [{"symbol": "main", "arch": "sm_90a", "id": 1}]
    here = tilelang_proof({"candidate": [_row(1)]}, compiled, "sm_90", own)
    assert here["ok"] and here["ran"] == "tilelang", here
    assert here["detail"] == "candidate: scale (main) for sm_90a, compiled here"
    three = tilelang_proof({"candidate": [_row(1), _row(3), _row(4)]}, compiled + [{"id": 3}, {"id": 4}], "sm_90", own)
    assert three["detail"] == "candidate: scale (main) for sm_90a, compiled here (x3)"  # one line per kind of kernel
    cached = tilelang_proof({"candidate": [_row(2, cache_path=f"{own}/4.1/linux-x86_64/kernels/ab12")]}, compiled,
                            "sm_90", own)
    assert cached["ok"] and "loaded from its own cache" in cached["detail"], cached
    on_b200 = tilelang_proof({"candidate": [_row(1, arch="sm_100a")]}, [], "sm_100", own)
    assert not on_b200["ok"]  # built for the device, but neither compiled here nor from its own cache


@pytest.mark.parametrize("rows, arch, why", [
    ([], "sm_90", "no TileLang kernel compiled"),
    ([_row(1, arch="sm_80")], "sm_90", "built for sm_80, not for this device's sm_90a"),
    ([_row(1, arch=None)], "sm_90", "built for no architecture"),
    ([_row(1)], None, "not for this device's (no CUDA device)"),
    ([_row(2, cache_path="/runs/cache/implementations/incumbent-02/tilelang/k/ab")], "sm_90",
     "neither compiled in this process nor loaded from this implementation's own cache"),
    ([_row(2, cache_path="/runs/cache/implementations/candidate-01/tilelang-other/k")], "sm_90",
     "neither compiled in this process"),
    ([_row(2)], "sm_90", "(loaded from no cache)"),
])
def test_the_proof_fails_for_any_kernel_not_built_here_for_this_device(rows, arch, why):
    own = "/runs/cache/implementations/candidate-01/tilelang"
    verdict = tilelang_proof({"candidate": rows}, [{"symbol": "main", "arch": "sm_90a", "id": 1}], arch, own)
    assert not verdict["ok"] and verdict["ran"] == "unknown" and why in verdict["detail"], verdict


def test_without_a_cache_of_its_own_only_a_kernel_compiled_here_is_proven():
    compiled = [{"symbol": "main", "arch": "sm_90a", "id": 1}]
    assert tilelang_proof({"candidate": [_row(1)]}, compiled, "sm_90", "")["ok"]
    assert not tilelang_proof({"candidate": [_row(2, cache_path="/anywhere/k")]}, compiled, "sm_90", "")["ok"]


@needs_tilelang
def test_the_proof_reads_the_kernels_the_targets_jit_functions_hold(tmp_path, monkeypatch):
    """backend_proof for "tilelang" reads each kernel from the target's @tilelang.jit functions (its
    architecture, the cache folder TileLang tagged it with) and the compiles recorded in this process."""
    import torch
    from tilelang.jit.kernel import JITKernel
    from tvm.target import Target

    from loop.common.spec import load_module
    from loop.worker.proof import backend_proof

    own = tmp_path / "own" / "tilelang"
    module = load_module("proof_target", _write(tmp_path, "scale_tilelang.py", LAZY))
    kernel = object.__new__(JITKernel)
    kernel.target = Target({"kind": "cuda", "arch": "sm_90a"})
    kernel.prim_func = None
    kernel._tilelang_cache_path = str(own / "0.1.15" / "linux-x86_64" / "kernels" / "ab12")
    module.scale._kernel_cache[((300, 64, "float32"), (), ())] = kernel
    monkeypatch.setattr(proof_module, "TILELANG_COMPILES", [])
    held = {"candidate": module, "torch_eager": torch.nn.Identity()}  # a stand-in holds no kernel
    proven = backend_proof(held, "tilelang", "sm_90", str(own))
    assert proven["ok"] and proven["detail"] == "candidate: scale (?) for sm_90a, loaded from its own cache"
    assert not backend_proof(held, "tilelang", "sm_90", str(tmp_path / "elsewhere"))["ok"]
    proof_module.TILELANG_COMPILES.append({"symbol": "main", "arch": "sm_90a", "id": id(kernel)})
    assert "compiled here" in backend_proof(held, "tilelang", "sm_90", str(tmp_path / "elsewhere"))["detail"]


@pytest.mark.slow
def test_a_kernel_compiled_in_the_kernel_process_lands_in_its_own_cache_and_is_proven(kernel_side, tmp_path,
                                                                                      monkeypatch):
    """On a device that says it is an sm_90 (no GPU: the build needs none once the target is explicit),
    the first call compiles for sm_90a into the implementation's own cache folder and the proof holds;
    a process that finds it there loads it (proven: its own cache); with another folder said to be its
    own, the same kernel is not proven."""
    from tilelang.cache import _dispatch_map

    from loop.common.spec import load_module
    from loop.worker.aot import fake_cuda

    side, torch, own = kernel_side
    assert _load(side, tmp_path)["ok"]
    with fake_cuda(torch, 90):
        side.modules["candidate"].scale(300, 64, "float32")  # the lazy form's compile (nothing launched here)
    proof = side.proof({"op": "proof"})["proof"]
    assert proof["ok"] and proof["detail"] == "candidate: scale (main) for sm_90a, compiled here", proof
    assert list((own / "tilelang").rglob("device_kernel.cu")), "the compiled kernel is kept in its own cache folder"
    monkeypatch.setattr(proof_module, "TILELANG_COMPILES", [])  # as a new process: nothing compiled in it yet
    for cache in _dispatch_map.values():  # TileLang's kernel caches in memory: empty, as in a new process
        monkeypatch.setattr(cache, "_memory_cache", {})
    again = load_module("tileloop_impl_again", tmp_path / "scale_tilelang.py")
    with fake_cuda(torch, 90):
        again.scale(300, 64, "float32")
    from loop.worker.proof import backend_proof

    reloaded = backend_proof({"candidate": again}, "tilelang", "sm_90", side.tilelang_cache)
    assert reloaded["ok"] and "loaded from its own cache" in reloaded["detail"], reloaded
    assert not backend_proof({"candidate": again}, "tilelang", "sm_90", str(tmp_path / "another"))["ok"]
    sys.modules.pop("tileloop_impl_again", None)


# -- the timing method ------------------------------------------------------------------------------------

@needs_tilelang
def test_a_tilelang_target_may_be_captured_in_a_cuda_graph():
    """TileLang's default execution backend on CUDA is tvm_ffi (the first available), which launches on
    torch's current stream (TVM-FFI reads it through torch's DLPack exchange API): the judge times
    TileLang targets as it times Triton's, never eager-only."""
    from tilelang.cuda.execution_backend import CUDA_EXECUTION_BACKENDS

    from loop.common.messages import JobImpl
    from loop.judge import choose_forms

    assert CUDA_EXECUTION_BACKENDS[0].name == "tvm_ffi"
    firsts = [JobImpl(op, str(REPO_ROOT / "kernels" / op / f"{op}_tilelang.py")) for op in ("vector_add", "softmax")]
    assert choose_forms.eager_only(firsts) == {}


# -- on a GPU: judged measurements ------------------------------------------------------------------------

def _judged_on_gpu(tmp_path: Path, op: str, dtypes: list[str], correctness: list, bench: list,
                   work: str = "work", method: str | None = None) -> dict:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    from loop import backends
    from loop.common.settings import Settings
    from loop.measure.launch import run_worker

    folder = REPO_ROOT / "kernels" / op
    target = folder / f"{op}_tilelang.py"
    for label in ("incumbent", "candidate"):
        (tmp_path / f"{label}.py").write_text(target.read_text())
    job = {"spec": str(folder / "spec.py"), "target_dir": str(folder), "target": str(target),
           "device": "cuda", "backend": "tilelang", "check": ["candidate"], "seed": 3, "bench": True,
           "impls": [{"label": "incumbent", "path": str(tmp_path / "incumbent.py")},
                     {"label": "candidate", "path": str(tmp_path / "candidate.py")}],
           "dtypes": dtypes, "correctness_shapes": correctness, "bench_shapes": bench,
           **({"method": method} if method else {})}
    raw = run_worker(tmp_path / work, job, backends.get("tilelang"), Settings(), tmp_path / "cache", name="judged")
    (tmp_path / f"{work}.json").write_text(json.dumps(raw, default=str))
    return raw


def _assert_judged(raw: dict, kernel: str) -> None:
    import torch

    from loop.worker.tilelang_build import arch_target

    assert raw["status"] == "ok", raw
    for shape in raw["timing"]["shapes"]:
        assert shape["method"] == "cuda_graph", shape["notes"]  # launched on torch's current stream: captured
        assert shape["corroboration"]["ok"], shape["corroboration"]
        for label in ("incumbent", "candidate"):
            assert shape["impls"][label]["median_ms"] > 0
    assert raw["correctness"]["launched"]["candidate"] == [kernel]
    assert raw["proof"]["ok"] and raw["proof"]["ran"] == "tilelang", raw["proof"]
    major, minor = torch.cuda.get_device_capability()
    assert f"for {arch_target(major * 10 + minor)}" in raw["proof"]["detail"], raw["proof"]


@pytest.mark.gpu
@needs_tilelang
def test_the_vector_add_first_version_is_judged_against_itself_on_the_gpu(tmp_path, env):
    raw = _judged_on_gpu(tmp_path, "vector_add", ["float32"], [[127], [4097]], [[1 << 24]])
    _assert_judged(raw, "vector_add")
    kept = list((tmp_path / "cache").rglob("implementations/*/tilelang"))
    assert sorted(p.parent.name.split("-")[0] for p in kept) == ["candidate", "incumbent"], kept  # one each
    assert all(list(p.rglob("device_kernel.cu")) for p in kept), kept
    again = _judged_on_gpu(tmp_path, "vector_add", ["float32"], [[127], [4097]], [[1 << 24]], work="again")
    _assert_judged(again, "vector_add")  # the same source's kernels, found in its own folder
    assert "loaded from its own cache" in again["proof"]["detail"], again["proof"]


@pytest.mark.gpu
@needs_tilelang
def test_the_softmax_first_version_is_judged_against_itself_on_the_gpu(tmp_path, env):
    # graphs asked for: the first version's call may take longer than the judge captures by default
    raw = _judged_on_gpu(tmp_path, "softmax", ["float16"], [[5, 17], [33, 1000]], [[4096, 4096]], method="graph")
    _assert_judged(raw, "softmax")
