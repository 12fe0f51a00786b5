"""Contract for rmsnorm's CUDA C version: forward over the last dimension of a float32 2-D tensor
(rows, cols), with weight of shape (cols,) and eps=1e-6: out = x / sqrt(mean(x^2) + eps) * weight
(read-only for the loop).

Its own spec, not the folder's: solve takes rows, cols and eps as scalars, which the Triton spec's
inputs do not carry, and a C function has one element type per pointer (float), where the folder's
DTYPES holds float16, bfloat16 and float32."""

import torch

EPS = 1e-6

ENTRY = "solve"
CORRECTNESS_SHAPES = [(1, 1), (5, 17), (33, 1000), (64, 2053)]
BENCHMARK_SHAPES = [(8192, 1024), (4096, 4096), (2048, 16384)]
DTYPES = ["float32"]
TOLERANCES = {"float32": (1e-5, 1e-4)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    rows, cols = shape
    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    weight = (1 + 0.1 * torch.randn(cols, generator=g, device=device, dtype=torch.float32)).to(dtype)
    return {"x": x, "weight": weight, "out": torch.empty(shape, device=device, dtype=dtype),
            "rows": rows, "cols": cols, "eps": EPS}


def reference(x, weight, out, rows, cols, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def flops(shape):
    rows, cols = shape
    return 4 * rows * cols  # square, sum, scale by rstd, multiply weight


def bytes_moved(shape, dtype):
    rows, cols = shape
    size = torch.empty((), dtype=dtype).element_size()
    return (2 * rows * cols + cols) * size  # read x, write out, read weight
