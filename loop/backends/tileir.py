"""`tileir`: nvtriton (Triton-to-tile-IR) with ENABLE_TILE=1, on Blackwell (sm_100+).

Tile IR keeps approx and FTZ off by default; a run that wants them sets TILEIR_ENABLE_APPROX /
TILEIR_ENABLE_FTZ explicitly (they are recorded in the environment fingerprint), never inherited by
accident. A worker proves the kernels really went through Tile IR (`loop.worker.proof`): a silent
fallback to PTX is recorded as such, never labelled Tile IR."""

from __future__ import annotations

from loop.backends.base import Availability, Backend, cuda_missing


def check(probe: dict) -> Availability:
    if (bad := cuda_missing(probe)) is not None:
        return bad
    if not probe.get("nvtriton"):
        return Availability(False, "nvtriton not installed (triton.backends.tileir is not importable)")
    major = (probe.get("capability") or [0, 0])[0]
    if major < 10:
        cap = ".".join(map(str, probe.get("capability") or []))
        return Availability(False, f"Tile IR through nvtriton needs Blackwell (sm_100+); this GPU is sm_{cap.replace('.', '')}")
    return Availability(True)


TILEIR = Backend("tileir", "triton", "cuda", (("ENABLE_TILE", "1"),), ("TRITON_INTERPRET",), check, "gpu",
                 explicit=("TILEIR_ENABLE_APPROX", "TILEIR_ENABLE_FTZ"))
