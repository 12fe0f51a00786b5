"""Timing in the kernel process: every implementation interleaved on the same input sets
(`time_interleaved`, with the one timing routine of `loop.common.timing`), for the judged
measurement (`loop.worker.serve`) and, with the recheck of what the timed run wrote and the
physical units, for decision-check's in-process trials (`bench_shape`)."""

from __future__ import annotations

from loop.common import timing
from loop.common.jobs import seed_for
from loop.common.outputs import as_outputs, compare_outputs, poison
from loop.worker.correctness import Harness
from loop.worker.failures import call_impl


def tuned_configs(module) -> dict[str, str]:
    """The configs a kernel tuned at run time has picked so far, by input key: the cutile-autotune
    convention (module-level `_TUNED`: key -> (config, kernel)) and Triton autotuners (`cache`:
    key -> Config). A pick made in the timing process is what was timed; another process may pick
    differently, and this makes it visible. Never raises: a record, not a check."""
    picks: dict[str, str] = {}
    try:
        tuned = getattr(module, "_TUNED", None)
        if isinstance(tuned, dict):
            for key, value in list(tuned.items()):
                picks[repr(key)[:300]] = repr(value[0] if isinstance(value, tuple) and value else value)[:300]
        for name, obj in list(vars(module).items()):
            cache = getattr(obj, "cache", None)
            if isinstance(cache, dict) and isinstance(getattr(obj, "configs", None), list):
                for key, cfg in list(cache.items()):
                    picks[f"{name}{repr(key)}"[:300]] = str(cfg)[:300]
    except Exception:  # noqa: BLE001 - an odd module attribute must not fail a measurement
        pass
    return picks


def bench_shape(torch, harness: Harness, modules: dict, job: dict, shape: tuple, dtype: str, plan) -> dict:
    """One benchmark shape: every implementation timed interleaved on the same input sets, then what
    the timed run wrote checked again, and the samples summarised in physical units."""
    spec, device = harness.spec, job["device"]
    base_seed = seed_for(job["seed"], "bench", shape, dtype)
    sets, notes = _input_sets(torch, harness, device, shape, dtype, base_seed)
    labels = list(modules)
    tuned_before = {lab: tuned_configs(modules[lab]) for lab in labels}  # picks made for this shape come after
    entries = {lab: spec.entry(modules[lab]) for lab in labels}
    res, last_results, peak = time_interleaved(torch, harness.clock, entries, sets, device, plan)
    recheck = {lab: _recheck(torch, harness, lab, sets, last_results[lab], res.replay[lab], device,
                             (shape, dtype, base_seed)) for lab in labels}
    flops = spec.flops(shape, dtype)
    nbytes = spec.bytes_moved(shape, dtype)
    impls = {}
    for lab in labels:
        impls[lab] = {**timing.in_units(res.samples_ms[lab], flops, nbytes), "peak_mem_mb": peak.get(lab)}
        picked = {k: v for k, v in tuned_configs(modules[lab]).items() if k not in tuned_before[lab]}
        if picked:
            impls[lab]["tuned"] = picked
    entry = {"shape": list(shape), "dtype": dtype, "method": res.method, "calls_per_sample": res.calls_per_sample,
             "notes": notes + res.notes, "impls": impls, "recheck": recheck, "flops": flops, "bytes": nbytes}
    if device == "cuda" and job.get("clone_bandwidth", True):  # off where only the comparison counts (decision-check)
        entry["clone"] = timing.clone_bandwidth(torch, harness.clock, nbytes, plan)
        timing.add_clone_fractions(entry)
    return entry




def _input_sets(torch, harness: Harness, device: str, shape: tuple, dtype: str, base_seed: int) -> tuple[list[dict], list[str]]:
    """The input sets the timed calls rotate over (`timing.rotating_sets`), fresh from the spec."""
    first = harness.make_inputs(shape, dtype, base_seed)
    in_bytes = sum(v.numel() * v.element_size() for v in first.values() if isinstance(v, torch.Tensor))
    nsets, notes = timing.rotating_sets(torch, in_bytes, device)
    return [first] + [harness.make_inputs(shape, dtype, base_seed + j) for j in range(1, nsets)], notes


def time_interleaved(torch, clock, entries: dict, sets: list[dict], device: str, plan):
    """Time every implementation (label -> the function called with an input set) interleaved on the
    same input sets; returns the timing result, what each call returned (per label and input set)
    and the peak memory of one call per label (GPU)."""
    nsets, labels = len(sets), list(entries)
    # every implementation reads the same input sets (the same memory): separate copies showed a
    # systematic ~1-3% difference between identical kernels on an H200 (placement, not code)
    last_results: dict[str, list] = {lab: [None] * nsets for lab in labels}

    def guard(label):
        run, store = entries[label], last_results[label]

        def fn(j):
            store[j] = call_impl(label, "call", run, **sets[j])
        return fn

    guarded = {lab: guard(lab) for lab in labels}
    peak = {}
    if device == "cuda":
        for lab in labels:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            guarded[lab](0)
            torch.cuda.synchronize()
            peak[lab] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 3)
        res = call_impl(labels[-1], "call", timing.time_gpu, torch, clock, guarded, nsets, plan)
    else:
        res = timing.time_cpu({lab: (lambda lab=lab: guarded[lab](0)) for lab in labels}, plan)
    return res, last_results, peak


def _recheck(torch, harness: Harness, lab: str, sets: list[dict], results: list, replay, device: str, point: tuple) -> dict:
    """What the timed work itself writes: fresh data in the same buffers (a kernel that caches
    results by shape or pointer fails here), outputs poisoned, the timed work replayed, checked."""
    shape, dtype, base_seed = point
    nsets = len(sets)
    atol, rtol = harness.tolerance(dtype)
    refs: list = [None, None]
    for j in ([0, 1] if nsets > 1 else [0]):
        fresh = harness.make_inputs(shape, dtype, seed_for(base_seed, "recheck", lab, j))
        for k, v in fresh.items():
            if isinstance(v, torch.Tensor) and k not in harness.outputs:
                sets[j][k].copy_(v)
        refs[j] = harness.reference(sets[j])
    for j, s in enumerate(sets):
        harness.prepare_call(s)
        for _, returned in as_outputs(results[j]):
            if isinstance(returned, torch.Tensor):  # a graph's own output buffer
                poison(torch, returned)
    call_impl(lab, "call", replay)
    if device == "cuda":
        call_impl(lab, "call", torch.cuda.synchronize)
    used = range(nsets) if device == "cuda" else range(1)
    outs = {j: harness.outputs_of(results[j], sets[j]) for j in used}
    rc = compare_outputs(torch, outs[0], as_outputs(refs[0]), atol, rtol)
    if rc["ok"] and 1 in outs:
        rc = compare_outputs(torch, outs[1], as_outputs(refs[1]), atol, rtol)
    for j in used:
        for _, o in outs[j]:
            if rc["ok"] and isinstance(o, torch.Tensor) and o.is_floating_point() and not bool(torch.isfinite(o).all()):
                rc = {"ok": False, "reason": f"input set {j}: output has NaN/inf after the timed run (unwritten)"}
    return rc
