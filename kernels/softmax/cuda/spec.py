"""Contract for softmax's CUDA C version: row-wise softmax over the last dimension of a float32 2-D
tensor (read-only for the loop).

Its own spec, not the folder's: solve takes the matrix's rows and cols as scalars, which the Triton
spec's inputs do not carry, and a C function has one element type per pointer (float), where the
folder's DTYPES holds float16, bfloat16 and float32."""

import torch

ENTRY = "solve"
CORRECTNESS_SHAPES = [(1, 1), (5, 17), (33, 1000), (64, 2053)]
BENCHMARK_SHAPES = [(8192, 1024), (4096, 4096), (2048, 16384)]
DTYPES = ["float32"]
TOLERANCES = {"float32": (1e-8, 1e-5)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    rows, cols = shape
    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    return {"x": x, "out": torch.empty(shape, device=device, dtype=dtype), "rows": rows, "cols": cols}


def reference(x, out, rows, cols):
    return torch.softmax(x, dim=-1)


def flops(shape):
    rows, cols = shape
    return 5 * rows * cols  # max, subtract, exp, sum, divide


def bytes_moved(shape, dtype):
    rows, cols = shape
    return 2 * rows * cols * torch.empty((), dtype=dtype).element_size()
