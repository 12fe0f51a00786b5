"""The correctness harness: the spec's fresh inputs, its reference at fp32 or better, poisoned
outputs, and the comparison of every output element (`Harness.check_one`)."""

from __future__ import annotations

import inspect

from loop.worker.failures import SpecError, call_impl


def upcast(torch, value):
    """fp16/bf16 -> fp32, fp32 -> fp64; the reference is computed at fp32 or better."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float64 if value.dtype in (torch.float32, torch.float64) else torch.float32)
    return value


def poison(torch, tensor):
    if tensor.is_floating_point():
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max)


def poison_allocator(torch, nbytes: int):
    """Fill freed CUDA caching-allocator blocks with NaN, so a kernel that allocates its output
    and leaves part unwritten reads NaN rather than a lucky earlier result."""
    if nbytes <= 0:
        return
    blocks = [torch.full((max(nbytes // 4, 1),), float("nan"), dtype=torch.float32, device="cuda") for _ in range(2)]
    del blocks


def compare(torch, out, ref, atol: float, rtol: float) -> dict:
    if not isinstance(out, torch.Tensor):
        return {"ok": False, "reason": f"run() returned {type(out).__name__}, not a tensor"}
    if tuple(out.shape) != tuple(ref.shape):
        return {"ok": False, "reason": f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}"}
    o = out.detach().to(torch.float64)
    r = ref.detach().to(o.device, torch.float64)
    diff = (o - r).abs()
    bound = atol + rtol * r.abs()
    bad = ~(diff <= bound)  # NaN in the output counts as a mismatch
    nonfinite = int((~torch.isfinite(o)).sum())
    n_bad = int(bad.sum())
    finite = torch.isfinite(diff)
    max_abs = float(diff[finite].max()) if bool(finite.any()) else float("inf")
    big = r.abs() > atol
    rel = diff[big & finite] / r.abs()[big & finite]
    res = {
        "ok": n_bad == 0,
        "max_abs_err": max_abs,
        "max_rel_err": float(rel.max()) if rel.numel() else 0.0,
        "mismatched": n_bad,
        "numel": int(o.numel()),
        "nonfinite": nonfinite,
    }
    if n_bad:
        res["reason"] = f"{n_bad}/{o.numel()} elements outside atol={atol} rtol={rtol}" + (
            f" ({nonfinite} NaN/inf: unwritten or poisoned output)" if nonfinite else "")
    return res


def zero_pass_fraction(torch, ref, atol: float, rtol: float) -> float:
    """Fraction of elements where an all-zero output would be accepted."""
    r = ref.detach().to(torch.float64).abs()
    return float((r <= atol + rtol * r).double().mean())


def check_inputs_unchanged(torch, inputs: dict, snapshot: dict) -> str | None:
    for name, before in snapshot.items():
        if not torch.equal(inputs[name], before):
            return f"input {name!r} was modified by the kernel"
    return None


class Harness:
    """Everything the worker does with the spec, for one device and backend."""

    MAX_ZERO_PASS = 0.10

    def __init__(self, torch, spec, device: str, clock=None):
        self.torch, self.spec, self.device, self.clock = torch, spec, device, clock
        self.outputs = tuple(getattr(spec, "OUTPUTS", ("out",)))
        self.accepts_device = "device" in inspect.signature(spec.make_inputs).parameters

    def dtype(self, name: str):
        return getattr(self.torch, name)

    def make_inputs(self, shape, dtype: str, seed: int) -> dict:
        kwargs = {"device": self.device} if self.accepts_device else {}
        inputs = self.spec.make_inputs(tuple(shape), self.dtype(dtype), seed, **kwargs)
        if not isinstance(inputs, dict):
            raise SpecError(f"make_inputs returned {type(inputs).__name__}, not a dict")
        for name, value in inputs.items():
            if isinstance(value, self.torch.Tensor) and name not in self.outputs and value.numel() and not bool(value.any()):
                raise SpecError(f"make_inputs gave an all-zero input {name!r}: inputs must be random")
        return inputs

    def reference(self, inputs: dict):
        ref_inputs = {k: upcast(self.torch, v.clone() if isinstance(v, self.torch.Tensor) else v) for k, v in inputs.items()}
        return self.spec.reference(**ref_inputs)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        try:
            atol, rtol = self.spec.TOLERANCES[dtype]
        except KeyError:
            raise SpecError(f"TOLERANCES has no entry for {dtype}") from None
        return float(atol), float(rtol)

    def output_of(self, result, inputs: dict):
        if result is None:
            for name in self.outputs:
                if name in inputs:
                    return inputs[name]
        return result

    def prepare_call(self, inputs: dict):
        for name in self.outputs:
            if isinstance(inputs.get(name), self.torch.Tensor):
                poison(self.torch, inputs[name])

    def check_one(self, module, label: str, shape, dtype: str, seed: int) -> dict:
        torch = self.torch
        inputs = self.make_inputs(shape, dtype, seed)
        snapshot = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in self.outputs}
        ref = self.reference(inputs)
        atol, rtol = self.tolerance(dtype)
        zp = zero_pass_fraction(torch, ref, atol, rtol)
        if zp > self.MAX_ZERO_PASS:
            raise SpecError(
                f"reference at shape {tuple(shape)} {dtype} is near zero relative to atol={atol}: an all-zero "
                f"output would pass on {zp:.0%} of elements; lower atol in TOLERANCES or scale the inputs")
        self.prepare_call(inputs)
        if self.device == "cuda":
            poison_allocator(torch, ref.numel() * ref.element_size())
        result = call_impl(label, "call", module.run, **inputs)
        if self.device == "cuda":
            call_impl(label, "call", torch.cuda.synchronize)
        rec = {"label": label, "shape": list(shape), "dtype": dtype, "seed": seed, "atol": atol, "rtol": rtol}
        rec.update(compare(torch, self.output_of(result, inputs), ref, atol, rtol))
        if rec["ok"] and (msg := check_inputs_unchanged(torch, inputs, snapshot)):
            rec.update(ok=False, reason=msg)
        return rec
