"""`tilelang`: TileLang kernels (`@tilelang.jit`), lowered by TileLang's own TVM and built by nvcc, on a
CUDA GPU. Its builds need no GPU (`tileloop compile`, `tileloop check`, the compile gate, for `sm_90a`
and `sm_100a`); its judged timing is not written yet, so a run cannot pick it."""

from __future__ import annotations

from loop.backends.base import Availability, Backend, cuda_missing

NOT_JUDGED = ("TileLang targets are built and checked (tileloop compile, tileloop check) but not yet timed by the "
              "judge: no run decides on tilelang")


def check(probe: dict) -> Availability:
    if (bad := cuda_missing(probe)) is not None:
        return bad
    return Availability(False, NOT_JUDGED)


TILELANG = Backend("tilelang", "tilelang", "cuda", (), ("TRITON_INTERPRET",), check, "gpu")
