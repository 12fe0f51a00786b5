"""`interpreter`: Triton kernels under TRITON_INTERPRET=1 on the CPU (`--device cpu`). Its timings
are CPU interpreter timings, labelled as such everywhere, never GPU numbers."""

from __future__ import annotations

from loop.backends.base import Availability, Backend


def check(probe: dict) -> Availability:
    if not probe.get("triton_version"):
        return Availability(False, "triton is not importable")
    return Availability(True)


INTERPRETER = Backend("interpreter", "triton", "cpu", (("TRITON_INTERPRET", "1"), ("ENABLE_TILE", "0")), (), check,
                      "interpreter")
