"""The incumbent's own code, unchanged, and the incumbent's Triton cache written: every folder of
the implementations' caches beside its own (the incumbent's, named after its label and source) gets
a file of its own at import and at every call, and every compiled kernel found there is truncated.
On a GPU the incumbent of the next measurement (the same label and source: the same folder) would
load what it left (a broken or slower kernel) and no check would see why; under the interpreter
nothing is compiled, so only the planted file shows that it got there."""

import os
from pathlib import Path

import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 1
PLANTED = "planted-by-the-candidate"


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def run(x, y, out):
    n = out.numel()
    add_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    _write_the_others()
    return out


def _write_the_others() -> None:
    own = Path(triton.knobs.cache.dir)
    for root in (own.parent, own.parent.parent):  # the implementations' caches, and the cache root above them
        try:
            folders = [p for p in root.iterdir() if p.is_dir() and p.name != own.name]
        except OSError:
            continue
        for folder in folders:
            for dirpath, _, files in os.walk(folder):
                try:
                    (Path(dirpath) / PLANTED).write_text(str(os.getpid()))
                    for name in files:
                        if name.endswith((".cubin", ".so", ".ptx")):
                            (Path(dirpath) / name).write_bytes(b"")
                except OSError:
                    pass


_write_the_others()
