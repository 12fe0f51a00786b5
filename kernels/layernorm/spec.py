"""Contract for layernorm: forward over the last dimension of a 2-D tensor (rows, cols), with
weight and bias of shape (cols,) and eps=1e-5 (read-only)."""

import torch

EPS = 1e-5

# (1, 2) rather than (1, 1): with one column the output is exactly `bias` (~0.1 * randn), and
# for some seeds that single element would sit below atol, so the zero-pass rule would refuse
# the check. With two columns the normalized values are +-1 and the output is ~ +-weight + bias.
CORRECTNESS_SHAPES = [(1, 2), (5, 17), (33, 1000), (64, 2053)]
BENCHMARK_SHAPES = [(8192, 1024), (4096, 4096), (2048, 16384)]
INTERPRETER_SHAPES = [(8, 512)]
DTYPES = ["float16", "bfloat16", "float32"]
# Outputs are O(1) (normalized values times ~1 plus ~0.1): atol sits far below that, so an
# all-zero output fails; rtol covers one rounding of the output (fp16 ~5e-4, bf16 ~4e-3 relative).
TOLERANCES = {"float16": (1e-3, 1e-2), "bfloat16": (1e-3, 2e-2), "float32": (1e-5, 1e-4)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    rows, cols = shape
    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    weight = (1 + 0.1 * torch.randn(cols, generator=g, device=device, dtype=torch.float32)).to(dtype)
    bias = (0.1 * torch.randn(cols, generator=g, device=device, dtype=torch.float32)).to(dtype)
    return {"x": x, "weight": weight, "bias": bias, "out": torch.empty(shape, device=device, dtype=dtype)}


def reference(x, weight, bias, out):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, EPS)


def flops(shape):
    rows, cols = shape
    # sum, subtract mean, square, sum, scale by rstd, multiply weight, add bias
    return 7 * rows * cols


def bytes_moved(shape, dtype):
    rows, cols = shape
    size = torch.empty((), dtype=dtype).element_size()
    return (2 * rows * cols + 2 * cols) * size  # read x, write out, read weight and bias
