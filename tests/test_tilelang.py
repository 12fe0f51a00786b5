"""TileLang targets (`@tilelang.jit` kernels): the language recognised by its imports, its kernels and
launches read from the source, `tileloop spec` and `check` on a target, the ahead-of-time build for
sm_90a and sm_100a (mapped from a run's sm_90 and sm_100) without a GPU, the first versions built,
the backend that times it unavailable with its reason where it cannot, and doctor's line. What needs TileLang
itself is skipped, with the reason, where it cannot be imported (`pip install -e '.[tilelang]'`)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from loop.common import kernel_source, tilelang_install
from loop.common.language import LANGUAGES, detect_language, resolve

ROOT = Path(__file__).resolve().parent.parent
FIRST_VERSIONS = [ROOT / "kernels" / op / f"{op}_tilelang.py" for op in ("vector_add", "matmul", "softmax")]
needs_tilelang = pytest.mark.skipif(not tilelang_install.status()["importable"],
                                    reason=f"tilelang: {tilelang_install.status()['reason']} (CI installs the extra)")

LAZY = '''import tilelang
import tilelang.language as T

BLOCK = 64


@tilelang.jit(out_idx=[-1])
def scale(n, block, dtype):
    @T.prim_func
    def main(x: T.Tensor((n,), dtype), y: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
            for i in T.Parallel(block):
                if bx * block + i < n:
                    y[bx * block + i] = x[bx * block + i] * 2

    return main


def run(x):
    return scale(x.numel(), BLOCK, str(x.dtype).removeprefix("torch."))(x)
'''
EAGER = '''import tilelang
import tilelang.language as T


@tilelang.jit
def add(X, Y, block: int = 128, threads: int = 128):
    N = T.const("N")
    X: T.Tensor((N,), T.float32)
    Y: T.Tensor((N,), T.float32)
    Z = T.empty((N,), T.float32)
    with T.Kernel(T.ceildiv(N, block), threads=threads) as bx:
        for i in T.Parallel(block):
            if bx * block + i < N:
                Z[bx * block + i] = X[bx * block + i] + Y[bx * block + i]
    return Z


def run(x, y):
    return add(x, y)
'''
SPEC = '''import torch

CORRECTNESS_SHAPES = [(1,), (300,)]
BENCHMARK_SHAPES = [(1 << 20,)]
DTYPES = ["float32"]
TOLERANCES = {"float32": (1e-6, 1e-6)}
OUTPUTS = ()


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    return {"x": torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)}


def reference(x):
    return x * 2


def flops(shape):
    return shape[0]


def bytes_moved(shape, dtype):
    return 2 * shape[0] * torch.empty((), dtype=dtype).element_size()
'''


def test_a_file_importing_tilelang_is_a_tilelang_target():
    assert detect_language(ast.parse("import tilelang\nimport tilelang.language as T\n")) == "tilelang"
    assert detect_language(ast.parse("from tilelang import language as T\nimport triton\n")) == "tilelang"
    assert detect_language(ast.parse("import tilelangish\n")) is None
    entry = LANGUAGES["tilelang"]
    assert entry.backends == {"cuda": ("tilelang",)} and "cpu" in entry.unsupported


@pytest.mark.parametrize("imports,decorator,kernel", [
    ("import tilelang", "@tilelang.jit", True),
    ("import tilelang as tl_", "@tl_.jit(out_idx=[-1])", True),
    ("from tilelang import jit", "@jit", True),
    ("import numba", "@numba.jit", False),
    ("import tilelang\njit = lambda f: f", "@jit", False),
])
def test_a_tilelang_kernel_is_read_through_the_imports(imports, decorator, kernel):
    tree = ast.parse(f"{imports}\n{decorator}\ndef k(n):\n    return n\n")
    assert [f.name for f in kernel_source.kernels(tree)] == (["k"] if kernel else [])
    assert list(kernel_source.tilelang_kernels(tree)) == (["k"] if kernel else [])


def test_the_prim_func_is_device_code_and_the_lazy_form_is_not_eager():
    tree = ast.parse(LAZY)
    imports = kernel_source.imported_names(tree)
    inner = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert kernel_source.is_device(inner, imports) and not kernel_source.is_kernel(inner, imports)
    assert set(kernel_source.device_functions(tree)) == {"scale"}
    assert not kernel_source.is_eager(kernel_source.tilelang_kernels(tree)["scale"], imports)
    eager = ast.parse("import tilelang\n@tilelang.jit\ndef add(x, y):\n    return x\n")
    assert kernel_source.is_eager(kernel_source.tilelang_kernels(eager)["add"], kernel_source.imported_names(eager))


def test_a_tilelang_launch_is_the_compiled_kernel_called():
    source = LAZY + '''

def bound(x):
    k = scale(x.numel(), BLOCK, "float32")
    return k(x)


def compiled_only(x):
    return scale(x.numel(), BLOCK, "float32")


@tilelang.jit
def add(x, y):
    return x


def eager(x, y):
    return add(x, y)
'''
    tree = ast.parse(source)
    found = sorted((call.lineno, name) for call, name in kernel_source.tilelang_launches(tree))
    lines = source.splitlines()
    assert [(lines[n - 1].strip(), name) for n, name in found] == [
        ('return scale(x.numel(), BLOCK, str(x.dtype).removeprefix("torch."))(x)', "scale"),
        ("return k(x)", "scale"), ("return add(x, y)", "add")]


def test_the_backend_that_times_it_says_why_it_cannot():
    from loop.backends import BACKENDS, choose, default_target
    from loop.common.errors import UserError

    backend = BACKENDS["tilelang"]
    assert backend.language == "tilelang" and backend.device == "cuda"
    gpu = backend.check({"cuda_available": True})
    assert not gpu.available and "pip install -e '.[tilelang]'" in gpu.reason
    assert backend.check({"cuda_available": True, "tilelang_importable": True}).available
    assert backend.check({"cuda_available": False, "cuda_reason": "no GPU"}).reason == "no GPU"
    with pytest.raises(UserError, match=r"runs Triton targets only \(TileLang has no CPU interpreter\)"):
        default_target("tilelang", "cpu", {})
    with pytest.raises(UserError, match="target backend tilelang is unavailable: tilelang is not installed"):
        choose("tilelang", "cuda", {"cuda_available": True}, None)


def test_doctor_says_whether_tilelang_imports_and_what_installs_it(monkeypatch):
    monkeypatch.setattr(tilelang_install, "version", lambda: None)
    assert tilelang_install.line().endswith("not installed: pip install -e '.[tilelang]'")
    monkeypatch.setattr(tilelang_install, "version", lambda: "0.1.15")
    monkeypatch.setattr(tilelang_install, "missing", lambda: ["tvm_ffi"])
    assert "tilelang 0.1.15 cannot be imported: tvm_ffi not found" in tilelang_install.line()
    monkeypatch.setattr(tilelang_install, "missing", lambda: [])
    assert tilelang_install.line().startswith("tilelang:       0.1.15, importable")
    monkeypatch.setattr(tilelang_install, "version", lambda: "0.1.16")
    assert "tested with 0.1.15" in tilelang_install.line()


def test_a_run_architecture_maps_to_the_arch_specific_target():
    from loop.worker.tilelang_build import arch_target

    assert [arch_target(c) for c in (80, 90, 100, 120)] == ["sm_80", "sm_90a", "sm_100a", "sm_120a"]
    with pytest.raises(ValueError, match="positive compute capability"):
        arch_target(0)


def test_tileloop_spec_reads_the_entry_point_of_a_tilelang_target(tmp_path, capsys):
    from loop.cli import main
    from loop.target.contract import load_kernel

    target = tmp_path / "scale_tilelang.py"
    target.write_text(LAZY)
    assert main(["spec", str(target)]) == 0
    spec = (tmp_path / "spec.py").read_text()
    assert "def make_inputs(shape, dtype, seed" in spec and "def reference(x):" in spec
    assert load_kernel(target, tmp_path, names=False).language == "tilelang"


@needs_tilelang
def test_a_tilelang_kernel_compiles_for_sm_90a_and_sm_100a_without_a_gpu(tmp_path):
    """The language's compile hook, as the compile gate's worker calls it: each kernel the entry point
    compiles is built for the explicit target, and the entry point gets its (empty) output back."""
    import torch

    from loop.common.spec import load_module
    from loop.worker.tilelang_build import tilelang_compile

    target = tmp_path / "scale_tilelang.py"
    target.write_text(LAZY)
    x = torch.randn(300)
    got = []
    for cap in (90, 100):
        rows = tilelang_compile(torch, lambda: load_module(f"scale_{cap}", target),
                                lambda m: got.append(m.run(x)), cap)
        assert [(r["kernel"], r["target"]) for r in rows] == [("scale", f"sm_{cap}a")]
        assert rows[0]["threads"] == 64 and rows[0]["cubin_bytes"] > 0
        assert [r["function"] for r in rows[0]["resources"]] == [rows[0]["symbol"]]
        assert isinstance(rows[0]["resources"][0]["registers"], int) and rows[0]["resources"][0]["registers"] > 0
    assert [(tuple(y.shape), y.dtype) for y in got] == [((300,), torch.float32)] * 2


@needs_tilelang
def test_a_kernel_tilelang_refuses_is_a_compile_error_of_that_kernel(tmp_path):
    import torch

    from loop.common.spec import load_module
    from loop.worker.tilelang_build import tilelang_compile

    target = tmp_path / "bad_tilelang.py"
    target.write_text(LAZY.replace("x[bx * block + i] * 2", "x[bx * block + i] * undefined_name"))
    with pytest.raises(Exception, match="undefined_name"):
        tilelang_compile(torch, lambda: load_module("bad", target), lambda m: m.run(torch.randn(8)), 90)


@pytest.mark.slow
@needs_tilelang
@pytest.mark.parametrize("target", FIRST_VERSIONS, ids=lambda p: p.stem)
def test_the_first_versions_compile_for_sm_90_and_sm_100(target, tmp_path, capsys):
    """`tileloop compile --json` (its worker, the compile gate; the output held to its schema) on each
    first version with its spec."""
    import json

    from loop.cli import main

    folder = tmp_path / target.parent.parent.name
    shutil.copytree(target.parent, folder)
    assert main(["compile", str(folder / target.name), "--arch", "sm_90,sm_100", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] and payload["language"] == "tilelang", payload["message"]
    assert {r["arch"] for r in payload["kernels"]} == {"sm_90", "sm_100"}
    assert all(r["ok"] and isinstance(r["registers"], int) and r["registers"] > 0 for r in payload["kernels"])
    assert payload["hazards"] == []


@pytest.mark.slow
@needs_tilelang
def test_tileloop_check_without_a_gpu_checks_the_spec_and_the_build(tmp_path):
    from loop.common.settings import load
    from loop.target.check import check

    (tmp_path / "scale_tilelang.py").write_text(LAZY)
    (tmp_path / "spec.py").write_text(SPEC)
    out = check(tmp_path / "scale_tilelang.py", device="cuda", archs=["sm_90"], settings=load(), root=tmp_path)
    assert out["ok"] and out["language"] == "tilelang", out["problems"]
    assert not out["kernel_run"] and "TileLang kernels run on a GPU only" in out["warnings"][0]["what"]
    (tmp_path / "spec.py").write_text(SPEC.replace('DTYPES = ["float32"]', 'DTYPES = ["float32", "int7"]'))
    bad = check(tmp_path / "scale_tilelang.py", device="cuda", archs=[], settings=load(), root=tmp_path)
    assert not bad["ok"] and any("int7" in p["what"] for p in bad["problems"])


@needs_tilelang
def test_the_checks_record_which_tilelang_kernels_the_entry_point_called(tmp_path, monkeypatch):
    """The worker's launch recorder knows a @tilelang.jit kernel of the target and records its call (its
    compile stood in for: without a GPU there is nothing to build for)."""
    from tilelang.jit import JITImpl
    from tilelang.jit.kernel import JITKernel

    from loop.common.spec import load_module
    from loop.worker.launches import LaunchRecorder

    def compiled(self, *args, **kwargs):
        kernel = object.__new__(JITKernel)  # a compiled kernel that runs on the CPU
        kernel.torch_function = lambda *tensors: "ran"
        return kernel

    target = tmp_path / "scale_tilelang.py"
    target.write_text(LAZY + "\n\ndef unused(x):\n    return x\n")
    module = load_module("scale_recorded", target)
    monkeypatch.setattr(JITImpl, "compile", compiled)
    recorder = LaunchRecorder(module, "tilelang")
    assert recorder.kernels == ["scale"]
    with recorder:
        assert module.run(__import__("torch").randn(3)) == "ran"
    assert recorder.launched == {"scale"} and recorder.count == 1 and recorder.called == {"run"}
    assert resolve(LANGUAGES["tilelang"].launch_hook) is JITKernel.__call__  # where the recorder watches
    assert JITKernel.__call__.__name__ == "__call__"  # put back


@pytest.mark.slow
@needs_tilelang
def test_the_eager_form_compiles_with_its_sizes_read_from_the_inputs(tmp_path):
    import torch

    from loop.common.spec import load_module
    from loop.worker.tilelang_build import tilelang_compile

    target = tmp_path / "add_tilelang.py"
    target.write_text(EAGER)
    assert [n for _, n in kernel_source.tilelang_launches(ast.parse(EAGER))] == ["add"]
    got = []
    rows = tilelang_compile(torch, lambda: load_module("eager_add", target),
                            lambda m: got.append(m.run(torch.randn(300), torch.randn(300))), 100)
    assert [(r["kernel"], r["target"], r["threads"]) for r in rows] == [("add", "sm_100a", 128)]
    assert tuple(got[0].shape) == (300,) and got[0].dtype == torch.float32


def test_without_tilelang_the_build_says_what_installs_it(monkeypatch):
    import sys

    from loop.worker.tilelang_build import tilelang_compile

    for name in ("tilelang", "tilelang.jit"):  # as where it is not installed
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(RuntimeError, match=r"TileLang cannot be imported .*: pip install -e '\.\[tilelang\]'"):
        tilelang_compile(None, None, None, 90)


def test_a_kernel_built_without_nvcc_says_its_registers_are_not_reported():
    from loop.worker.tilelang_build import rows

    row, = rows([("scale", object(), []), ("scale", object(), [])], "sm_90a")
    assert row["kernel"] == "scale" and row["target"] == "sm_90a" and row["ir"] == ["cuda"]
    assert "registers and spills not reported" in row["resources"][0]["note"] and row["shared_bytes"] == 0


def test_the_memory_bound_first_version_is_read_as_a_tilelang_target():
    """The softmax first version beside its spec: a TileLang target whose one kernel the entry point
    compiles and calls; its spec is the op's (read-only) contract."""
    from loop.target.contract import load_kernel

    target = ROOT / "kernels" / "softmax" / "softmax_tilelang.py"
    tree = ast.parse(target.read_text())
    assert detect_language(tree) == "tilelang"
    assert list(kernel_source.tilelang_kernels(tree)) == ["softmax"]
    assert [name for _, name in kernel_source.tilelang_launches(tree)] == ["softmax"]
    assert load_kernel(target, target.parent, names=False).language == "tilelang"


@pytest.mark.slow
@needs_tilelang
def test_tileloop_check_on_cpu_builds_the_softmax_first_version(tmp_path, capsys):
    """`tileloop check --device cpu --json` on the softmax first version with its spec: the spec checked on
    the CPU, the kernel built for sm_90 and sm_100, and the warning that the kernel itself did not run."""
    import json

    from loop.cli import main

    folder = tmp_path / "softmax"
    shutil.copytree(ROOT / "kernels" / "softmax", folder, ignore=shutil.ignore_patterns("cuda", "__pycache__"))
    assert main(["check", str(folder / "softmax_tilelang.py"), "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["language"] == "tilelang" and out["problems"] == [], out
    assert out["kernels"] == ["softmax"] and out["archs"] == ["sm_90", "sm_100"]
    assert "TileLang kernels run on a GPU only" in out["warnings"][0]["what"]
    assert "ahead-of-time build for sm_90, sm_100" in out["warnings"][0]["what"]
