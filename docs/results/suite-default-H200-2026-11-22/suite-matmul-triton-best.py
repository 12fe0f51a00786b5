"""matmul, first version: one program per BLOCK_M x BLOCK_N tile of C, a plain loop over K in
BLOCK_K steps with tl.dot into an fp32 accumulator, row-major program order (no grouping),
masked loads on every edge, modest fixed tiles, no autotune."""

import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}, num_warps=warps, num_stages=stages)
        for block_m, block_n, block_k in ((64, 64, 32), (128, 64, 32), (64, 128, 32), (128, 128, 32), (128, 256, 64), (256, 128, 64))
        for warps in (4, 8)
        for stages in (2, 3)
    ],
    key=["M", "N", "K"],
)
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + offs_k) < K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# matmul_kernel through tensor descriptors (TMA): the same tiles; the descriptors handle the bounds
@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}, num_warps=warps, num_stages=stages)
        for block_m, block_n, block_k in ((64, 64, 32), (128, 64, 32), (64, 128, 32), (128, 128, 32), (128, 256, 64), (256, 128, 64))
        for warps in (4, 8)
        for stages in (2, 3)
    ],
    key=["M", "N", "K"],
)
@triton.jit
def matmul_kernel_tma(a_ptr, b_ptr, c_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([pid_m * BLOCK_M, k0])
        b = b_desc.load([k0, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))


def _tma_ready(t, *strides):
    """Whether a tensor descriptor (TMA) can address `t` with these strides (the kernel's, in
    elements): a 16-byte aligned base, 16-byte aligned leading strides, a contiguous last one."""
    size = t.element_size()
    return (t.numel() > 0 and t.data_ptr() % 16 == 0 and strides[-1] == 1
            and all(s * size % 16 == 0 for s in strides[:-1]))


def _tma_scratch(size, alignment, stream):
    """Global memory for the descriptors the kernel builds on the device (Triton asks at launch)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def run(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
    # tensor descriptors need 16-byte aligned bases and leading strides and a contiguous last
    # dimension; other layouts (odd sizes, transposed views) take the pointer kernel
    if (_tma_ready(a, a.stride(0), a.stride(1))
            and _tma_ready(b, b.stride(0), b.stride(1))
            and _tma_ready(out, out.stride(0), out.stride(1))):
        triton.set_allocator(_tma_scratch)  # global memory for the descriptors
        matmul_kernel_tma[grid](a, b, out, M, N, K,
                                a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))
    else:
        matmul_kernel[grid](a, b, out, M, N, K,
                            a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))
    return out
