"""The correctness check run inside a worker, on outputs the worker computed itself: for the jobs
that judge no candidate (tileloop check of the user's own kernel, profile, decision-check). A
candidate's correctness is decided by the judge (`loop.judge`), never here."""

from __future__ import annotations

from loop.common.harness import Harness as _Harness
from loop.common.outputs import poison_allocator
from loop.worker.failures import call_impl


class Harness(_Harness):
    """The spec's check with the kernel called in this process."""

    def check_one(self, module, label: str, shape, dtype: str, seed: int) -> dict:
        torch = self.torch

        def call(inputs: dict, refs: list) -> list:
            if self.device == "cuda":
                poison_allocator(torch, sum(r.numel() * r.element_size() for _, r in refs if isinstance(r, torch.Tensor)))
            result = call_impl(label, "call", self.spec.entry(module), **inputs)
            if self.device == "cuda":
                call_impl(label, "call", torch.cuda.synchronize)
            return self.outputs_of(result, inputs)

        return self.check_with(call, label, shape, dtype, seed)
