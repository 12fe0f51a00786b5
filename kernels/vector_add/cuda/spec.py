"""Contract for vector_add's CUDA C version: out = x + y over a flat float32 vector (read-only for the loop).

Its own spec, not the folder's: solve takes the element count as a scalar (`int n`), which the Triton
spec's inputs do not carry, and a C function has one element type per pointer (float), where the
folder's DTYPES holds float16, bfloat16 and float32."""

import torch

ENTRY = "solve"
CORRECTNESS_SHAPES = [(1,), (127,), (4097,), (65_537,)]
BENCHMARK_SHAPES = [(1 << 20,), (1 << 24,), (1 << 28,)]
DTYPES = ["float32"]
TOLERANCES = {"float32": (1e-6, 1e-6)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    y = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    return {"x": x, "y": y, "out": torch.empty(shape, device=device, dtype=dtype), "n": shape[0]}


def reference(x, y, out, n):
    return x + y


def flops(shape):
    return shape[0]


def bytes_moved(shape, dtype):
    return 3 * shape[0] * torch.empty((), dtype=dtype).element_size()
