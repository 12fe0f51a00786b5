"""`ptx`: stock Triton compiling through PTX (ENABLE_TILE=0), on a CUDA GPU."""

from __future__ import annotations

from loop.backends.base import Availability, Backend, cuda_missing


def check(probe: dict) -> Availability:
    if (bad := cuda_missing(probe)) is not None:
        return bad
    if not probe.get("triton_version"):
        return Availability(False, "triton is not importable")
    return Availability(True)


PTX = Backend("ptx", "triton", "cuda", (("ENABLE_TILE", "0"),),
              ("TRITON_INTERPRET", "TILEIR_ENABLE_APPROX", "TILEIR_ENABLE_FTZ"), check, "gpu")
