"""Outputs against the reference, element by element: the comparison that decides correctness, the
upcast of inputs for the reference (fp32 or better), NaN poisoning of output buffers, and whether
the comparison could tell a kernel that does nothing from the reference (`blind_to_nothing`). Pure
torch; the judge uses it on outputs the kernel process wrote, a worker's own checks (tileloop
check, profile, decision-check) on outputs it computed itself."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class Blind:
    """A comparison that would accept what a kernel that does nothing leaves: `what` it would accept,
    the largest |reference| there, and a fix that makes it fail (`fix_in`: the spec's name to change)."""

    what: str
    largest: float
    fix: str
    fix_in: str


def blind_to_nothing(torch, refs: list[tuple[str | None, object]], atol: float, rtol: float,
                     dtype: str = "") -> Blind | None:
    """Whether the whole comparison (`compare_outputs`, every output) would accept an all-zero output,
    or the output buffers left poisoned as they were; None when both fail it, as they must. Elements
    where zero is within tolerance are fine (a ReLU's negative half): zeros fail on the others."""
    tensors = [r for _, r in refs if isinstance(r, torch.Tensor) and r.numel()]
    if not tensors:
        return None
    largest = max(float(r.detach().abs().max()) if r.dtype != torch.bool else float(bool(r.any())) for r in tensors)
    zeros = [(n, torch.zeros_like(r) if isinstance(r, torch.Tensor) else r) for n, r in refs]
    if compare_outputs(torch, zeros, refs, atol, rtol)["ok"]:
        return Blind("an all-zero output", largest, *_fix(largest, atol, rtol, dtype))
    if all(r.is_floating_point() for r in tensors):
        return None  # poisoned with NaN, which `compare` counts as a mismatch wherever it is
    poisoned = [(n, _poisoned(torch, r) if isinstance(r, torch.Tensor) else r) for n, r in refs]
    if all(p is not None for _, p in poisoned) and compare_outputs(torch, poisoned, refs, atol, rtol)["ok"]:
        return Blind("the poisoned output left as it was", largest,
                     "a reference whose outputs are not the poison value everywhere (inputs that give other outputs)",
                     "make_inputs")
    return None


def _poisoned(torch, ref):
    """What `poison` leaves in a buffer of the reference's dtype (None for a dtype it cannot poison)."""
    if ref.dtype == torch.bool or ref.is_complex():
        return None
    out = ref.detach().clone()
    poison(torch, out)
    return out


def _fix(largest: float, atol: float, rtol: float, dtype: str) -> tuple[str, str]:
    """(fix, the spec's name it changes) that makes an all-zero output fail: zeros fail at an element
    when |ref| > atol + rtol * |ref|, that is when atol < |ref| * (1 - rtol)."""
    of = f" of {dtype}" if dtype else ""
    if largest == 0:
        return ("the reference is zero everywhere here: make_inputs must give inputs whose outputs are not all zero "
                "at every correctness shape (a shape of a few elements can be all zero by chance: give it more)",
                "make_inputs")
    if rtol >= 1:
        return f"rtol{of} in TOLERANCES must be below 1 (zero is within rtol=1 of any value)", "TOLERANCES"
    return (f"an atol{of} in TOLERANCES below {largest * (1 - rtol):.2g} (the largest |reference| here is "
            f"{largest:.3g}), or inputs scaled so that the outputs are larger than atol={atol:g}", "TOLERANCES")


def hidden_fraction(torch, ref, atol: float, rtol: float) -> tuple[float, int]:
    """Among the elements whose reference is not zero, the fraction where an all-zero output would be
    accepted, and how many such elements there are: a tolerance as large as most of the outputs
    hides a kernel wrong there. Elements whose reference is exactly zero say nothing of it."""
    if not isinstance(ref, torch.Tensor) or ref.dtype == torch.bool or not ref.is_floating_point():
        return 0.0, 0
    r = ref.detach().to(torch.float64).abs()
    nonzero = r[r != 0]
    if not nonzero.numel():
        return 0.0, 0
    return float((nonzero <= atol + rtol * nonzero).double().mean()), int(nonzero.numel())


def check_inputs_unchanged(torch, inputs: dict, snapshot: dict) -> str | None:
    for name, before in snapshot.items():
        if not torch.equal(inputs[name], before):
            return f"input {name!r} was modified by the kernel"
    return None
