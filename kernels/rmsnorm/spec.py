"""Contract for rmsnorm: forward over the last dimension of a 2-D tensor (rows, cols), with
weight of shape (cols,) and eps=1e-6: out = x / sqrt(mean(x^2) + eps) * weight (read-only)."""

import torch

EPS = 1e-6

CORRECTNESS_SHAPES = [(1, 1), (5, 17), (33, 1000), (64, 2053)]
BENCHMARK_SHAPES = [(8192, 1024), (4096, 4096), (2048, 16384)]
INTERPRETER_SHAPES = [(8, 512)]
DTYPES = ["float16", "bfloat16", "float32"]
# Outputs are O(1) (x / rms(x) times ~1): atol sits far below that, so an all-zero output
# fails; rtol covers one rounding of the output (fp16 ~5e-4, bf16 ~4e-3 relative).
TOLERANCES = {"float16": (1e-3, 1e-2), "bfloat16": (1e-3, 2e-2), "float32": (1e-5, 1e-4)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    rows, cols = shape
    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    weight = (1 + 0.1 * torch.randn(cols, generator=g, device=device, dtype=torch.float32)).to(dtype)
    return {"x": x, "weight": weight, "out": torch.empty(shape, device=device, dtype=dtype)}


def reference(x, weight, out):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight


def flops(shape):
    rows, cols = shape
    return 4 * rows * cols  # square, sum, scale by rstd, multiply weight


def bytes_moved(shape, dtype):
    rows, cols = shape
    size = torch.empty((), dtype=dtype).element_size()
    return (2 * rows * cols + cols) * size  # read x, write out, read weight
