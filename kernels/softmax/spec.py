"""Contract for softmax: row-wise softmax over the last dimension of a 2-D tensor (read-only)."""

import torch

CORRECTNESS_SHAPES = [(1, 1), (5, 17), (33, 1000), (64, 2053)]
BENCHMARK_SHAPES = [(8192, 1024), (4096, 4096), (2048, 16384)]
INTERPRETER_SHAPES = [(8, 512)]
DTYPES = ["float16", "bfloat16", "float32"]
# Outputs are ~1/n_cols, so atol must sit far below them: an all-zero output must fail.
TOLERANCES = {"float16": (1e-6, 1e-2), "bfloat16": (1e-6, 2e-2), "float32": (1e-8, 1e-5)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    return {"x": x, "out": torch.empty(shape, device=device, dtype=dtype)}


def reference(x, out):
    return torch.softmax(x, dim=-1)


def flops(shape):
    rows, cols = shape
    return 5 * rows * cols  # max, subtract, exp, sum, divide


def bytes_moved(shape, dtype):
    rows, cols = shape
    return 2 * rows * cols * torch.empty((), dtype=dtype).element_size()
