"""The correctness check, whoever runs the kernel: the spec's fresh inputs (never all zero), its
reference at fp32 or better on copies of them, output buffers poisoned, every output compared, the
inputs checked unmodified; a spec whose comparison would accept an all-zero output, or the poisoned
buffers left as they were, refused (`NothingPasses`). `Harness.check_with(call, ...)` takes the call
of the kernel as a function: the judge passes one that hands the inputs to the kernel process and
reads back what it wrote; a worker's own checks (tileloop check, profile, decision-check) call the
kernel in-process."""

from __future__ import annotations

from typing import Callable

from loop.common.errors import SpecError
from loop.common.outputs import Blind, as_outputs, blind_to_nothing, check_inputs_unchanged, compare_outputs, \
    hidden_fraction, poison, upcast
from loop.common.spec import Spec

# call(inputs, refs) -> what the kernel produced, as (name, value) pairs (see Harness.outputs_of)
KernelCall = Callable[[dict, list], list]


class NothingPasses(SpecError):
    """The comparison at a shape and dtype would accept what a kernel that does nothing leaves (an
    all-zero output, or the poisoned buffers): the spec is no test there. `blind` holds the fix."""

    def __init__(self, blind: Blind, shape, dtype: str, atol: float, rtol: float):
        self.blind, self.shape, self.dtype = blind, tuple(shape), dtype
        super().__init__(f"{blind.what} would pass the whole comparison at shape {self.shape} {dtype} (atol={atol:g}, "
                         f"rtol={rtol:g}, largest |reference| {blind.largest:.3g}): a kernel that does nothing would "
                         f"be judged correct; fix: {blind.fix}")


class Harness:
    """Everything done with the spec for one device: inputs, reference, tolerances, the check."""

    # outputs this small can be near zero everywhere by chance (a ReLU's 7 outputs are all zero one
    # time in 128): such a check compares as usual and is not refused; the larger shapes test the spec
    MIN_BLIND_ELEMENTS = 64
    # a tolerance that accepts zeros on more than this share of the nonzero outputs is named (`notes`)
    HIDDEN_SHARE = 0.5
    # below this many nonzero elements a share says nothing (one element of seven is 14%)
    HIDDEN_MIN_ELEMENTS = 16

    def __init__(self, torch, spec: Spec, device: str, clock=None):
        self.torch, self.spec, self.device, self.clock = torch, spec, device, clock
        self.outputs = spec.outputs
        # (shape, dtype, share, atol) where the tolerance hides most nonzero outputs: a warning of
        # `tileloop check`, never a refusal (zeros still fail the whole comparison there)
        self.notes: list[tuple[tuple, str, float, float]] = []

    def make_inputs(self, shape, dtype: str, seed: int) -> dict:
        inputs = self.spec.make_inputs(shape, dtype, seed, self.device)
        for name, value in inputs.items():
            if isinstance(value, self.torch.Tensor) and name not in self.outputs and value.numel() and not bool(value.any()):
                raise SpecError(f"make_inputs gave an all-zero input {name!r}: inputs must be random")
        return inputs

    def reference(self, inputs: dict):
        ref_inputs = {k: upcast(self.torch, v.clone() if isinstance(v, self.torch.Tensor) else v) for k, v in inputs.items()}
        return self.spec.module.reference(**ref_inputs)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return self.spec.tolerance(dtype)

    def outputs_of(self, result, inputs: dict) -> list[tuple[str | None, object]]:
        """What the kernel produced: what its entry point returned, or, when that is None, the OUTPUTS
        buffers among the inputs (written in place)."""
        if result is None:
            written = [(name, inputs[name]) for name in self.outputs if name in inputs]
            return written if len(written) != 1 else [(None, written[0][1])]
        return as_outputs(result)

    def prepare_call(self, inputs: dict):
        for name in self.outputs:
            if isinstance(inputs.get(name), self.torch.Tensor):
                poison(self.torch, inputs[name])

    def references(self, inputs: dict, shape, dtype: str) -> list:
        """The reference's outputs for `inputs`; `NothingPasses` when the whole comparison would accept
        an all-zero output or the poisoned buffers (an output that is zero on part of its elements,
        a ReLU's, is fine: zeros fail on the rest)."""
        refs = as_outputs(self.reference(inputs))
        atol, rtol = self.tolerance(dtype)
        blind = blind_to_nothing(self.torch, refs, atol, rtol, dtype)
        elements = sum(r.numel() for _, r in refs if isinstance(r, self.torch.Tensor))
        if blind is not None and (elements >= self.MIN_BLIND_ELEMENTS or rtol >= 1):
            raise NothingPasses(blind, shape, dtype, atol, rtol)
        for _, ref in refs:
            share, count = hidden_fraction(self.torch, ref, atol, rtol)
            if share > self.HIDDEN_SHARE and share * count >= self.HIDDEN_MIN_ELEMENTS:
                self.notes.append((tuple(shape), dtype, share, atol))
        return refs

    def check_with(self, call: KernelCall, label: str, shape, dtype: str, seed: int) -> dict:
        """One check of `label` at (shape, dtype) on fresh inputs from `seed`."""
        torch = self.torch
        inputs = self.make_inputs(shape, dtype, seed)
        snapshot = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in self.outputs}
        refs = self.references(inputs, shape, dtype)
        atol, rtol = self.tolerance(dtype)
        self.prepare_call(inputs)
        got = call(inputs, refs)
        rec = {"label": label, "shape": list(shape), "dtype": dtype, "seed": seed, "atol": atol, "rtol": rtol}
        rec.update(compare_outputs(torch, got, refs, atol, rtol))
        if rec["ok"] and (msg := check_inputs_unchanged(torch, inputs, snapshot)):
            rec.update(ok=False, reason=msg)
        return rec
