"""softmax in TileLang, first version: one row per program, three passes over the row in small chunks
(the row's maximum, the sum of exponentials, the output), one thread per element of a chunk, every
element's bound checked, float32 arithmetic, no pipelining, no autotune."""

import tilelang
import tilelang.language as T

BLOCK = 128
THREADS = 128


@tilelang.jit
def softmax(rows, cols, block, threads, dtype, accum_dtype="float32"):
    @T.prim_func
    def main(x: T.Tensor((rows, cols), dtype), out: T.Tensor((rows, cols), dtype)):
        with T.Kernel(rows, threads=threads) as bx:
            partial = T.alloc_fragment((block,), accum_dtype)
            row_max = T.alloc_fragment((1,), accum_dtype)
            denom = T.alloc_fragment((1,), accum_dtype)
            T.fill(partial, -T.infinity(accum_dtype))
            for k in T.serial(T.ceildiv(cols, block)):
                for i in T.Parallel(block):
                    if k * block + i < cols:
                        partial[i] = T.max(partial[i], T.Cast(accum_dtype, x[bx, k * block + i]))
            T.reduce_max(partial, row_max, dim=0)
            T.clear(partial)
            for k in T.serial(T.ceildiv(cols, block)):
                for i in T.Parallel(block):
                    if k * block + i < cols:
                        partial[i] += T.exp(T.Cast(accum_dtype, x[bx, k * block + i]) - row_max[0])
            T.reduce_sum(partial, denom, dim=0)
            for k in T.serial(T.ceildiv(cols, block)):
                for i in T.Parallel(block):
                    if k * block + i < cols:
                        out[bx, k * block + i] = T.Cast(
                            dtype, T.exp(T.Cast(accum_dtype, x[bx, k * block + i]) - row_max[0]) / denom[0])

    return main


def run(x, out):
    rows, cols = x.shape
    kernel = softmax(rows, cols, BLOCK, THREADS, str(x.dtype).removeprefix("torch."))
    kernel(x, out)
    return out
