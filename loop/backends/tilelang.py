"""`tilelang`: TileLang kernels (`@tilelang.jit`), lowered by TileLang's own TVM and built by nvcc, on a
CUDA GPU. Its builds need no GPU (`tileloop compile`, `tileloop check`, the compile gate, for `sm_90a`
and `sm_100a`); its judged timing needs a GPU and TileLang importable (the probe's `tilelang_importable`).

In the judge's kernel process a target loads as a Python module; its kernels compile at their first
call, in the checks or the warm-up (never in a timed call), for the device's target (`sm_90a` on an
sm_90 device: `loop.worker.tilelang_build.target_of`), into the implementation's own cache folder.
Every TileLang execution backend (tvm_ffi, its default; cython; nvrtc) launches on torch's current
stream, so its kernels are captured in CUDA graphs and timed as the other languages' kernels are."""

from __future__ import annotations

from loop.backends.base import Availability, Backend, cuda_missing
from loop.common import tilelang_install


def check(probe: dict) -> Availability:
    """Available where a CUDA device is visible and the probe found TileLang importable; otherwise
    unavailable with what is missing and what installs it."""
    if (bad := cuda_missing(probe)) is not None:
        return bad
    if not probe.get("tilelang_importable"):
        return Availability(False, probe.get("tilelang_reason") or f"tilelang is not installed: "
                                                                    f"{tilelang_install.INSTALL_HINT}")
    return Availability(True)


TILELANG = Backend("tilelang", "tilelang", "cuda", (), ("TRITON_INTERPRET",), check, "gpu")
