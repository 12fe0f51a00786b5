"""LayerNorm forward of Liger-Kernel (`liger_kernel/ops/layer_norm.py`, 0.8.5), specified for
tileloop the way one of its users would: the target is Liger's unmodified op module, this file sits
beside it as `spec.py`.

`layer_norm_forward(X, W, B, eps)` returns `(Y, X, Mean, RSTD, BLOCK_SIZE, num_warps)`: the adapter
keeps Y and the fp32 row statistics saved for the backward pass (Mean, RSTD). Rows get a mean away
from zero (as activations have), so that the Mean output is a real test, not one zeros would pass.
"""

import torch

CORRECTNESS_SHAPES = [(1, 7), (5, 33), (37, 1000), (3, 4097)]
INTERPRETER_SHAPES = [(37, 1000)]
# (tokens, hidden): the 2048x16384 and 4096x4096, GPT-2/BERT-large widths (1024), and
# ViT-H / GPT-J widths at long sequences
BENCHMARK_SHAPES = [(2048, 16384), (4096, 4096), (16384, 1024), (8192, 5120), (4096, 12288)]
DTYPES = [torch.bfloat16, torch.float16]
TOLERANCES = {torch.bfloat16: (1e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
OUTPUTS = ()


def entry(target, X, W, B, eps):
    Y, _X, Mean, RSTD, _block_size, _num_warps = target.layer_norm_forward(X, W, B, eps)
    return Y, Mean, RSTD


# Liger's own, unmodified layer_norm (the installed package), timed beside the tuned version by
# `tileloop report --measure`: the same adapter, called with the installed module
REFERENCES = {"liger": ("liger_kernel.ops.layer_norm", entry)}


def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rows, hidden = shape
    shift = 0.5 + torch.rand(rows, 1, generator=g)
    return {
        "X": (torch.randn(shape, generator=g) + shift).to(dtype),
        "W": (1.0 + 0.1 * torch.randn(hidden, generator=g)).to(dtype),
        "B": (0.1 * torch.randn(hidden, generator=g)).to(dtype),
        "eps": 1e-5,
    }


def reference(X, W, B, eps):
    # PyTorch's own fused layer norm, which gives the row statistics too (as (rows, 1) columns)
    Y, mean, rstd = torch.native_layer_norm(X, [X.shape[-1]], W, B, eps)
    return Y, mean.squeeze(-1), rstd.squeeze(-1)


def flops(shape, dtype):
    rows, hidden = shape
    return 7 * rows * hidden  # sum, subtract, square, sum, scale, weight, bias


def bytes_moved(shape, dtype):
    rows, hidden = shape
    size = dtype.itemsize
    return 2 * rows * hidden * size + 2 * hidden * size + 2 * rows * 4  # X in, Y out, W and B in, Mean and RSTD out
