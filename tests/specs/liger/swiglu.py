"""SwiGLU forward of Liger-Kernel (`liger_kernel/ops/swiglu.py`, 0.8.5: silu(a) * b, the gated MLP
activation), specified for tileloop the way one of its users would: the target is Liger's
unmodified op module, this file sits beside it as `spec.py`, and the op is called through its
autograd Function as a model calls it.
"""

import torch

CORRECTNESS_SHAPES = [(1, 7), (5, 33), (37, 1000), (3, 4097)]
INTERPRETER_SHAPES = [(37, 1000)]
# (tokens, intermediate size): Llama-3-8B (14336), Llama-2-7B (11008), Llama-3-70B (28672), Qwen-7B (18944)
BENCHMARK_SHAPES = [(4096, 14336), (8192, 11008), (2048, 28672), (4096, 18944)]
DTYPES = [torch.bfloat16, torch.float16]
# silu(a) is rounded to the input dtype before the multiply by b: two roundings
TOLERANCES = {torch.bfloat16: (1e-2, 2e-2), torch.float16: (2e-3, 4e-3)}
OUTPUTS = ()


def entry(target, a, b):
    return target.LigerSiLUMulFunction.apply(a, b)


# Liger's own, unmodified swiglu (the installed package), timed beside the tuned version by
# `tileloop report --measure`: the same adapter, called with the installed module
REFERENCES = {"liger": ("liger_kernel.ops.swiglu", entry)}


def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(shape, generator=g).to(dtype), "b": torch.randn(shape, generator=g).to(dtype)}


def reference(a, b):
    return torch.nn.functional.silu(a) * b


def flops(shape, dtype):
    rows, width = shape
    return 5 * rows * width  # exp, add, divide (sigmoid), multiply by a, multiply by b


def bytes_moved(shape, dtype):
    rows, width = shape
    return 3 * rows * width * dtype.itemsize  # a, b in, c out
