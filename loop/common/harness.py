"""The correctness check, whoever runs the kernel: the spec's fresh inputs (never all zero), its
reference at fp32 or better on copies of them, output buffers poisoned, every output compared, the
inputs checked unmodified. `Harness.check_with(call, ...)` takes the call of the kernel as a
function: the judge passes one that hands the inputs to the kernel process and reads back what it
wrote; a worker's own checks (tileloop check, profile, decision-check) call the kernel in-process."""

from __future__ import annotations

from typing import Callable

from loop.common.errors import SpecError
from loop.common.outputs import as_outputs, check_inputs_unchanged, compare_outputs, poison, upcast, zero_pass_fraction
from loop.common.spec import Spec

# call(inputs, refs) -> what the kernel produced, as (name, value) pairs (see Harness.outputs_of)
KernelCall = Callable[[dict, list], list]


class Harness:
    """Everything done with the spec for one device: inputs, reference, tolerances, the check."""

    MAX_ZERO_PASS = 0.10
    # below this many elements a fraction says nothing: one element of seven near zero is 14%
    # (seen on an H100 with Liger's layer_norm at 1x7 fp16); a spec weak everywhere fails at its other shapes
    MIN_ZERO_PASS_ELEMENTS = 16

    def __init__(self, torch, spec: Spec, device: str, clock=None):
        self.torch, self.spec, self.device, self.clock = torch, spec, device, clock
        self.outputs = spec.outputs

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
        """The reference's outputs for `inputs`; a SpecError when an all-zero output would pass."""
        refs = as_outputs(self.reference(inputs))
        atol, rtol = self.tolerance(dtype)
        for _, ref in refs:
            if (isinstance(ref, self.torch.Tensor) and (zp := zero_pass_fraction(self.torch, ref, atol, rtol)) > self.MAX_ZERO_PASS
                    and zp * ref.numel() >= self.MIN_ZERO_PASS_ELEMENTS):
                raise SpecError(
                    f"reference at shape {tuple(shape)} {dtype} is near zero relative to atol={atol}: an all-zero "
                    f"output would pass on {zp:.0%} of elements; lower atol in TOLERANCES or scale the inputs")
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
