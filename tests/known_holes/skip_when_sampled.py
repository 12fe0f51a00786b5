"""A hole the judge has (docs/architecture.md, "What this does not catch"): the incumbent's own code,
with tileloop's sampler in this process rewritten to skip the call whenever it takes a timed sample,
while the replay the judge checks outputs at still does the work. Its claims and the judge's clock
agree (the requests are short), so only a bound from physics catches it: on a GPU, bytes moved faster
than twice the copy bandwidth; under the interpreter nothing does yet."""

import sys

import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 1


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
    return out


_sampler = sys.modules.get("loop.worker.sampler")
if _sampler is not None:
    _real = _sampler.Sampler.sample
    _sampler.Sampler.sample = lambda self, rnd, empty=False: _real(self, rnd, True)  # timed: never the call
