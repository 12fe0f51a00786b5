"""RMSNorm forward of Liger-Kernel (`liger_kernel/ops/rms_norm.py`, 0.8.5), specified for tileloop
the way one of its users would: the target is Liger's unmodified op module, this file sits beside it
as `spec.py`.

`rms_norm_forward(X, W, eps, offset, casting_mode, row_mode)` returns
`(Y, X, RSTD, BLOCK_SIZE, num_warps, casting_mode)`: the adapter below keeps the two outputs a change
must keep right, Y and the inverse RMS saved for the backward pass (RSTD, fp32 in Llama casting).
One correctness shape has 32768+ rows of a narrow width, which Liger sends to its row-blocked
kernel (`_block_rms_norm_forward_kernel`); the others take the one-row-per-program one, which the
benchmark shapes time. The last correctness shape is one of those: the ahead-of-time build (check's
and the compile gate of every iteration) compiles the kernels that the last shape launches.
"""

import torch

# odd widths catch masking bugs; (32771, 5) reaches the row-blocked kernel (rows >= 32768, width <= 256)
CORRECTNESS_SHAPES = [(1, 7), (5, 33), (32771, 5), (37, 1000), (3, 4097)]
INTERPRETER_SHAPES = [(37, 1000)]
# (tokens, hidden): the 8192x8192, Llama-3-8B (4096) at 16k tokens, 13B/14B widths (5120),
# 70B (8192), and a per-head QK norm (head_dim 128) that takes the row-blocked kernel
BENCHMARK_SHAPES = [(8192, 8192), (16384, 4096), (8192, 5120), (4096, 8192), (65536, 128)]
DTYPES = [torch.bfloat16, torch.float16]
# Llama casting rounds X * rstd to the input dtype before the weight multiply: two roundings
TOLERANCES = {torch.bfloat16: (1e-2, 2e-2), torch.float16: (2e-3, 4e-3)}
OUTPUTS = ()


def entry(target, X, W, eps, offset, casting_mode):
    Y, _X, RSTD, _block_size, _num_warps, _casting_mode = target.rms_norm_forward(X, W, eps, offset, casting_mode, None)
    return Y, RSTD


# Liger's own, unmodified rms_norm (the installed package), timed beside the tuned version by
# `tileloop report --measure`: the same adapter, called with the installed module
REFERENCES = {"liger": ("liger_kernel.ops.rms_norm", entry)}


def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rows, hidden = shape
    return {
        "X": torch.randn(shape, generator=g).to(dtype),
        "W": (1.0 + 0.1 * torch.randn(hidden, generator=g)).to(dtype),
        "eps": 1e-6,
        "offset": 0.0,
        "casting_mode": "llama",
    }


def reference(X, W, eps, offset, casting_mode):
    rstd = torch.rsqrt(X.pow(2).mean(dim=-1) + eps)
    return X * rstd[:, None] * (offset + W), rstd


def flops(shape, dtype):
    rows, hidden = shape
    return 4 * rows * hidden  # square, sum, scale by rstd, scale by W


def bytes_moved(shape, dtype):
    rows, hidden = shape
    size = dtype.itemsize
    return 2 * rows * hidden * size + hidden * size + rows * 4  # X in, Y out, W in, RSTD (fp32) out
