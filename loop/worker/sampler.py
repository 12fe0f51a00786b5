"""One implementation's timed work in its kernel process, one sample at a time, for the judge that
interleaves the implementations' processes (`loop.judge.bench`). The rules are those of
`loop.common.timing` (warm-up, CUDA graphs of `calls` launches for short calls rotating over the
input sets, a spin before each timed call and an L2 flush before an eager one, `timing.sample_events`);
only the round loop lives in the judge.

A sample is the device time of one graph replay divided by its calls, or of one eager call (CUDA
events), or the wall time of one call under the interpreter (perf_counter): per call, in ms. A graph
makes one call per input set it uses, each writing its own outputs, so that the judge's audits of
timed requests (`loop.judge.audit`) see the work of every timed call.
"""

from __future__ import annotations

import time

from loop.common import timing
from loop.worker.failures import call_impl

class Sampler:
    def __init__(self, torch, clock, device: str, label: str, entry, sets: list[dict]):
        self.torch, self.clock, self.device, self.label = torch, clock, device, label
        self.sets = sets
        self.last: list = [None] * len(sets)  # what each input set's latest call returned
        self.graph, self.calls, self.flush = None, 1, None

        def fn(j: int) -> None:
            self.last[j] = call_impl(label, "call", entry, **sets[j])

        self.fn = fn

    def sync(self) -> None:
        if self.device == "cuda":
            call_impl(self.label, "call", self.clock.synchronize)

    def prepare(self) -> dict:
        """Warm-up (compile, autotune, allocator), the peak memory of one call and its estimated time."""
        torch, nsets = self.torch, len(self.sets)
        if self.device != "cuda":
            started = time.perf_counter()
            self.fn(0)  # the interpreter parses each kernel on its first call
            return {"call_ms": (time.perf_counter() - started) * 1e3, "peak_mem_mb": None}
        for j in range(min(nsets, 3)):
            self.fn(j)
        self.sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.fn(0)
        self.sync()
        peak = round((torch.cuda.max_memory_allocated() - base) / 2**20, 3)
        # the least of three estimates: one hiccup of the host (seen on an H100: 0.07 ms kernels read as
        # over 0.5 ms) would otherwise time every implementation of the shape eagerly
        call_ms = min(call_impl(self.label, "call", timing.estimate_call_ms, torch, self.clock, lambda: self.fn(0))
                      for _ in range(3))
        return {"call_ms": call_ms, "peak_mem_mb": peak}

    def use(self, n: int) -> None:
        """Time over the first `n` input sets only (the judge shares more than every method uses)."""
        n = max(1, min(int(n), len(self.sets)))
        self.sets, self.last = self.sets[:n], self.last[:n]

    def capture(self, calls: int) -> dict:
        """A CUDA graph of `calls` calls, one per input set (the first `calls` sets); tried twice (a
        first capture can be invalidated by work still settling, seen on an H100 with code that
        captured at every other shape); when both fail the implementation is timed eagerly."""
        self.use(calls)
        calls, failures = len(self.sets), []
        for _ in range(2):
            try:
                self.graph = timing.capture_graph(self.torch, self.fn, calls, calls)
                self.calls = calls
                return {"captured": True, **({"note": f"{self.label}: captured at the second try ({failures[0]})"[:300]}
                                             if failures else {})}
            except Exception as exc:  # noqa: BLE001 - capture is optional: some wrappers sync or allocate on the host
                self.graph = None
                failures.append(f"{type(exc).__name__}: {exc}")
                try:
                    self.torch.cuda.synchronize()
                except Exception:  # noqa: BLE001 - a capture that broke the context: the next try or eager timing says so
                    pass
        return {"captured": False, "note": f"{self.label}: CUDA graph capture failed ({failures[-1]})"[:300]}

    def eager(self, sets: int) -> None:
        """Time eagerly over the first `sets` input sets (every implementation is, when one could not
        be captured)."""
        self.use(sets)
        self.graph, self.calls = None, 1
        if self.device == "cuda" and self.flush is None:
            self.flush = self.torch.empty(2 * timing.l2_bytes(self.torch), dtype=self.torch.uint8, device="cuda")

    def sample(self, rnd: int, empty: bool = False) -> float:
        """One sample; `empty`: the same without the call (what the judge subtracts as overhead)."""
        if self.device != "cuda":
            started = time.perf_counter()
            if not empty:
                self.fn(0)
            return (time.perf_counter() - started) * 1e3
        if self.graph is not None:
            # the replay's launch from the host is not timed (it took longer in the first sample of a
            # request, seen on an H100)
            start, end = call_impl(self.label, "call", timing.sample_events, self.torch, self.clock,
                                   (lambda: None) if empty else self.graph.replay, None, timing.GRAPH_SPIN_CYCLES)
        else:
            start, end = call_impl(self.label, "call", timing.sample_events, self.torch, self.clock,
                                   (lambda: None) if empty else (lambda: self.fn(rnd % len(self.sets))), self.flush)
        self.sync()  # work hidden on another stream ends here, inside the request the judge times
        return start.elapsed_time(end) / self.calls
