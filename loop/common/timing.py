"""The one timing routine. Callers pass closures; this module owns the clock. The kernel process
times the implementations with it; the judge times the same-run copy bandwidth with it.

GPU: implementations are timed *interleaved* in one process (ABBA order per round), so clock
drift and co-tenants hit incumbent and candidate alike.
  * short calls (< GRAPH_BELOW_MS): each sample is one CUDA-graph replay of `calls` launches that
    rotate over input sets sized to exceed L2, so every call reads cold data and launch overhead
    is not measured; the sample is the replay time / calls.
  * long calls: each sample is one eager call after an L2 flush (a memset of a buffer larger than
    L2) and a spin of the GPU (`sample_events`), both before the start event: the call is launched
    while the GPU spins, and its end event follows it on the stream, with no host round trip
    between the call and either event. (Events around a host synchronize put the host's launch and
    wake-up latency in every sample, a different one in each process: on an H100, A/A pairs timed
    so at 0.06-0.1 ms calls read 0.75x to 1.58x, 40% of them kept.) Work a kernel hides on another
    stream ends before the request's synchronize, which the judge's clock times (`corroborate`).
CPU (Triton interpreter): wall-clock per call, interleaved; labelled as interpreter timings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

GRAPH_BELOW_MS = 0.5
MAX_CALLS_PER_GRAPH = 100
SAMPLE_TARGET_MS = 1.0  # a graph sample should last about this long


@dataclass
class TimingPlan:
    min_reps: int = 15
    max_reps: int = 200
    budget_s: float = 0.4  # wall time per implementation per shape
    use_graphs: bool = True


@dataclass
class TimingResult:
    method: str
    calls_per_sample: int
    samples_ms: dict[str, list[float]]
    notes: list[str] = field(default_factory=list)
    # label -> run the exact work of one timed sample again (the same graph, or every input set
    # eagerly), so the caller can check what the timed execution writes
    replay: dict[str, Callable[[], None]] = field(default_factory=dict)


def abba(labels: list[str], rnd: int) -> list[str]:
    return labels if rnd % 2 == 0 else list(reversed(labels))


def time_cpu(fns: dict[str, Callable[[], Any]], plan: TimingPlan) -> TimingResult:
    labels = list(fns)
    samples: dict[str, list[float]] = {k: [] for k in labels}
    for fn in fns.values():  # warm-up: the interpreter parses each kernel on first call
        fn()
    deadline = time.perf_counter() + plan.budget_s * len(labels)
    rnd = 0
    while rnd < plan.max_reps and (rnd < plan.min_reps or time.perf_counter() < deadline):
        for label in abba(labels, rnd):
            t0 = time.perf_counter()
            fns[label]()
            samples[label].append((time.perf_counter() - t0) * 1e3)
        rnd += 1
    return TimingResult("interpreter_wallclock", 1, samples, replay=dict(fns))


class _Clock:
    """CUDA events and synchronize, captured before any kernel module is imported."""

    def __init__(self, torch):
        self.torch = torch
        self.Event = torch.cuda.Event
        self.synchronize = torch.cuda.synchronize

    def event(self):
        return self.Event(enable_timing=True)


def l2_bytes(torch) -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


EAGER_SPIN_CYCLES = 400_000  # about 0.2 ms of a GPU's clock: longer than the host takes to launch a call
GRAPH_SPIN_CYCLES = 100_000  # about 50 us: longer than the host takes to launch a graph's replay


def sample_events(torch, clock: _Clock, call: Callable[[], Any], flush=None,
                  cycles: int = EAGER_SPIN_CYCLES) -> tuple[Any, Any]:
    """The (start, end) events of one timed call (an eager call, a graph's replay), queued after an L2
    flush (`flush`, where there is one) and a spin of `cycles` that keeps the GPU busy while the host
    records the start event and launches the call; nothing synchronizes in between, so the events
    time the device's work of the call and not the host's latency."""
    start, end = clock.event(), clock.event()
    if flush is not None:
        flush.zero_()
    torch.cuda._sleep(cycles)
    start.record()
    call()
    end.record()
    return start, end


def estimate_call_ms(torch, clock: _Clock, fn: Callable[[], Any], n: int = 5) -> float:
    """A call's device time, the mean of `n` back to back, queued as an eager sample is (a spin before
    the start event, no synchronize before the end event), so that the host's latency does not push
    a short call past GRAPH_BELOW_MS and off CUDA graphs."""
    clock.synchronize()
    start, end = sample_events(torch, clock, lambda: [fn() for _ in range(n)])
    clock.synchronize()
    return start.elapsed_time(end) / n


def time_gpu(
    torch,
    clock: _Clock,
    fns: dict[str, Callable[[int], Any]],
    nsets: int,
    plan: TimingPlan,
) -> TimingResult:
    """Time closures fn(set_index) interleaved. All closures read the same input sets (the same
    memory), so placement in HBM and L2 cannot favour one of them."""
    labels = list(fns)
    for fn in fns.values():  # warm-up: compile, autotune, allocator
        for j in range(min(nsets, 3)):
            fn(j)
    clock.synchronize()
    call_ms = max(estimate_call_ms(torch, clock, lambda f=f: f(0)) for f in fns.values())
    notes: list[str] = []
    graphs = None
    calls = 1
    if plan.use_graphs and call_ms < GRAPH_BELOW_MS:
        calls = calls_per_graph(call_ms, nsets)
        try:
            graphs = {k: capture_graph(torch, fns[k], calls, nsets) for k in labels}
        except Exception as exc:  # capture is optional: some wrappers sync or allocate on the host
            notes.append(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); timed eagerly")
            graphs, calls = None, 1
            torch.cuda.synchronize()
    flush = None
    if graphs is None:
        flush = torch.empty(2 * l2_bytes(torch), dtype=torch.uint8, device="cuda")
    samples: dict[str, list[float]] = {k: [] for k in labels}
    reps = rounds(plan, call_ms * calls * len(labels) / 1e3, len(labels))
    events: list[list] = [[None] * len(labels) for _ in range(reps)]
    for rnd in range(reps):
        order = abba(list(range(len(labels))), rnd)
        for i in order:
            if graphs is not None:
                start, end = events[rnd][i] = clock.event(), clock.event()
                start.record()
                graphs[labels[i]].replay()
                end.record()
            else:
                events[rnd][i] = sample_events(torch, clock, lambda: fns[labels[i]](rnd % nsets), flush)
                clock.synchronize()
        if graphs is not None and rnd % 16 == 15:
            clock.synchronize()
    clock.synchronize()
    for rnd in range(reps):
        for i, label in enumerate(labels):
            start, end = events[rnd][i]
            samples[label].append(start.elapsed_time(end) / calls)
    method = "cuda_graph" if graphs is not None else "cuda_events_l2_flush"
    if graphs is not None:
        replay = {k: graphs[k].replay for k in labels}
    else:
        replay = {k: (lambda f=fns[k]: [f(j) for j in range(nsets)]) for k in labels}
    return TimingResult(method, calls, samples, notes, replay)


def calls_per_graph(call_ms: float, nsets: int) -> int:
    """Calls per CUDA-graph sample: about SAMPLE_TARGET_MS of work, and every input set at least once."""
    calls = int(max(1, min(MAX_CALLS_PER_GRAPH, SAMPLE_TARGET_MS / max(call_ms, 1e-3))))
    return max(calls, min(nsets, MAX_CALLS_PER_GRAPH))


def rounds(plan: TimingPlan, round_s: float, labels: int) -> int:
    """Interleaved rounds for a plan: its budget per implementation, within min_reps..max_reps."""
    return int(min(plan.max_reps, max(plan.min_reps, plan.budget_s * labels / max(round_s, 1e-6))))


def capture_graph(torch, fn: Callable[[int], Any], calls: int, nsets: int):
    """A CUDA graph of `calls` calls of fn(j), rotating over `nsets` input sets (warmed on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for j in range(min(nsets, 2)):
            fn(j)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            fn(j % nsets)
    torch.cuda.synchronize()
    return graph


def rotating_sets(torch, in_bytes: int, device: str) -> tuple[int, list[str]]:
    """How many input sets the timed calls rotate over: on a GPU, enough to exceed 3x L2 (at most
    MAX_CALLS_PER_GRAPH, at most 1 GiB), so that every call reads cold data; one on the CPU."""
    if device != "cuda":
        return 1, []
    l2 = l2_bytes(torch)
    nsets = int(min(MAX_CALLS_PER_GRAPH, max(1, -(-3 * l2 // max(in_bytes, 1)))))
    nsets = max(1, min(nsets, int(2**30 // max(in_bytes, 1))))
    return nsets, [f"{nsets} rotating input set(s) of {in_bytes / 2**20:.2f} MiB ({nsets * in_bytes / l2:.1f}x L2)"]


def most_sets(in_bytes: int, nsets: int, device: str) -> int:
    """How many input sets a CUDA graph may make its calls on: one per call (the judge audits the
    outputs of every timed call, `loop.judge.audit`), at least the `nsets` that exceed L2, at most
    MAX_CALLS_PER_GRAPH and 1 GiB together; one on the CPU."""
    if device != "cuda":
        return 1
    return max(nsets, min(MAX_CALLS_PER_GRAPH, int(2**30 // max(in_bytes, 1))))


DEVICE_COPY_BYTES = (64 * 2**20, 256 * 2**20)  # the copies that measure the device's copy rate alone (beyond L2)
_DEVICE_COPY: dict[tuple, dict] = {}  # per device and timing method: measured once per process


def clone_bandwidth(torch, clock, nbytes: float, plan: TimingPlan, method: str | None = None) -> dict | None:
    """Same-run copy bandwidth for the same traffic (read + write = nbytes), the memory roofline,
    timed by the shape's `method` (eagerly with an L2 flush where the implementations were; CUDA
    graphs otherwise, as they are for short calls): the better of a few placements and sizes.

    Placements: separate allocations can land where every source and destination page share DRAM
    channels (on an H100 the judge measured 2320-2390 GB/s at two shapes' byte counts, where the
    same copy elsewhere ran at 2770-2920 GB/s); a destination placed in the same allocation as its
    source at an offset of n + 1 MiB + 4 KiB is the other placement. Sizes: the device's copy rate
    alone (`device_copy_rate`: copies of DEVICE_COPY_BYTES, both placements, measured once per
    process) counts where the shape copies at least as many bytes (a smaller copy's rate is one a
    larger copy can reach; a larger one's is not, for a small shape). The result keeps every rate,
    the device's best (`device_gbps`) and the clone's fraction of it (`of_device`); `median_ms` is
    the shape's traffic at the best rate."""
    n = int(nbytes // 2)
    if n < 1024:
        return None
    graphs = plan.use_graphs and method != "cuda_events_l2_flush"
    # half the plan's budget each: the two placements take the time one copy took before
    half = TimingPlan(max(5, plan.min_reps // 2), max(10, plan.max_reps // 2), plan.budget_s / 2, graphs)
    rates, timed_by = _copy_rates(torch, clock, n, half)
    device = device_copy_rate(torch, clock, half)
    methods = {k: timed_by for k in rates}
    for size, (gbps, how) in device["rates"].items():
        if device["bytes"][size] <= n:
            rates[size], methods[size] = gbps, how
    best = max(rates, key=rates.get)
    out = {"median_ms": 2 * n / (rates[best] * 1e9) * 1e3, "gbps": rates[best], "method": methods[best], "best": best,
           "placements_gbps": {k: round(v, 1) for k, v in rates.items()}}
    if device["gbps"]:
        out.update(device_gbps=round(device["gbps"], 1), of_device=round(rates[best] / device["gbps"], 3))
    return out


def _copy_rates(torch, clock, n: int, plan: TimingPlan) -> tuple[dict[str, float], str]:
    """GB/s of a copy of n bytes in both placements, timed interleaved over input sets beyond L2."""
    from loop.common.stats import summarize

    nsets = _copy_sets(torch, n)
    srcs = [torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda") for _ in range(nsets)]
    dsts = [torch.empty_like(s) for s in srcs]
    skew = n + 2**20 + 4096
    joint = [torch.empty(skew + n, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
    for j, buf in enumerate(joint):
        buf[:n].copy_(srcs[j])
    fns = {"separate": lambda j: dsts[j].copy_(srcs[j]),
           "skewed": lambda j: joint[j][skew:].copy_(joint[j][:n])}
    res = time_gpu(torch, clock, fns, nsets, plan)
    return {k: 2 * n / (summarize(v).median_ms / 1e3) / 1e9 for k, v in res.samples_ms.items()}, res.method


def _copy_sets(torch, n: int) -> int:
    return int(min(MAX_CALLS_PER_GRAPH, max(1, -(-3 * l2_bytes(torch) // n))))


def device_copy_rate(torch, clock, plan: TimingPlan) -> dict:
    """The copy rate the device reaches alone: copies of DEVICE_COPY_BYTES (those that fit in a
    quarter of the free memory), both placements, the best of each size; measured once per process
    and timing method. {"rates": {"<size> MiB <placement>": (GB/s, method)}, "bytes": {...: n},
    "gbps": the best, or None}."""
    key = (torch.cuda.current_device(), plan.use_graphs)
    if key not in _DEVICE_COPY:
        free = torch.cuda.mem_get_info()[0]
        rates, sizes = {}, {}
        for n in DEVICE_COPY_BYTES:
            if _copy_sets(torch, n) * 4 * n > free // 4:  # sources, destinations and joint buffers: 4n a set
                continue
            got, how = _copy_rates(torch, clock, n, plan)
            for placement, gbps in got.items():
                rates[f"{n / 2**20:g} MiB {placement}"], sizes[f"{n / 2**20:g} MiB {placement}"] = (gbps, how), n
        torch.cuda.empty_cache()  # the copies' memory back to the device, for the kernel processes
        _DEVICE_COPY[key] = {"rates": rates, "bytes": sizes,
                             "gbps": max((g for g, _ in rates.values()), default=None)}
    return _DEVICE_COPY[key]


MATMUL_N = 8192  # the square torch.matmul that measures a device's dense matmul rate (1.1 TFLOP a call)
COMPUTE_BOUND = 64.0  # FLOP per byte moved: a shape at least this intense is read against the matmul rate too
_DEVICE_MATMUL: dict[tuple, dict | None] = {}


def compute_bound(flops: float | None, nbytes: float | None) -> bool:
    """Whether a shape is intense enough that the device's matmul rate, not its copy rate, bounds it."""
    return bool(flops) and bool(nbytes) and flops / nbytes >= COMPUTE_BOUND


def device_matmul_rate(torch, clock, dtype: str, plan: TimingPlan) -> dict | None:
    """The dense matmul rate the device reaches alone in `dtype`: torch.matmul (cuBLAS) of two
    MATMUL_N x MATMUL_N matrices of random values, timed as the copy is, once per process, dtype and
    method; the compute roofline of a dot kernel (matmul, attention), as the clone is a memory-bound
    kernel's. {"tflops", "median_ms", "n", "dtype", "method"}; None for a dtype that is not floating
    point or matrices that do not fit in a quarter of the free memory."""
    key = (torch.cuda.current_device(), dtype, plan.use_graphs)
    if key not in _DEVICE_MATMUL:
        from loop.common.stats import summarize

        kind = getattr(torch, dtype, None)
        n = MATMUL_N
        if not isinstance(kind, torch.dtype) or not kind.is_floating_point:
            _DEVICE_MATMUL[key] = None
            return None
        size = n * n * torch.empty((), dtype=kind).element_size()
        if 3 * size > torch.cuda.mem_get_info()[0] // 4:
            _DEVICE_MATMUL[key] = None
            return None
        a, b = (torch.randn(n, n, device="cuda").to(kind) for _ in range(2))
        c = torch.empty(n, n, dtype=kind, device="cuda")
        res = time_gpu(torch, clock, {"torch.matmul": lambda j: torch.matmul(a, b, out=c)}, 1,
                       TimingPlan(5, max(10, plan.max_reps // 2), plan.budget_s / 2, plan.use_graphs))
        median = summarize(res.samples_ms["torch.matmul"]).median_ms
        del a, b, c
        torch.cuda.empty_cache()
        _DEVICE_MATMUL[key] = {"tflops": 2 * n ** 3 / (median / 1e3) / 1e12, "median_ms": median, "n": n,
                               "dtype": dtype, "method": res.method}
    return _DEVICE_MATMUL[key]


def add_matmul_fractions(entry: dict) -> None:
    """Each implementation's fraction of the device's matmul rate (`entry["matmul"]`), where both are known."""
    rate = (entry.get("matmul") or {}).get("tflops")
    if not rate:
        return
    for impl in entry["impls"].values():
        if impl.get("tflops"):
            impl["frac_matmul"] = impl["tflops"] / rate


def in_units(samples_ms: list[float], flops: float, nbytes: float) -> dict:
    """One implementation's samples at one shape: their summary, and GB/s and TFLOP/s at the median."""
    from loop.common.stats import summarize

    st = summarize(samples_ms)
    secs = st.median_ms / 1e3
    return {**st.to_json(), "samples_ms": samples_ms, "gbps": nbytes / secs / 1e9 if secs > 0 else None,
            "tflops": flops / secs / 1e12 if secs > 0 else None}


def add_clone_fractions(entry: dict) -> None:
    """Each implementation's fraction of the same-run copy bandwidth, where both are known; the
    shape's notes say where the clone was timed by another method than the implementations, and
    why a fraction is above 1 (`above_one`)."""
    clone = entry.get("clone")
    if not clone:
        return
    above = {}
    for label, impl in entry["impls"].items():
        if impl.get("gbps"):
            impl["frac_clone_bw"] = impl["gbps"] / clone["gbps"]
            if impl["frac_clone_bw"] > 1.0:
                above[label] = impl
    notes = entry.setdefault("notes", [])
    if entry.get("method") and clone.get("method") != entry["method"]:
        notes.append(f"the clone was timed by {clone.get('method')}, the implementations by {entry['method']}")
    if above:
        clone["above_one"] = above_one(clone, above)
        notes.append(clone["above_one"])


def above_one(clone: dict, above: dict[str, dict]) -> str:
    """Why implementations ran above the clone's rate: the clone short of the device's own copy
    rate (its fraction of it, and theirs), or traffic the spec counts that never reached DRAM."""
    fracs = ", ".join(f"{lab} {impl['frac_clone_bw']:.2f}" for lab, impl in above.items())
    text = f"above 1.0 of the clone ({fracs}; clone {clone['gbps']:.0f} GB/s, {clone.get('best', 'best placement')})"
    device = clone.get("device_gbps")
    if not device:
        return text + ": no device copy rate was measured beside it (too little free memory)"
    theirs = ", ".join(f"{lab} {impl['gbps'] / device:.2f}" for lab, impl in above.items())
    if clone["gbps"] < 0.95 * device:
        return (f"{text}: the clone reached {clone['gbps'] / device:.2f} of the device's copy rate alone "
                f"({device:.0f} GB/s); against that rate: {theirs}")
    return (f"{text}, {clone['gbps'] / device:.2f} of the device's copy rate alone ({device:.0f} GB/s): the spec's "
            f"bytes_moved counts more traffic than reached DRAM (reads served from L2, or bytes not moved); "
            f"against the device's rate: {theirs}")
