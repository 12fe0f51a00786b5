"""matmul in TileLang, first version: one program per block_M x block_N tile of C, a pipelined loop
over K in block_K steps (tiles of A and B copied to shared memory, T.gemm into an fp32 fragment),
modest fixed tiles, two stages, four warps, no rasterization (T.use_swizzle), no autotune."""

import tilelang
import tilelang.language as T

BLOCK_M = 64
BLOCK_N = 64
BLOCK_K = 32
NUM_STAGES = 2
THREADS = 128


@tilelang.jit
def matmul(M, N, K, block_M, block_N, block_K, num_stages, threads, dtype, accum_dtype="float32"):
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


def run(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    kernel = matmul(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, THREADS, str(a.dtype).removeprefix("torch."))
    kernel(a, b, out)
    return out
