"""matmul in TileLang, first version: one program per block_M x block_N tile of C, a pipelined loop
over K in block_K steps (tiles of A and B copied to shared memory, T.gemm into an fp32 fragment),
modest fixed tiles, two stages, four warps, no rasterization (T.use_swizzle), no autotune.

Unaligned rows: inside `T.Pipelined`, TileLang lowers a global -> shared `T.copy` to TMA or to
`cp.async` (whatever the `tl.enable_async_copy` pass config says: the pipeline marks its copies
async itself), and a cp.async moves 4, 8 or 16 bytes. Where a row of A (K elements) or of B
(N elements) is not a multiple of 16 bytes (4095x4097x4096 in bf16: rows of B 8194 bytes long), the
copies' vector width follows the rows' alignment down to one 2-byte element, and TileLang can emit a
cp.async its code generator rejects. So `run` zero-pads K and N up to multiples of 16 bytes there,
and only there (`aligned`): A and B copied into padded buffers, C computed into a padded buffer and
its first N columns copied to `out`; the zero columns of A meet the zero rows of B, so C is
unchanged. The kernel then only ever sees 16-byte rows, as at every aligned shape, which run exactly
as before. The copies are part of every timed call of an unaligned shape; chosen over a kernel
without the pipeline for such shapes, whose synchronous 2-byte copies would cost far more."""

import tilelang
import tilelang.language as T
import torch.nn.functional as F

BLOCK_M = 64
BLOCK_N = 64
BLOCK_K = 32
NUM_STAGES = 2
THREADS = 128
ROW_BYTES = 16  # every row the kernel reads starts on a multiple of this: cp.async's widest copy, TMA's rule


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


def aligned(n: int, element_size: int) -> int:
    """The least row length from `n` elements up whose bytes are a multiple of ROW_BYTES."""
    per_row = max(ROW_BYTES // element_size, 1)
    return -(-n // per_row) * per_row


def run(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    Kp, Np = aligned(K, a.element_size()), aligned(N, a.element_size())
    a_p = a if Kp == K else F.pad(a, (0, Kp - K))
    b_p = b if (Kp, Np) == (K, N) else F.pad(b, (0, Np - N, 0, Kp - K))
    c = out if Np == N else out.new_empty((M, Np))
    kernel = matmul(M, Np, Kp, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, THREADS, str(a.dtype).removeprefix("torch."))
    kernel(a_p, b_p, c)
    if c is not out:
        out.copy_(c[:, :N])
    return out
