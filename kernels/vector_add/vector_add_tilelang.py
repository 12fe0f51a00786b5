"""vector_add in TileLang, first version: one small block of elements per program, one thread per
element, every element's bound checked, no pipelining, no autotune."""

import tilelang
import tilelang.language as T

BLOCK = 128
THREADS = 128


@tilelang.jit
def vector_add(n, block, threads, dtype):
    @T.prim_func
    def main(x: T.Tensor((n,), dtype), y: T.Tensor((n,), dtype), out: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, block), threads=threads) as bx:
            for i in T.Parallel(block):
                if bx * block + i < n:
                    out[bx * block + i] = x[bx * block + i] + y[bx * block + i]

    return main


def run(x, y, out):
    kernel = vector_add(out.numel(), BLOCK, THREADS, str(out.dtype).removeprefix("torch."))
    kernel(x, y, out)
    return out
