"""`nvcc`: CUDA C targets (a `.cu` file with `extern "C" void solve(...)`), built by nvcc into a shared
library and called through ctypes, on a CUDA GPU. Its builds need no GPU (`tileloop compile`,
`tileloop check`, the compile gate); its judged timing needs a GPU and an nvcc (the kernel process
builds each implementation for the device's architecture, `loop.worker.cuda_build`).

How a target is timed follows its form (`loop.common.cuda_c.timed_form`, `timing`): the seed
skill's solve synchronises, so it is timed eagerly, call by call (the judge's choice,
`loop.judge.choose_forms`); the stream form launches on the stream it is given and is captured in a
CUDA graph, as the other languages' kernels are."""

from __future__ import annotations

from loop.backends.base import Availability, Backend, cuda_missing
from loop.common import cuda_c, nvcc

TIMING = cuda_c.TIMING  # form -> how it is timed, and why (the judge's note reads the same text)


def timing(form: str) -> str:
    """How a target of this form is timed, and why, in one line."""
    return TIMING[form]


def check(probe: dict) -> Availability:
    """Available where a CUDA device is visible and the probe found an nvcc (its fingerprint's
    `nvcc_release`); otherwise unavailable with what is missing and what installs it."""
    if (bad := cuda_missing(probe)) is not None:
        return bad
    if not probe.get("nvcc_release"):
        return Availability(False, nvcc.why_none())
    return Availability(True)


NVCC = Backend("nvcc", "cuda", "cuda", (), ("TRITON_INTERPRET",), check, "gpu")
