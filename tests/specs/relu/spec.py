"""Contract for relu: y = max(x, 0) elementwise, on inputs of scale 2 (half the outputs are 0)."""

import torch

CORRECTNESS_SHAPES = [(1, 7), (5, 33), (37, 1000)]
BENCHMARK_SHAPES = [(4096, 4096)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# (atol, rtol) as a user writes them: a rounding of the output in its storage type
TOLERANCES = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 2e-2), torch.float32: (1e-5, 1e-5)}


def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": (2 * torch.randn(shape, generator=g)).to(dtype)}


def reference(x):
    return torch.relu(x)


def flops(shape, dtype):
    return torch.Size(shape).numel()


def bytes_moved(shape, dtype):
    return 2 * torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
