"""CUDA C targets (a `.cu` file with `extern "C" void solve(...)`): solve's signature read, the
language recognised, the spec written from it and held to it, the build by nvcc for sm_90 and sm_100
without a GPU (skipped, with the reason, where no nvcc is found: `pip install -e '.[cuda]'`), and the
compiler named by doctor."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loop.common import cuda_c, nvcc
from loop.common.errors import UserError
from loop.common.language import language_of_file, loader_of
from loop.target import cuda_c as cuda_target

ROOT = Path(__file__).resolve().parent.parent
FIRST_VERSIONS = [ROOT / "kernels" / op / "cuda" / f"{op}_cuda.cu" for op in ("vector_add", "softmax", "rmsnorm")]
ADD = '''#include <cuda_runtime.h>
// a comment that names solve(float* nothing)
__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" void solve(const float* __restrict__ a, const float* b,
                      float* out, int n) {
    add_kernel<<<(n + 255) / 256, 256>>>(a, b, out, n);
    cudaDeviceSynchronize();
}
'''
needs_nvcc = pytest.mark.skipif(nvcc.toolchain() is None, reason=f"{nvcc.why_none()} (CI installs the extra)")


def test_solves_parameters_are_tensors_of_the_c_type_and_scalars():
    params = cuda_c.solve_signature(ADD)
    assert [(p.name, p.pointer, p.const, p.dtype, p.kind) for p in params] == [
        ("a", True, True, "float32", None), ("b", True, True, "float32", None),
        ("out", True, False, "float32", None), ("n", False, False, None, "int")]
    half = cuda_c.solve_signature('extern "C" void solve(const __half* x, __nv_bfloat16 *y, float* const z, '
                                  "int64_t rows, double eps) {}")
    assert [(p.dtype or p.kind, p.const) for p in half] == [("float16", True), ("bfloat16", False),
                                                             ("float32", False), ("int", False), ("double", False)]


@pytest.mark.parametrize("source,message", [
    ("void solve(float* x) {}", 'declares no extern "C" void solve'),
    ('extern "C" void solve(float** x) {}', "pointer to a pointer"),
    ('extern "C" void solve(my_t* x) {}', "names no tensor dtype"),
    ('extern "C" void solve(float& x) {}', "is a reference"),
    ('\n\nextern "C" void solve(float* x, int x) {}', "t.cu:3: solve names a parameter twice: x"),
])
def test_a_solve_it_cannot_read_is_one_line_naming_why(source, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        cuda_c.solve_signature(source, "t.cu")


def test_a_cu_file_is_cuda_c_when_it_declares_solve(tmp_path):
    assert language_of_file("k.cu", ADD) == "cuda"
    assert language_of_file("k.cu", ADD.replace('extern "C" ', "")) is None
    assert language_of_file("k.py", ADD) is None
    assert loader_of(tmp_path / "k.cu") is not None and loader_of(tmp_path / "k.py") is None


def test_mismatches_are_one_line_each():
    params = cuda_c.solve_signature(ADD)
    lines = cuda_c.mismatches(params, {"a": True, "b": True, "out": True, "n": True, "extra": False})
    assert lines == ["make_inputs gives a tensor for solve's parameter int n (a scalar)",
                     "make_inputs' 'extra' is no parameter of solve"]
    assert cuda_c.mismatches(params, {"a": True, "b": True, "out": True, "n": False}) == []


def test_spec_written_from_solve_matches_it_and_check_names_each_difference(tmp_path):
    target = tmp_path / "add_cuda.cu"
    target.write_text(ADD)
    spec = cuda_target.write_spec(target)
    text = spec.read_text()
    assert 'ENTRY = "solve"' in text and "OUTPUTS = ('out',)" in text and "DTYPES = [torch.float32]" in text
    compile(text, str(spec), "exec")  # the skeleton is Python
    assert cuda_target.problems(target, spec, "add_cuda.cu", "spec.py") == []
    with pytest.raises(UserError, match="exists"):
        cuda_target.write_spec(target)
    spec.write_text(text.replace('"b": torch.randn', '"bee": torch.randn').replace('"n": math.prod(shape)',
                                                                                 '"n": torch.ones(3)'))
    found = [p["what"] for p in cuda_target.problems(target, spec, "add_cuda.cu", "spec.py")]
    assert found == ["solve's parameter const float* b (a float32 tensor, input) is not among make_inputs' names",
                     "make_inputs gives a tensor for solve's parameter int n (a scalar)",
                     "make_inputs' 'bee' is no parameter of solve"]


@pytest.mark.parametrize("target", FIRST_VERSIONS, ids=lambda p: p.stem)
def test_the_first_versions_match_their_specs(target):
    assert language_of_file(target.name, target.read_text()) == "cuda"
    assert cuda_target.problems(target, target.parent / "spec.py", target.name, "spec.py") == []


def test_the_dry_call_checks_the_inputs_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    target = tmp_path / "add_cuda.cu"
    target.write_text(ADD)
    module = loader_of(target)("t", target)
    module.solve.dry = True
    x = torch.randn(8)
    module.solve(a=x, b=x, out=x, n=8)  # names, kinds and dtypes agree: nothing to say, nothing run
    with pytest.raises(TypeError, match=r"const float\* b \(a float32 tensor, input\) is given torch.float16"):
        module.solve(a=x, b=x.half(), out=x, n=8)
    with pytest.raises(TypeError, match="is not among make_inputs' names"):
        module.solve(a=x, out=x, n=8)


def test_ptxas_report_and_nvcc_errors_are_read():
    from loop.worker import cuda_build

    log = ("ptxas info    : Compiling entry function '_Z6kernelPfi' for 'sm_90'\n"
           "ptxas info    : Function properties for _Z6kernelPfi\n"
           "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem\n")
    (row,) = cuda_build.resource_usage(log)
    assert (row["kernel"], row["arch"], row["registers"], row["spills"], row["stack"], row["shared"]) == \
        ("kernel", "sm_90", 40, 4, 8, 1024)
    err = 'add_cuda.cu(4): error: identifier "c" is undefined\n      out[i] = c[i];\n'
    assert cuda_build.first_error(err, "add_cuda.cu", "kernels/add/add_cuda.cu") == \
        'kernels/add/add_cuda.cu:4: error: identifier "c" is undefined'
    assert cuda_build.gencode("sm_100a") == ["-gencode", "arch=compute_100a,code=sm_100a"]
    with pytest.raises(ValueError):
        cuda_build.gencode("compute_90")
    keys = {cuda_build.cache_key(b"src", cuda_build.flags_for(a), v, a)
            for a, v in ((["sm_90"], "V13.5"), (["sm_100"], "V13.5"), (["sm_90"], "V13.0"))}
    assert len(keys) == 3


@needs_nvcc
def test_compile_builds_a_cuda_c_target_for_sm_90_and_sm_100_without_a_gpu(tmp_path):
    """The compile gate (its worker, through the language's entry) builds the first vector_add."""
    from loop.common.settings import load
    from loop.tools.compile import compile_target

    folder = tmp_path / "vector_add"
    shutil.copytree(FIRST_VERSIONS[0].parent, folder)
    payload, text = compile_target(str(folder / "vector_add_cuda.cu"), ["sm_90", "sm_100"], load())
    assert payload["ok"] and payload["language"] == "cuda", payload["message"]
    assert {(r["arch"], r["kernel"]) for r in payload["kernels"]} == {("sm_90", "vector_add_kernel"),
                                                                      ("sm_100", "vector_add_kernel")}
    assert all(isinstance(r["registers"], int) and r["registers"] > 0 for r in payload["kernels"])
    chain = nvcc.toolchain()
    assert {tuple(b["archs"]) for b in payload["builds"]} == {("sm_90",), ("sm_100",)}
    for b in payload["builds"]:
        assert b["toolchain"]["nvcc"] == chain.path and b["toolchain"]["version"] == chain.version
        assert f"arch=compute_{b['archs'][0][3:]},code={b['archs'][0]}" in b["flags"]
    assert chain.path in text


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("target", FIRST_VERSIONS[1:], ids=lambda p: p.stem)
def test_the_first_versions_build_for_sm_90_and_sm_100(target, tmp_path):
    from loop.worker import cuda_build

    done = cuda_build.build(target, ["sm_90", "sm_100"], tmp_path)
    assert not done.cached and {k["arch"] for k in done.kernels} == {"sm_90", "sm_100"}
    again = cuda_build.build(target, ["sm_90", "sm_100"], tmp_path)
    assert again.cached and again.library == done.library and again.kernels == done.kernels


@needs_nvcc
def test_a_build_failure_is_the_compile_error_at_its_line(tmp_path):
    from loop.worker import cuda_build

    target = tmp_path / "add_cuda.cu"
    target.write_text(ADD.replace("a[i] + b[i]", "a[i] + c[i]"))
    with pytest.raises(cuda_build.BuildError, match=r"^shown/add_cuda.cu:5: error: identifier \"c\" is undefined"):
        cuda_build.build(target, ["sm_90"], tmp_path / "cache", shown="shown/add_cuda.cu")


def test_doctor_names_the_compiler_or_what_installs_one(monkeypatch):
    from loop.tools import doctor

    monkeypatch.setattr(nvcc, "find_nvcc", lambda: None)
    none = doctor.cuda_c_compiler()
    assert none["nvcc"] is None and "pip install -e '.[cuda]'" in none["reason"]
    assert "pip install -e '.[cuda]'" in doctor._nvcc_line(none)
    found = {"nvcc": "/x/nvcc", "release": "13.5", "version": "V13.5.37", "archs": ["sm_90", "sm_100"], "source": "pip"}
    assert doctor._nvcc_line(found).endswith("targets sm_90, sm_100") and "V13.5.37" in doctor._nvcc_line(found)


def test_tileloop_spec_and_check_on_a_cu_target(tmp_path, capsys):
    """`tileloop spec` writes the spec from solve; `tileloop check` (no GPU, no build) names each
    difference between the spec's inputs and solve's parameters in one line, at the spec's return."""
    pytest.importorskip("torch")
    from loop.cli import main
    from loop.common.settings import load
    from loop.target.check import check

    target = tmp_path / "add_cuda.cu"
    target.write_text(ADD)
    assert main(["spec", str(target)]) == 0 and (tmp_path / "spec.py").is_file()
    capsys.readouterr()
    spec = tmp_path / "spec.py"
    spec.write_text(spec.read_text().replace('"n": math.prod(shape)', '"count": math.prod(shape)'))
    out = check(target, device="cpu", archs=[], settings=load(), root=tmp_path)
    assert out["language"] == "cuda" and not out["ok"]
    mismatched = [p for p in out["problems"] if "solve" in p["what"]]
    assert [p["what"] for p in mismatched] == ["solve's parameter int n (a scalar) is not among make_inputs' names",
                                               "make_inputs' 'count' is no parameter of solve"]
    assert all(p["where"].startswith("spec.py:") for p in mismatched)
