"""Contract for vector_add's TileLang version: out = x + y over a flat vector (read-only for the loop).

Its own copy of the folder's spec (`../spec.py`), the same inputs, shapes, dtypes and tolerances: a
spec sits beside its target, and its names are read from its own source (the folder's cannot be
re-exported). No INTERPRETER_SHAPES: TileLang has no CPU interpreter."""

import torch

CORRECTNESS_SHAPES = [(1,), (127,), (4097,), (65_537,)]
BENCHMARK_SHAPES = [(1 << 20,), (1 << 24,), (1 << 28,)]
DTYPES = ["float16", "bfloat16", "float32"]
# (atol, rtol): one rounding of the sum in the storage type
TOLERANCES = {"float16": (1e-3, 2e-3), "bfloat16": (8e-3, 1.6e-2), "float32": (1e-6, 1e-6)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    y = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    return {"x": x, "y": y, "out": torch.empty(shape, device=device, dtype=dtype)}


def reference(x, y, out):
    return x + y


def flops(shape):
    return shape[0]


def bytes_moved(shape, dtype):
    return 3 * shape[0] * torch.empty((), dtype=dtype).element_size()
