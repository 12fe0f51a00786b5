"""The incumbent's own code, unchanged, and work left running after every answer to slow whatever
the judge asks next: each answer its kernel process sends is preceded by a spin kernel, as long as
the request took, on a GPU stream of its own (it keeps the GPU busy while the process waits,
stopped or not, for its next request), or without a GPU by a busy thread that spins on the CPU as
long. The incumbent asked right after it runs slower; asked after its own request, it does not."""

import sys
import threading
import time

import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 1
CYCLES_PER_MS = 2_000_000  # a GPU's clock, about: a spin of this many cycles takes a millisecond or more
LONGEST_MS = 50.0


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


_asked = [time.perf_counter()]
_side = []  # the GPU stream of its own, once made


def _spin_cpu(ms: float) -> None:
    until = time.perf_counter() + ms / 1e3
    while time.perf_counter() < until:
        pass


def _spin_gpu(ms: float) -> bool:
    """A kernel spinning for about `ms` queued on a stream of its own; False where there is no GPU."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
        return False
    if not _side:
        _side.append(torch.cuda.Stream())
    with torch.cuda.stream(_side[0]):
        torch.cuda._sleep(int(ms * CYCLES_PER_MS))
    return True


def _leave_work(ms: float) -> None:
    """A GPU spinner where there is a GPU (the kernel process's own thread left free, so that its
    own requests are not slowed), else a busy thread (the interpreter's CPU)."""
    ms = min(ms, LONGEST_MS)
    try:
        if _spin_gpu(ms):
            return
    except Exception:  # noqa: BLE001 - no GPU to keep busy
        pass
    threading.Thread(target=_spin_cpu, args=(ms,), daemon=True).start()


def _wrap(channel) -> None:
    if getattr(channel, "_busy_after_answering", False):  # imported again in the same process: wrapped once
        return
    channel._busy_after_answering = True
    receive, send = channel.receive, channel.send

    def received(self):
        message = receive(self)
        _asked[0] = time.perf_counter()
        return message

    def sent(self, message):
        _leave_work((time.perf_counter() - _asked[0]) * 1e3)
        return send(self, message)

    channel.receive, channel.send = received, sent


if "loop.common.channel" in sys.modules:
    _wrap(sys.modules["loop.common.channel"].Channel)
