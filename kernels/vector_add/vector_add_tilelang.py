"""vector_add in TileLang, first version: one small block of elements per program, one thread per
element, every element's bound checked, no pipelining, no autotune.

The length is a dynamic size (`T.dynamic`), not a compile-time constant: a kernel compiles once per
(block, threads, dtype, vector), not once per shape, so a measurement that checks and times it at a
dozen shapes per dtype builds at most two kernels per dtype. `vector` is the number of elements in 16
bytes where the length is a multiple of it, else 1 (`run` chooses); the kernel states it to TileLang
(`T.assume`), so that it may load a thread's elements in 16-byte vectors, as a constant length let it."""

import tilelang
import tilelang.language as T

BLOCK = 128
THREADS = 128
VECTOR_BYTES = 16  # the widest load a thread makes


@tilelang.jit
def vector_add(block, threads, dtype, vector):
    n = T.dynamic("n")

    @T.prim_func
    def main(x: T.Tensor((n,), dtype), y: T.Tensor((n,), dtype), out: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, block), threads=threads) as bx:
            T.assume(n % vector == 0)
            for i in T.Parallel(block):
                if bx * block + i < n:
                    out[bx * block + i] = x[bx * block + i] + y[bx * block + i]

    return main


def vector_of(n: int, element_size: int) -> int:
    """The elements of a 16-byte load where a length of `n` is made of them, else 1."""
    vector = max(VECTOR_BYTES // element_size, 1)
    return vector if n % vector == 0 else 1


def run(x, y, out):
    vector = vector_of(out.numel(), out.element_size())
    kernel = vector_add(BLOCK, THREADS, str(out.dtype).removeprefix("torch."), vector)
    kernel(x, y, out)
    return out
