"""The copy-bandwidth reference (`loop.common.timing.clone_bandwidth`): two placements of source and
destination timed interleaved, the better one kept and both reported. Here on the CPU, with the
device calls redirected to CPU tensors and the GPU timing replaced by one that runs each copy once
and hands back chosen times: what is checked is which copies are made and which number is kept."""

from __future__ import annotations

import types

import torch

from loop.common import timing


class _CpuTorch(types.SimpleNamespace):
    """torch with device="cuda" tensors made on the CPU."""

    def __init__(self):
        super().__init__(uint8=torch.uint8)

    @staticmethod
    def randint(*args, device=None, **kw):
        return torch.randint(*args, **kw)

    @staticmethod
    def empty(*args, device=None, **kw):
        return torch.empty(*args, **kw)

    @staticmethod
    def empty_like(t):
        return torch.empty_like(t)


def test_the_better_placement_is_the_reference_and_both_are_reported(monkeypatch):
    seen = {}

    def fake_time_gpu(torch_, clock, fns, nsets, plan):
        for label, fn in fns.items():
            for j in range(nsets):
                out = fn(j)
                seen.setdefault(label, []).append(out.clone())
        samples = {"separate": [0.012] * 9, "skewed": [0.010] * 9}  # the skewed copy is the faster here
        return timing.TimingResult("cuda_graph", 1, samples)

    monkeypatch.setattr(timing, "time_gpu", fake_time_gpu)
    monkeypatch.setattr(timing, "l2_bytes", lambda torch_: 1 << 20)
    nbytes = 2 * (1 << 20)  # 1 MiB read, 1 MiB written
    out = timing.clone_bandwidth(_CpuTorch(), None, nbytes, timing.TimingPlan())
    n = nbytes // 2
    assert set(out["placements_gbps"]) == {"separate", "skewed"}
    assert out["gbps"] == 2 * n / 0.010e-3 / 1e9
    assert out["placements_gbps"] == {"separate": round(2 * n / 0.012e-3 / 1e9, 1), "skewed": round(out["gbps"], 1)}
    assert out["median_ms"] == 0.010 and out["method"] == "cuda_graph"
    # both placements copy the same n bytes of the same sources
    assert len(seen["separate"]) == len(seen["skewed"]) == 3
    for a, b in zip(seen["separate"], seen["skewed"]):
        assert a.numel() == b.numel() == n and torch.equal(a, b)


def test_no_reference_for_a_tiny_copy():
    assert timing.clone_bandwidth(_CpuTorch(), None, 1000, timing.TimingPlan()) is None
