"""The correctness harness: the spec's fresh inputs, its reference at fp32 or better, poisoned
outputs, and the comparison of every output element (`Harness.check_one`)."""

from __future__ import annotations

from loop.worker.failures import SpecError, call_impl
from loop.worker.spec import Spec


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
    if not isinstance(ref, torch.Tensor):  # a non-tensor output (a size, a flag): equal or not
        ok = type(out) is type(ref) and out == ref
        return {"ok": ok, "max_abs_err": 0.0, "max_rel_err": 0.0, "mismatched": 0 if ok else 1, "numel": 1,
                "nonfinite": 0, **({} if ok else {"reason": f"{out!r} where the reference has {ref!r}"})}
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


def as_outputs(value) -> list[tuple[str | None, object]]:
    """A result as (name, value) pairs: a dict by key, a tuple or list by position, anything else alone."""
    if isinstance(value, dict):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, (tuple, list)):
        return [(f"output {i}", v) for i, v in enumerate(value)]
    return [(None, value)]


def compare_outputs(torch, got: list[tuple[str | None, object]], ref: list[tuple[str | None, object]],
                    atol: float, rtol: float) -> dict:
    """Every output against the reference's, in order (by name where both are dicts). One output reads
    as before; with several, the first that fails names itself, and the numbers cover them all."""
    if len(got) != len(ref):
        return {"ok": False, "reason": f"the kernel gave {len(got)} output(s), the reference {len(ref)}"}
    if all(n is not None and not n.startswith("output ") for n, _ in ref) and {n for n, _ in got} == {n for n, _ in ref}:
        lookup = dict(got)
        got = [(n, lookup[n]) for n, _ in ref]
    results = []
    for (name, out), (ref_name, r) in zip(got, ref):
        res = compare(torch, out, r, atol, rtol)
        if not res["ok"]:
            label = name or ref_name
            if len(ref) > 1 and label:
                res["reason"] = f"{label}: {res['reason']}"
            return res
        results.append(res)
    if len(results) == 1:
        return results[0]
    return {"ok": True, "outputs": len(results), "max_abs_err": max(r["max_abs_err"] for r in results),
            "max_rel_err": max(r["max_rel_err"] for r in results), "mismatched": 0,
            "numel": sum(r["numel"] for r in results), "nonfinite": 0}


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
    """Everything the worker does with the spec (a `loop.worker.spec.Spec`), for one device and backend."""

    MAX_ZERO_PASS = 0.10

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

    def check_one(self, module, label: str, shape, dtype: str, seed: int) -> dict:
        torch = self.torch
        inputs = self.make_inputs(shape, dtype, seed)
        snapshot = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in self.outputs}
        refs = as_outputs(self.reference(inputs))
        atol, rtol = self.tolerance(dtype)
        for _, ref in refs:
            if isinstance(ref, torch.Tensor) and (zp := zero_pass_fraction(torch, ref, atol, rtol)) > self.MAX_ZERO_PASS:
                raise SpecError(
                    f"reference at shape {tuple(shape)} {dtype} is near zero relative to atol={atol}: an all-zero "
                    f"output would pass on {zp:.0%} of elements; lower atol in TOLERANCES or scale the inputs")
        self.prepare_call(inputs)
        if self.device == "cuda":
            poison_allocator(torch, sum(r.numel() * r.element_size() for _, r in refs if isinstance(r, torch.Tensor)))
        result = call_impl(label, "call", self.spec.entry(module), **inputs)
        if self.device == "cuda":
            call_impl(label, "call", torch.cuda.synchronize)
        rec = {"label": label, "shape": list(shape), "dtype": dtype, "seed": seed, "atol": atol, "rtol": rtol}
        rec.update(compare_outputs(torch, self.outputs_of(result, inputs), refs, atol, rtol))
        if rec["ok"] and (msg := check_inputs_unchanged(torch, inputs, snapshot)):
            rec.update(ok=False, reason=msg)
        return rec
