"""softmax in TileLang, first version: one row per program, three passes over the row in small chunks
(the row's maximum, the sum of exponentials, the output), one thread per element of a chunk, every
element's bound checked, float32 arithmetic, no pipelining, no autotune.

The rows and columns are dynamic sizes (`T.dynamic`), not compile-time constants: a kernel compiles
once per (block, threads, dtype, vector), not once per shape, so a measurement that checks and times
it at a dozen shapes per dtype builds at most two kernels per dtype. `vector` is the number of
elements in 16 bytes where the row length is a multiple of it, else 1 (`run` chooses); the kernel
states it to TileLang (`T.assume`), which then loads a thread's elements of a chunk in 16-byte
vectors, as it did when it saw the row length as a constant."""

import tilelang
import tilelang.language as T

BLOCK = 128
THREADS = 128
VECTOR_BYTES = 16  # the widest load a thread makes


@tilelang.jit
def softmax(block, threads, dtype, vector, accum_dtype="float32"):
    rows, cols = T.dynamic("rows, cols")

    @T.prim_func
    def main(x: T.Tensor((rows, cols), dtype), out: T.Tensor((rows, cols), dtype)):
        with T.Kernel(rows, threads=threads) as bx:
            T.assume(cols % vector == 0)
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


def vector_of(cols: int, element_size: int) -> int:
    """The elements of a 16-byte load where a row of `cols` is made of them, else 1."""
    vector = max(VECTOR_BYTES // element_size, 1)
    return vector if cols % vector == 0 else 1


def run(x, out):
    vector = vector_of(x.shape[1], x.element_size())
    kernel = softmax(BLOCK, THREADS, str(x.dtype).removeprefix("torch."), vector)
    kernel(x, out)
    return out
