"""Contract for matmul's TileLang version: C = A @ B with A (M, K), B (K, N), fp32 accumulation, C in the input
dtype (read-only for the loop). shape = (M, N, K).

Its own copy of the folder's spec (`../spec.py`), the same inputs, shapes, dtypes and tolerances: a
spec sits beside its target, and its names are read from its own source (the folder's cannot be
re-exported). No INTERPRETER_SHAPES: TileLang has no CPU interpreter."""

import torch

# Small and odd: partial tiles on every edge, K not a multiple of any tile.
CORRECTNESS_SHAPES = [(1, 1, 1), (17, 33, 65), (129, 65, 257), (256, 192, 320)]
BENCHMARK_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4095, 4097, 4096)]
DTYPES = ["bfloat16", "float16"]
# Outputs are ~N(0, 1.2) at every K (see make_inputs). An fp32-accumulating kernel differs from the
# fp32 reference by one rounding of C to the storage type (relative 2^-8 bf16, 2^-11 fp16) plus
# fp32 summation-order noise (~1e-5 at K = 8192); rtol is ~4x the rounding, atol far above the
# summation noise and far below |C| (an all-zero C passes on < 1% of elements). fp16 or bf16
# accumulation (errors ~1e-2 and up at K = 4096) fails.
TOLERANCES = {"bfloat16": (1e-2, 1.6e-2), "float16": (2e-3, 2e-3)}
OUTPUTS = ("out",)


def _operand(rows, cols, k, generator, device):
    # Entries are +-U[0.5, 1.5) * K^-1/4: unit-ish variance like randn, so C = A @ B is O(1) at
    # every K, but bounded away from zero, so that the 1x1x1 shape cannot produce a C that is
    # accidentally within atol of zero (the zero-pass rule would reject the spec).
    mag = 0.5 + torch.rand((rows, cols), generator=generator, device=device, dtype=torch.float32)
    sign = torch.randint(0, 2, (rows, cols), generator=generator, device=device, dtype=torch.int32) * 2 - 1
    return mag * sign * float(k) ** -0.25


def make_inputs(shape, dtype, seed, device):
    m, n, k = shape
    g = torch.Generator(device=device).manual_seed(seed)
    a = _operand(m, k, k, g, device).to(dtype)
    b = _operand(k, n, k, g, device).to(dtype)
    return {"a": a, "b": b, "out": torch.empty((m, n), device=device, dtype=dtype)}


def reference(a, b, out):
    return a @ b


def flops(shape):
    m, n, k = shape
    return 2 * m * n * k


def bytes_moved(shape, dtype):
    m, n, k = shape
    return (m * k + k * n + m * n) * torch.empty((), dtype=dtype).element_size()
