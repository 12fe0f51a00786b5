"""`nvcc`: CUDA C targets (a `.cu` file with `extern "C" void solve(...)`), built by nvcc into a shared
library and called through ctypes, on a CUDA GPU. Its builds need no GPU (`tileloop compile`,
`tileloop check`, the compile gate); its judged timing is not written yet, so a run cannot pick it.

How a target will be timed follows its form (`loop.common.cuda_c.solve_form`, `timing`): the seed
skill's solve synchronises, so it is timed eagerly, call by call; the stream form launches on the
stream it is given and can be captured in a CUDA graph, as the other languages' kernels are."""

from __future__ import annotations

from loop.backends.base import Availability, Backend, cuda_missing
from loop.common import cuda_c

NOT_JUDGED = ("CUDA C targets are built and checked (tileloop compile, tileloop check) but not yet timed by the judge: "
              "no run decides on nvcc")


TIMING = {
    cuda_c.SYNCHRONISING: "timed eagerly: solve synchronises (it takes no cudaStream_t, so it launches on the default "
                          "stream and may call cudaDeviceSynchronize), and no CUDA graph can capture it",
    cuda_c.STREAM: "the stream form: solve launches on the cudaStream_t it is given, so it can be captured in a CUDA "
                   "graph and timed as the other languages' kernels are",
}


def timing(form: str) -> str:
    """How a target of this form is timed, and why, in one line."""
    return TIMING[form]


def check(probe: dict) -> Availability:
    if (bad := cuda_missing(probe)) is not None:
        return bad
    return Availability(False, NOT_JUDGED)


NVCC = Backend("nvcc", "cuda", "cuda", (), ("TRITON_INTERPRET",), check, "gpu")
