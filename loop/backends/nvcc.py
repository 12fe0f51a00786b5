"""`nvcc`: CUDA C targets (a `.cu` file with `extern "C" void solve(...)`), built by nvcc into a shared
library and called through ctypes, on a CUDA GPU. Its builds need no GPU (`tileloop compile`,
`tileloop check`, the compile gate); its judged timing is not written yet, so a run cannot pick it."""

from __future__ import annotations

from loop.backends.base import Availability, Backend, cuda_missing

NOT_JUDGED = ("CUDA C targets are built and checked (tileloop compile, tileloop check) but not yet timed by the judge: "
              "no run decides on nvcc")


def check(probe: dict) -> Availability:
    if (bad := cuda_missing(probe)) is not None:
        return bad
    return Availability(False, NOT_JUDGED)


NVCC = Backend("nvcc", "cuda", "cuda", (), ("TRITON_INTERPRET",), check, "gpu")
