"""Softmax forward of Liger-Kernel (`liger_kernel/ops/softmax.py`, 0.8.5), specified for tileloop the
way one of its users would: the target is Liger's unmodified op module, this file sits beside it as
`spec.py`, and the op is called the way a model calls it, through its autograd Function.

`_softmax_forward` also returns its launch settings (block size, warps, which kernel), which are not
outputs: a change to them must not count as a wrong answer, so the adapter returns Y alone.
"""

import torch

CORRECTNESS_SHAPES = [(1, 7), (5, 33), (37, 1000), (3, 4097)]
INTERPRETER_SHAPES = [(37, 1000)]
# (rows, width): the widths (4096, 16384), attention-score rows, a vocabulary-sized row
BENCHMARK_SHAPES = [(4096, 4096), (2048, 16384), (8192, 8192), (32768, 1024), (1024, 32000)]
DTYPES = [torch.bfloat16, torch.float16]
# outputs are about 1/width: atol far below them, so that an all-zero output fails
TOLERANCES = {torch.bfloat16: (1e-6, 2e-2), torch.float16: (1e-6, 1e-2)}
OUTPUTS = ()


def entry(target, x):
    return target.LigerSoftmaxFunction.apply(x)


# Liger's own, unmodified softmax (the installed package), timed beside the tuned version by
# `tileloop report --measure`: the same adapter, called with the installed module
REFERENCES = {"liger": ("liger_kernel.ops.softmax", entry)}


def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(shape, generator=g).to(dtype)}


def reference(x):
    return torch.softmax(x, dim=-1)


def flops(shape, dtype):
    rows, width = shape
    return 5 * rows * width  # max, subtract, exp, sum, divide


def bytes_moved(shape, dtype):
    rows, width = shape
    return 2 * rows * width * dtype.itemsize
