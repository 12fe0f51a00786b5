"""Contract for silu_mul, the fused activation of gated MLPs (SwiGLU), in the one-input layout
of vLLM's silu_and_mul (read-only).

Shape (rows, 2 * d) is the shape of the single input x: its first half along the last dimension
is the gate, its second half the up projection, and

    out[r, c] = silu(x[r, c]) * x[r, d + c],   silu(g) = g * sigmoid(g),   out: (rows, d),

computed in fp32 and written in the input dtype. The last dimension must be even.
"""

import torch

# d = 1, 17, 1000, 2053: odd, non-power-of-two halves (the up half starts at an odd column).
CORRECTNESS_SHAPES = [(1, 2), (5, 2 * 17), (33, 2 * 1000), (64, 2 * 2053)]
# Llama-7B-like (d=11008) and Llama-3-8B-like (d=14336) MLPs, and a 4096-wide one.
BENCHMARK_SHAPES = [(4096, 2 * 4096), (8192, 2 * 11008), (16384, 2 * 14336)]
INTERPRETER_SHAPES = [(8, 2 * 512)]
DTYPES = ["float16", "bfloat16", "float32"]
# (atol, rtol). Elementwise with no accumulation: the error of a correct fp32 computation is
# relative, dominated by the one rounding to the output dtype (half an ulp: 4.9e-4 fp16, 3.9e-3
# bf16; rtol gives 4x), plus at most 2^-25 = 3e-8 absolute where an fp16 output is subnormal
# (atol 2e-7 gives 6x). atol stays tiny because out = silu(g) * u has much mass near zero (product
# of two near-zero-capable factors): at these atols an all-zero output passes on ~1e-5 of
# elements, so even the one-element shape (1, 2) passes the zero-pass rule for all but ~4e-6 of seeds.
TOLERANCES = {"float16": (2e-7, 2e-3), "bfloat16": (2e-7, 1.6e-2), "float32": (1e-8, 1e-5)}
OUTPUTS = ("out",)


def make_inputs(shape, dtype, seed, device):
    rows, cols = shape
    if cols % 2:
        raise ValueError(f"silu_mul needs an even last dimension (gate | up), got {shape}")
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((rows, cols), generator=g, device=device, dtype=torch.float32).to(dtype)
    return {"x": x, "out": torch.empty((rows, cols // 2), device=device, dtype=dtype)}


def reference(x, out):
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def flops(shape):
    rows, cols = shape
    return 5 * rows * (cols // 2)  # exp, add, divide (sigmoid), times gate, times up


def bytes_moved(shape, dtype):
    rows, cols = shape
    return (rows * cols + rows * (cols // 2)) * torch.empty((), dtype=dtype).element_size()
