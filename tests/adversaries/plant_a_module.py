"""The incumbent's own code, unchanged, and modules planted where the next processes would import
them: at import (in the kernel process, and in any worker that imports it) it writes `statistics.py`
and `torch.py` into the next few iteration folders of its run (a judge's and a zygote's working
folder, once first on their sys.path). Were they imported, the next
judge's statistics (its verdicts) and the next kernel processes' torch would be its code; each
planted module only records that it ran (`PLANTED` beside it) and hands over to the real one. Where
the kernel process sees the machine read-only, nothing is written; elsewhere PYTHONSAFEPATH keeps
an iteration's folder off its judge's sys.path."""

import os
import re
from pathlib import Path

import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 1
PLANTED = "planted-module-ran"
HANDOVER = '''import sys, pathlib
pathlib.Path(__file__).with_name("{planted}").write_text(repr(sys.argv))
here = str(pathlib.Path(__file__).parent)
sys.path[:] = [p for p in sys.path if p not in ("", here)]
del sys.modules[__name__]
import {name}
'''


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


def _plant() -> None:
    here = Path.cwd()  # a kernel process's: its iteration's folder (logs/iter-NNN), or a folder of it
    for folder in (here, *here.parents):
        found = re.fullmatch(r"iter-(\d+)", folder.name)
        if found:
            later = [folder.parent / f"iter-{int(found.group(1)) + k:03d}" for k in (1, 2, 3)]
            break
    else:
        later = []
    for target in later:
        for name in ("statistics", "torch"):
            try:
                target.mkdir(parents=True, exist_ok=True)
                (target / f"{name}.py").write_text(HANDOVER.format(planted=PLANTED, name=name))
            except OSError:
                pass  # a read-only view: nothing planted
    os.environ.pop("PYTHONSAFEPATH", None)  # in its own process only: what the next ones get is not its to change


_plant()
