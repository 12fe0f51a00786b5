"""A croq-tune iteration script for TileLang, as its tuning contract asks: a bf16 matmul kernel with its
tile sizes, stages and threads pinned as module constants, `verify()` printing `VERIFY: PASS` or
`VERIFY: FAIL max_abs_err=<v>` against torch in float32, and `bench()` timing it with CUDA events
(10 warm-up and 50 timed calls) and printing `TFLOPS: <v> time_ms: <v>`. Run as a script it does both.
tileloop drives it as an external harness: docs/harness.md, "croq-tune's iteration scripts"."""

import tilelang
import tilelang.language as T
import torch

M = N = K = 4096
BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 32
NUM_STAGES = 3
THREADS = 128
TOLERANCE = 1e-2  # bf16: the output is within one rounding of the float32 reference
WARMUP, ITERS = 10, 50


@tilelang.jit
def matmul(M, N, K, block_M, block_N, block_K, num_stages, threads, dtype="bfloat16", accum_dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, ko * block_K], A_shared)
                T.copy(B[ko * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def inputs():
    """A and B scaled so that C stays within about +-2, where one bf16 rounding is below the tolerance."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(M, K, generator=g, device="cuda") / K ** 0.5).to(torch.bfloat16)
    b = (torch.randn(K, N, generator=g, device="cuda") / 2).to(torch.bfloat16)
    return a, b, torch.empty(M, N, device="cuda", dtype=torch.bfloat16)


def kernel_fn():
    return matmul(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, THREADS)


def verify():
    a, b, c = inputs()
    kernel_fn()(a, b, c)
    torch.cuda.synchronize()
    err = (c.float() - a.float() @ b.float()).abs().max().item()
    print("VERIFY: PASS" if err < TOLERANCE else f"VERIFY: FAIL max_abs_err={err:.4g}")


def bench():
    a, b, c = inputs()
    kernel = kernel_fn()
    for _ in range(WARMUP):
        kernel(a, b, c)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(ITERS):
        kernel(a, b, c)
    end.record()
    torch.cuda.synchronize()
    elapsed_ms = start.elapsed_time(end) / ITERS
    print(f"TFLOPS: {2 * M * N * K / elapsed_ms / 1e9:.2f} time_ms: {elapsed_ms:.4f}")


if __name__ == "__main__":
    verify()
    bench()
