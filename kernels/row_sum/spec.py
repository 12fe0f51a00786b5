"""Contract for row_sum: out[r] = sum(x[r, :]) over the last dimension of a 2-D tensor
(rows, cols) -> (rows,), accumulated in fp32, written in the input dtype (read-only)."""

import torch

# Every shape has at least 20 rows. The zero-pass rule looks at the fraction of output elements
# an all-zero output would match; with one or five output rows that check is all-or-nothing on
# one or two random sums, so a row sum that happens to land within atol of zero (about 1 in 1000
# seeds for (1, 1) at atol=1e-3) would turn into a spec_error. With >= 20 rows it takes three
# such rows at once (< 1e-6). cols = 1 and 17 still cover rows shorter than any block or tile.
CORRECTNESS_SHAPES = [(20, 1), (23, 17), (33, 1000), (64, 2053)]
BENCHMARK_SHAPES = [(8192, 1024), (4096, 4096), (2048, 16384), (32768, 8192)]
INTERPRETER_SHAPES = [(16, 1024)]
DTYPES = ["float16", "bfloat16", "float32"]
# (atol, rtol). Sums of randn are N(0, cols): typically ~sqrt(cols) >= 1, so an all-zero output
# fails on almost every row. rtol covers the one rounding of the fp32 sum to the output dtype
# (half an ulp: 4.9e-4 fp16, 3.9e-3 bf16), with 4x margin. atol covers the absolute error of
# fp32 accumulation in a different order than the reference, which matters on rows whose sum
# cancels to near zero: measured on CPU at most ~6e-5 (fp16/bf16 inputs, cols=16384) and ~3e-4
# (fp32 inputs, cols=16384, only 16 accumulator lanes), against the reference at fp32 (fp16/bf16)
# or fp64 (fp32).
TOLERANCES = {"float16": (1e-3, 2e-3), "bfloat16": (1e-3, 1.6e-2), "float32": (1e-3, 1e-5)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    rows, cols = shape
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((rows, cols), generator=g, device=device, dtype=torch.float32).to(dtype)
    return {"x": x, "out": torch.empty((rows,), device=device, dtype=dtype)}


def reference(x, out):
    return x.sum(dim=-1)


def flops(shape):
    rows, cols = shape
    return rows * cols  # one add per element


def bytes_moved(shape, dtype):
    rows, cols = shape
    return (rows * cols + rows) * torch.empty((), dtype=dtype).element_size()
