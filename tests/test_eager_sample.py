"""An eager sample times the device's work of one call, never the host's latency: the L2 flush and a
spin of the GPU come before the start event, the call is launched while the GPU spins, and nothing
synchronizes between the call and its end event (on an H100, events around a host synchronize put a
per-process latency in every sample: A/A pairs read 0.75x to 1.58x). Checked with a recording
stand-in for torch and the clock, as the kernel process's sampler and the judge's own timing use it."""

from __future__ import annotations

from types import SimpleNamespace

from loop.common import timing
from loop.worker.sampler import Sampler


class Recorder:
    def __init__(self):
        self.log: list[str] = []
        self.t = 0.0
        rec = self

        class Event:
            def record(self):
                rec.log.append("record")
                self.at = rec.t

            def elapsed_time(self, other):
                return other.at - self.at

        self.Event = Event
        self.cuda = SimpleNamespace(_sleep=lambda cycles: self.log.append(f"spin {cycles}"))

    def event(self):
        return self.Event()

    def synchronize(self):
        self.log.append("sync")

    def call(self):
        self.log.append("call")
        self.t += 0.25  # the device's work of the call


def test_the_sampler_queues_flush_spin_start_call_end_with_no_synchronize_in_between():
    rec = Recorder()
    flush = SimpleNamespace(zero_=lambda: rec.log.append("flush"))
    sampler = Sampler(rec, rec, "cuda", "candidate", lambda **_: rec.call(), [{}])
    sampler.flush, sampler.graph = flush, None
    ms = sampler.sample(0)
    assert rec.log == ["flush", f"spin {timing.EAGER_SPIN_CYCLES}", "record", "call", "record", "sync"], rec.log
    assert ms == 0.25
    rec.log.clear()
    assert sampler.sample(0, empty=True) == 0.0 and "call" not in rec.log
    rec.log.clear()
    sampler.graph, sampler.calls = SimpleNamespace(replay=rec.call), 1  # a graph's replay: the same order, no flush
    assert sampler.sample(0) == 0.25
    assert rec.log == [f"spin {timing.GRAPH_SPIN_CYCLES}", "record", "call", "record", "sync"], rec.log


def test_the_spin_outlasts_a_hosts_launch_of_a_call():
    # 400k cycles at the H100's 1.98 GHz boost clock: 0.2 ms, several times a Triton launch from Python
    assert timing.EAGER_SPIN_CYCLES / 1.98e9 >= 150e-6


def test_the_judges_own_eager_timing_queues_the_same_way():
    rec = Recorder()
    flush = SimpleNamespace(zero_=lambda: rec.log.append("flush"))
    start, end = timing.sample_events(rec, rec, rec.call, flush)
    assert rec.log == ["flush", f"spin {timing.EAGER_SPIN_CYCLES}", "record", "call", "record"]
    assert start.elapsed_time(end) == 0.25


def test_a_calls_estimate_is_queued_the_same_way_so_host_latency_does_not_decide_the_method():
    rec = Recorder()
    ms = timing.estimate_call_ms(rec, rec, rec.call, 4)
    assert rec.log == ["sync", f"spin {timing.EAGER_SPIN_CYCLES}", "record", "call", "call", "call", "call", "record",
                       "sync"], rec.log
    assert ms == 0.25
