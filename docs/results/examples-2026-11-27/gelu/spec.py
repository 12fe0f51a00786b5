"""GELU (tanh approximation) over a 2-D activation; out written in place."""

import math

import torch

CORRECTNESS_SHAPES = [(1, 7), (33, 1000), (128, 4097)]
BENCHMARK_SHAPES = [(4096, 4096), (8192, 14336), (16384, 16384)]
DTYPES = ["bfloat16", "float16"]
TOLERANCES = {"bfloat16": (1e-2, 2e-2), "float16": (2e-3, 4e-3)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    x = (2 * torch.randn(shape, generator=g, device=device, dtype=torch.float32)).to(dtype)
    return {"x": x, "out": torch.empty(shape, device=device, dtype=dtype)}


def reference(x, out):
    return torch.nn.functional.gelu(x, approximate="tanh")


def flops(shape):
    return 12 * shape[0] * shape[1]


def bytes_moved(shape, dtype):
    return 2 * shape[0] * shape[1] * torch.empty((), dtype=dtype).element_size()
