"""The two forms of a CUDA C target's solve (the seed skill's, which synchronises and is timed eagerly;
the stream form, which a CUDA graph can capture) and the loader that calls solve through ctypes with
the inputs by name, exercised on the CPU: a host-only library built by g++ from the same signature,
called with torch CPU tensors through the same code the kernel process uses on the GPU."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from loop.backends import nvcc as nvcc_backend
from loop.common import cuda_c
from loop.common.errors import UserError
from loop.target import cuda_c as cuda_target

SYNCHRONISING = '''#include <cuda_runtime.h>
__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
extern "C" void solve(const float* x, float* y, int n) {
    scale_kernel<<<(n + 255) / 256, 256>>>(x, y, n);
    cudaDeviceSynchronize();
}
'''
STREAM = '''#include <cuda_runtime.h>
__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
extern "C" void solve(const float* x, float* y, int n, cudaStream_t stream) {
    scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, y, n);
}
'''
# host code only: what solve computes, on host memory (g++ builds it without CUDA)
HOST = '''#include <cstdint>
extern "C" void solve(const float* x, float* y, int n, double scale, int64_t offset) {
    for (int i = 0; i < n; ++i) y[i] = (float)(scale * x[i]) + (float)offset;
}
'''
HOST_STREAM = '''typedef struct CUstream_st* cudaStream_t;
extern "C" void solve(const float* x, float* y, int n, cudaStream_t stream) {
    for (int i = 0; i < n; ++i) y[i] = stream == 0 ? x[i] + 1.0f : -1.0f;
}
'''
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build a host-only library")


def test_the_two_forms_are_told_apart_and_say_how_they_are_timed(tmp_path):
    assert cuda_c.solve_form(SYNCHRONISING, "s.cu") == cuda_c.SYNCHRONISING
    assert cuda_c.solve_form(STREAM, "s.cu") == cuda_c.STREAM
    (stream,) = [p for p in cuda_c.solve_signature(STREAM) if p.stream]
    assert (stream.name, stream.ctype, stream.pointer) == ("stream", "cudaStream_t", False)
    assert nvcc_backend.timing(cuda_c.SYNCHRONISING).startswith("timed eagerly: solve synchronises")
    assert "captured in a CUDA graph" in nvcc_backend.timing(cuda_c.STREAM)
    for source, form in ((SYNCHRONISING, cuda_c.SYNCHRONISING), (STREAM, cuda_c.STREAM)):
        (tmp_path / "scale_cuda.cu").write_text(source)
        (tmp_path / "spec.py").unlink(missing_ok=True)
        text = " ".join(cuda_target.write_spec(tmp_path / "scale_cuda.cu").read_text().split())
        assert " ".join(f"How it is timed: {nvcc_backend.timing(form)}.".split()) in text
        assert '"stream"' not in text  # the caller passes the stream: no input of make_inputs


def test_the_target_records_its_form(tmp_path):
    from loop.worker import cuda_build

    default_stream = STREAM.replace("256, 0, stream>>>", "256>>>")  # check names it; it is called as it is
    for source, form in ((SYNCHRONISING, cuda_c.SYNCHRONISING), (STREAM, cuda_c.STREAM),
                         (default_stream, cuda_c.SYNCHRONISING)):
        (tmp_path / "scale_cuda.cu").write_text(source)
        module = cuda_build.load_target("t", tmp_path / "scale_cuda.cu")
        assert module.FORM == form and module.solve.form == form


@pytest.mark.parametrize("source,message", [
    (STREAM.replace("256, 0, stream>>>", "256>>>"),
     "s.cu:7: solve takes cudaStream_t stream but launches <<<(n + 255) / 256, 256>>> on the default stream"),
    (STREAM.replace("0, stream>>>", "0, 0>>>"), "s.cu:7: solve takes cudaStream_t stream but launches"),
    (STREAM.replace("(x, y, n);\n}", "(x, y, n);\n    cudaDeviceSynchronize();\n}"),
     "s.cu:8: solve takes cudaStream_t stream but calls cudaDeviceSynchronize, which no CUDA graph can capture"),
    (STREAM.replace("cudaStream_t stream)", "cudaStream_t stream, cudaStream_t other)"),
     "s.cu:6: solve takes 2 streams (stream, other)"),
    (STREAM.replace("cudaStream_t stream)", "cudaStream_t* stream)"),
     "s.cu:6: solve's parameter stream is a pointer to a cudaStream_t"),
])
def test_a_malformed_stream_form_is_one_line_at_its_line(source, message):
    with pytest.raises(UserError) as info:
        cuda_c.solve_form(source, "s.cu")
    assert message in info.value.message and "\n" not in info.value.message


def test_check_names_a_stream_form_that_launches_on_the_default_stream(tmp_path):
    (tmp_path / "scale_cuda.cu").write_text(STREAM)
    spec = cuda_target.write_spec(tmp_path / "scale_cuda.cu")
    assert cuda_target.problems(tmp_path / "scale_cuda.cu", spec, "scale_cuda.cu", "spec.py") == []
    (tmp_path / "scale_cuda.cu").write_text(STREAM.replace("256, 0, stream>>>", "256>>>"))
    (found,) = cuda_target.problems(tmp_path / "scale_cuda.cu", spec, "scale_cuda.cu", "spec.py")
    assert found["where"] == "scale_cuda.cu:7" and "on the default stream" in found["what"]
    assert cuda_c.mismatches(cuda_c.solve_signature(STREAM), {"x": True, "y": True, "n": False, "stream": False}) == [
        "make_inputs gives 'stream', solve's cudaStream_t: the caller passes the stream to launch on"]


def _library(tmp_path, source: str, name: str = "host.so"):
    src = tmp_path / "host.cpp"
    src.write_text(source)
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(tmp_path / name), str(src)], check=True)
    return tmp_path / name


@needs_gxx
def test_the_loader_calls_solve_with_the_inputs_by_name_and_c_type(tmp_path):
    torch = pytest.importorskip("torch")
    from loop.worker import cuda_build

    params = cuda_c.solve_signature(HOST)
    entry = cuda_build.Entry(_library(tmp_path, HOST), params, device="cpu")
    x, y = torch.randn(37), torch.zeros(37)
    entry(offset=3, y=y, scale=0.5, n=37, x=x)  # by name, in any order
    assert torch.equal(y, (0.5 * x) + 3)
    y2 = torch.zeros(37)
    entry(x=x, y=y2, n=10, scale=2, offset=-1)  # an int for a double
    assert torch.equal(y2[:10], 2 * x[:10] - 1) and (y2[10:] == 0).all()
    assert [t.__name__ for t in entry.fn.argtypes] == ["c_void_p", "c_void_p", "c_int", "c_double", "c_long"]


@needs_gxx
@pytest.mark.parametrize("change,message", [
    (lambda t, i: i.update(x=t.randn(8).half()), "x: const float* x (a float32 tensor, input) is given torch.float16"),
    (lambda t, i: i.update(n=3.5), "n: int n (a scalar) is given float 3.5, not an integer"),
    (lambda t, i: i.update(n=1 << 40), f"n: int n (a scalar) is given {1 << 40}, which a C int cannot hold"),
    (lambda t, i: i.update(scale="2"), "scale: double scale (a scalar) is given str '2', not a number"),
    (lambda t, i: i.update(n=t.ones(8)), "make_inputs gives a tensor for solve's parameter int n (a scalar)"),
    (lambda t, i: i.update(y=t.zeros(16)[::2]),
     "y: float* y (a float32 tensor) needs a contiguous tensor on cpu, got one on cpu, strided"),
    (lambda t, i: i.pop("x"),
     "solve's parameter const float* x (a float32 tensor, input) is not among make_inputs' names"),
    (lambda t, i: i.update(extra=1), "make_inputs' 'extra' is no parameter of solve"),
])
def test_the_loader_refuses_a_mismatch_in_one_line_and_calls_nothing(tmp_path, change, message):
    torch = pytest.importorskip("torch")
    from loop.worker import cuda_build

    entry = cuda_build.Entry(_library(tmp_path, HOST), cuda_c.solve_signature(HOST), device="cpu")
    y = torch.full((8,), 7.0)
    inputs = {"x": torch.randn(8), "y": y, "n": 8, "scale": 1.0, "offset": 0}
    change(torch, inputs)
    with pytest.raises(TypeError) as info:
        entry(**inputs)
    assert str(info.value) == message
    assert (y == 7.0).all()  # refused before the call


@needs_gxx
def test_the_loader_passes_the_stream_and_refuses_a_library_without_solve(tmp_path):
    torch = pytest.importorskip("torch")
    from loop.worker import cuda_build

    params = cuda_c.solve_signature(HOST_STREAM)
    entry = cuda_build.Entry(_library(tmp_path, HOST_STREAM), params, device="cpu")
    x, y = torch.randn(5), torch.zeros(5)
    entry(x=x, y=y, n=5)  # the stream is the caller's: on the CPU none (NULL)
    assert torch.equal(y, x + 1)
    other = _library(tmp_path, HOST.replace('"C" void solve', '"C" void compute'), "other.so")
    with pytest.raises(cuda_build.LoadError, match=r"^other.so exports no solve: declare it extern \"C\"$"):
        cuda_build.Entry(other, params, device="cpu")
    with pytest.raises(cuda_build.LoadError, match="^missing.so cannot be loaded: "):
        cuda_build.Entry(tmp_path / "missing.so", params, device="cpu")


def test_every_scalar_type_of_the_signature_has_a_ctypes_type():
    from loop.worker import cuda_build

    for ctype in cuda_c.SCALAR_KINDS:
        param = cuda_c.Param("v", ctype, False, False, kind=cuda_c.SCALAR_KINDS[ctype])
        assert issubclass(cuda_build.argtype(param), ctypes._SimpleCData)
    assert cuda_build._fits(255, ctypes.c_uint8) and not cuda_build._fits(256, ctypes.c_uint8)
    assert cuda_build._fits(-128, ctypes.c_int8) and not cuda_build._fits(-129, ctypes.c_int8)
    assert not cuda_build._fits(-1, ctypes.c_size_t)


def _chain(version: str):
    from loop.common import nvcc

    return nvcc.Toolchain("/opt/somewhere/bin/nvcc", version[1:5], version, ("sm_90", "sm_100"), "pip")


def test_the_fingerprint_names_nvcc_its_flags_and_the_devices_architecture(monkeypatch):
    from loop.common import nvcc
    from loop.worker import cuda_build

    monkeypatch.setattr(nvcc, "toolchain", lambda: _chain("V13.0.88"))
    on_h100 = cuda_build.fingerprint([9, 0])
    assert on_h100["nvcc_version"] == "V13.0.88" and on_h100["nvcc_release"] == "13.0"
    assert on_h100["nvcc_archs"] == ["sm_90"] and on_h100["nvcc_flags"] == cuda_build.flags_for(["sm_90"])
    assert "arch=compute_90,code=sm_90" in on_h100["nvcc_flags"]
    assert "/opt/somewhere" not in repr(on_h100)  # records keep tools by version, not by where they are installed
    assert cuda_build.fingerprint([10, 0])["nvcc_flags"] != on_h100["nvcc_flags"]
    no_gpu = cuda_build.fingerprint(None)
    assert no_gpu["nvcc_archs"] == [] and no_gpu["nvcc_flags"] == list(cuda_build.BASE_FLAGS)
    monkeypatch.setattr(nvcc, "toolchain", lambda: None)
    assert cuda_build.fingerprint([9, 0]) == {"nvcc_release": None, "nvcc_version": None, "nvcc_source": None,
                                              "nvcc_flags": None, "nvcc_archs": ["sm_90"]}


def test_the_environment_probe_carries_the_cuda_c_fingerprint(monkeypatch):
    from loop.common import nvcc
    from loop.worker import environment

    monkeypatch.setattr(nvcc, "toolchain", lambda: _chain("V13.4.92"))
    found = environment.probe()
    from loop.worker import cuda_build

    assert found["nvcc_version"] == "V13.4.92" and found["nvcc_source"] == "pip"
    assert found["nvcc_flags"] == cuda_build.fingerprint(found["capability"])["nvcc_flags"]
    cap = found["capability"]
    assert found["nvcc_archs"] == ([f"sm_{cap[0]}{cap[1]}"] if cap else [])


def test_the_build_cache_key_changes_with_source_flags_toolkit_and_architecture():
    from loop.worker import cuda_build

    base = (b"src", cuda_build.flags_for(["sm_90"]), "V13.4.92", ["sm_90"])
    variants = [
        (b"src2", *base[1:]),
        (base[0], [*base[1], "-DBLOCK=128"], *base[2:]),
        (*base[:2], "V13.0.88", base[3]),
        (*base[:3], ["sm_100"]),
    ]
    key = cuda_build.cache_key(*base)
    assert cuda_build.cache_key(*base) == key  # the same build, the same key
    assert len({key, *(cuda_build.cache_key(*v) for v in variants)}) == 1 + len(variants)


@pytest.mark.slow  # two nvcc builds: the fast tier stays under five minutes
def test_a_build_is_cached_under_its_toolkits_key(tmp_path, monkeypatch):
    """build() keys its folder by nvcc's version: another toolkit does not take the first one's library."""
    from loop.common import nvcc
    from loop.worker import cuda_build

    if nvcc.toolchain() is None:
        pytest.skip(nvcc.why_none())
    target = tmp_path / "scale_cuda.cu"
    target.write_text(SYNCHRONISING)
    real = nvcc.toolchain()
    done = cuda_build.build(target, ["sm_90"], tmp_path / "cache")
    assert done.key == cuda_build.cache_key(SYNCHRONISING.encode(), cuda_build.flags_for(["sm_90"]), real.version,
                                            ["sm_90"])
    assert cuda_build.build(target, ["sm_90"], tmp_path / "cache").cached
    monkeypatch.setattr(nvcc, "toolchain", lambda: nvcc.Toolchain(real.path, real.release, real.version + "-other",
                                                                  real.archs, real.source))
    again = cuda_build.build(target, ["sm_90"], tmp_path / "cache")
    assert not again.cached and again.key != done.key
