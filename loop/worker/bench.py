"""Timing at the benchmark shapes: every implementation interleaved on the same input sets
(`loop.worker.timing`), then what the timed run itself wrote checked again, plus GB/s, TFLOP/s and
the same-run copy bandwidth."""

from __future__ import annotations

from loop.common.jobs import seed_for
from loop.common.stats import summarize
from loop.worker import timing
from loop.worker.correctness import Harness, as_outputs, compare_outputs, poison
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


def bench_all(torch, harness: Harness, modules: dict, job: dict, dtypes: list[str]) -> dict:
    spec = harness.spec
    device = job["device"]
    dtype = job.get("bench_dtype") or dtypes[0]
    if device == "cpu":
        shapes = job.get("bench_shapes") or spec.interpreter_shapes
    else:
        shapes = job.get("bench_shapes") or spec.benchmark_shapes
    plan = timing.TimingPlan(**job.get("timing", {}))
    out = []
    for shape in shapes:
        out.append(bench_shape(torch, harness, modules, job, tuple(shape), dtype, plan))
    return {"dtype": dtype, "device": device, "shapes": out}


def bench_shape(torch, harness: Harness, modules: dict, job: dict, shape: tuple, dtype: str, plan) -> dict:
    """One benchmark shape: every implementation timed interleaved on the same input sets, then what
    the timed run wrote checked again, and the samples summarised in physical units."""
    spec, device = harness.spec, job["device"]
    base_seed = seed_for(job["seed"], "bench", shape, dtype)
    sets, notes = _input_sets(torch, harness, device, shape, dtype, base_seed)
    labels = list(modules)
    tuned_before = {lab: tuned_configs(modules[lab]) for lab in labels}  # picks made for this shape come after
    res, last_results, peak = _time_all(torch, harness, modules, sets, device, plan)
    recheck = {lab: _recheck(torch, harness, lab, sets, last_results[lab], res.replay[lab], device,
                             (shape, dtype, base_seed)) for lab in labels}
    flops = spec.flops(shape, dtype)
    nbytes = spec.bytes_moved(shape, dtype)
    impls = {}
    for lab in labels:
        st = summarize(res.samples_ms[lab])
        secs = st.median_ms / 1e3
        impls[lab] = {**st.to_json(), "samples_ms": res.samples_ms[lab], "peak_mem_mb": peak.get(lab),
                      "gbps": nbytes / secs / 1e9 if secs > 0 else None,
                      "tflops": flops / secs / 1e12 if secs > 0 else None}
        picked = {k: v for k, v in tuned_configs(modules[lab]).items() if k not in tuned_before[lab]}
        if picked:
            impls[lab]["tuned"] = picked
    entry = {"shape": list(shape), "dtype": dtype, "method": res.method, "calls_per_sample": res.calls_per_sample,
             "notes": notes + res.notes, "impls": impls, "recheck": recheck, "flops": flops, "bytes": nbytes}
    if device == "cuda" and job.get("clone_bandwidth", True):  # off where only the comparison counts (decision-check)
        entry["clone"] = clone_bandwidth(torch, harness.clock, nbytes, plan)
        for lab in labels:
            if entry["clone"] and impls[lab]["gbps"]:
                impls[lab]["frac_clone_bw"] = impls[lab]["gbps"] / entry["clone"]["gbps"]
    return entry




def _input_sets(torch, harness: Harness, device: str, shape: tuple, dtype: str, base_seed: int) -> tuple[list[dict], list[str]]:
    """The input sets the timed calls rotate over: on a GPU, enough sets to exceed 3x L2 (at most
    MAX_CALLS_PER_GRAPH, at most 1 GiB), so that every call reads cold data; one set on the CPU."""
    first = harness.make_inputs(shape, dtype, base_seed)
    in_bytes = sum(v.numel() * v.element_size() for v in first.values() if isinstance(v, torch.Tensor))
    nsets, notes = 1, []
    if device == "cuda":
        l2 = timing.l2_bytes(torch)
        nsets = int(min(timing.MAX_CALLS_PER_GRAPH, max(1, -(-3 * l2 // max(in_bytes, 1)))))
        nsets = max(1, min(nsets, int(2**30 // max(in_bytes, 1))))
        notes.append(f"{nsets} rotating input set(s) of {in_bytes / 2**20:.2f} MiB ({nsets * in_bytes / l2:.1f}x L2)")
    return [first] + [harness.make_inputs(shape, dtype, base_seed + j) for j in range(1, nsets)], notes


def _time_all(torch, harness: Harness, modules: dict, sets: list[dict], device: str, plan):
    """Time every implementation interleaved; returns the timing result, what each call returned
    (per label and input set) and the peak memory of one call per label (GPU)."""
    nsets, labels = len(sets), list(modules)
    # every implementation reads the same input sets (the same memory): separate copies showed a
    # systematic ~1-3% difference between identical kernels on an H200 (placement, not code)
    last_results: dict[str, list] = {lab: [None] * nsets for lab in labels}

    def guard(label):
        run, store = harness.spec.entry(modules[label]), last_results[label]

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
        res = call_impl(labels[-1], "call", timing.time_gpu, torch, harness.clock, guarded, nsets, plan)
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


def clone_bandwidth(torch, clock, nbytes: float, plan) -> dict | None:
    """Same-run copy bandwidth for the same traffic (read + write = nbytes), the memory roofline."""
    n = int(nbytes // 2)
    if n < 1024:
        return None
    l2 = timing.l2_bytes(torch)
    nsets = int(min(timing.MAX_CALLS_PER_GRAPH, max(1, -(-3 * l2 // n))))
    srcs = [torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda") for _ in range(nsets)]
    dsts = [torch.empty_like(s) for s in srcs]
    res = timing.time_gpu(torch, clock, {"clone": lambda j: dsts[j].copy_(srcs[j])}, nsets, plan)
    st = summarize(res.samples_ms["clone"])
    return {"median_ms": st.median_ms, "gbps": 2 * n / (st.median_ms / 1e3) / 1e9, "method": res.method}
