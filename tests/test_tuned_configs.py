"""What a kernel tuned at run time picked, recorded with the timing (worker.tuned_configs).

The cuTile autotune candidates tune per input key in the process that runs them, so two processes
can time two different configs of one source (seen on an H200: one version of row_sum measured 0.78
and 0.90 of clone bandwidth in two processes). The worker records the picks made for each timed
shape; these tests pin the two conventions it reads and that it never fails a measurement.
"""

from __future__ import annotations

import types

from loop.common.messages import ImplTiming
from loop.measure.evaluate import SUMMARY_KEYS, _summary
from loop.worker.bench import tuned_configs


class FakeAutotuner:  # the two attributes of triton.runtime.autotuner.Autotuner that are read
    def __init__(self):
        self.configs = ["BLOCK: 128, num_warps: 4", "BLOCK: 1024, num_warps: 8"]
        self.cache = {}


def module(**attrs):
    m = types.ModuleType("tileloop_impl_candidate")
    m.__dict__.update(attrs)
    return m


def test_cutile_autotune_picks_by_key():
    tuned = {}
    m = module(_TUNED=tuned)
    assert tuned_configs(m) == {}
    key = (((1048576,), "torch.float16", (1,), "cuda:0"),)
    tuned[key] = ({"TILE": 512, "occupancy": 2}, object())
    assert tuned_configs(m) == {repr(key): "{'TILE': 512, 'occupancy': 2}"}


def test_triton_autotuner_cache_by_key_and_kernel_name():
    at = FakeAutotuner()
    m = module(softmax_kernel=at, BLOCK=128)
    assert tuned_configs(m) == {}
    at.cache[(16384, "torch.float16")] = at.configs[1]
    assert tuned_configs(m) == {"softmax_kernel(16384, 'torch.float16')": "BLOCK: 1024, num_warps: 8"}


def test_an_odd_module_never_fails_the_measurement():
    class Weird:
        @property
        def cache(self):
            raise RuntimeError("boom")

    class BadDict(dict):
        def items(self):
            raise RuntimeError("boom")

    assert tuned_configs(module(x=Weird())) == {}
    assert tuned_configs(module(_TUNED=BadDict(a=1))) == {}
    assert tuned_configs(module(cache={1: 2})) == {}  # a dict named cache alone is no autotuner


def test_the_picks_travel_into_the_backend_summary():
    assert "tuned" in SUMMARY_KEYS
    stats = {"median_ms": 0.01, "tuned": {"k": "{'TILE': 512}"}, "samples_ms": [0.01]}
    assert _summary(ImplTiming.from_json(stats)) == {"median_ms": 0.01, "tuned": {"k": "{'TILE': 512}"}}
