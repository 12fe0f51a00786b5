"""CUDA C targets on a GPU: the first versions called through the kernel process's loader and
compared with their specs' references at every correctness shape, the stream form run on a side
stream and replayed from a CUDA graph, a host tensor refused. Skipped, with the reason, where no
CUDA device or no nvcc is found (the CPU's share is tests/test_cuda_loader.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from loop.common import nvcc

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,  # selected by `pytest -m gpu` on the device, as the other GPU tests are
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch"),
    pytest.mark.skipif(nvcc.toolchain() is None, reason=nvcc.why_none()),
]

ROOT = Path(__file__).resolve().parent.parent
FIRST_VERSIONS = [ROOT / "kernels" / op / "cuda" / f"{op}_cuda.cu" for op in ("vector_add", "softmax", "rmsnorm")]
STREAM = '''#include <cuda_runtime.h>
__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
extern "C" void solve(const float* x, float* y, int n, cudaStream_t stream) {
    scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, y, n);
}
'''


def _spec(path: Path):
    spec = importlib.util.spec_from_file_location(f"cuda_gpu_spec_{path.parent.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(target: Path):
    from loop.worker import cuda_build

    return cuda_build.load_target(target.stem, target)


@pytest.mark.parametrize("target", FIRST_VERSIONS, ids=lambda p: p.stem)
def test_the_first_versions_match_their_references_on_the_gpu(target):
    spec, module = _spec(target.parent / "spec.py"), _load(target)
    assert module.FORM == "synchronising"
    for shape in spec.CORRECTNESS_SHAPES:
        inputs = spec.make_inputs(shape, torch.float32, 0, "cuda")
        want = spec.reference(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        module.solve(**inputs)
        torch.cuda.synchronize()
        atol, rtol = spec.TOLERANCES["float32"]
        torch.testing.assert_close(inputs["out"], want, atol=atol, rtol=rtol, msg=f"{target.name} at {shape}")


def test_the_stream_form_runs_on_the_current_stream_and_in_a_cuda_graph(tmp_path):
    target = tmp_path / "scale_cuda.cu"
    target.write_text(STREAM)
    module = _load(target)
    assert module.FORM == "stream"
    n = 5000
    x = torch.randn(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        module.solve(x=x, y=y, n=n)
    side.synchronize()
    torch.testing.assert_close(y, 2 * x + 1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captured: solve launches on the capturing stream it is given
        module.solve(x=x, y=y, n=n)
    y.zero_()
    x.copy_(torch.randn(n, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, 2 * x + 1)


def test_a_host_tensor_is_refused_in_one_line_before_the_call():
    module = _load(FIRST_VERSIONS[0])
    x = torch.randn(16, device="cuda")
    out = torch.full((16,), 7.0, device="cuda")
    with pytest.raises(TypeError, match=r"^y: const float\* y \(a float32 tensor, input\) needs a contiguous tensor "
                                        r"on cuda, got one on cpu$"):
        module.solve(x=x, y=torch.randn(16), out=out, n=16)
    assert (out == 7.0).all()
