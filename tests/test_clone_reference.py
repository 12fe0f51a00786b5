"""The copy-bandwidth reference (`loop.common.timing.clone_bandwidth`): two placements of source and
destination timed interleaved by the shape's method, the device's own copy rate at a few sizes
beside them (counted where the shape copies as much), the best kept and every rate reported; and
why a fraction of it above 1 is (`add_clone_fractions`). Here on the CPU, with the device calls
redirected to CPU tensors and the GPU timing replaced by one that runs each copy once and hands
back chosen times: what is checked is which copies are made and which number is kept."""

from __future__ import annotations

import types

import pytest
import torch

from loop.common import timing


class _CpuTorch(types.SimpleNamespace):
    """torch with device="cuda" tensors made on the CPU, and the few torch.cuda calls the clone makes."""

    def __init__(self, free: int = 1 << 40):
        super().__init__(uint8=torch.uint8, cuda=types.SimpleNamespace(
            current_device=lambda: 0, mem_get_info=lambda: (free, free), empty_cache=lambda: None))

    @staticmethod
    def randint(*args, device=None, **kw):
        return torch.randint(*args, **kw)

    @staticmethod
    def empty(*args, device=None, **kw):
        return torch.empty(*args, **kw)

    @staticmethod
    def empty_like(t):
        return torch.empty_like(t)


MIB = 1 << 16  # the sizes here, small: L2 and the device's two copies (stand-ins for 50 MiB, 64 and 256 MiB)


@pytest.fixture
def gpu(monkeypatch):
    """The GPU timing replaced: each copy run once per set (what it copies is kept), then times
    handed back from `ms[(placement, bytes)]`; L2 of 64 KiB; the device's copies at 64 and 128 KiB."""
    state = types.SimpleNamespace(ms={}, seen={}, plans=[])

    def fake_time_gpu(torch_, clock, fns, nsets, plan):
        state.plans.append(plan)
        samples = {}
        for label, fn in fns.items():
            outs = [fn(j).clone() for j in range(nsets)]
            state.seen.setdefault((label, outs[0].numel()), []).extend(outs)
            samples[label] = [state.ms[(label, outs[0].numel())]] * 9
        return timing.TimingResult("cuda_graph" if plan.use_graphs else "cuda_events_l2_flush", 1, samples)

    monkeypatch.setattr(timing, "time_gpu", fake_time_gpu)
    monkeypatch.setattr(timing, "l2_bytes", lambda torch_: MIB)
    monkeypatch.setattr(timing, "DEVICE_COPY_BYTES", (MIB, 2 * MIB))
    monkeypatch.setattr(timing, "_DEVICE_COPY", {})
    return state


def _rate(n: int, ms: float) -> float:
    return 2 * n / (ms / 1e3) / 1e9


def test_the_better_placement_is_the_reference_and_every_rate_is_reported(gpu):
    n = MIB // 2  # a shape that copies 32 KiB: the device's copies (64 and 128 KiB) are larger, not counted
    gpu.ms = {("separate", n): 0.012, ("skewed", n): 0.010, ("separate", MIB): 0.005, ("skewed", MIB): 0.005,
              ("separate", 2 * MIB): 0.008, ("skewed", 2 * MIB): 0.0085}
    out = timing.clone_bandwidth(_CpuTorch(), None, 2 * n, timing.TimingPlan())
    assert out["gbps"] == _rate(n, 0.010) and out["best"] == "skewed" and out["method"] == "cuda_graph"
    assert out["placements_gbps"] == {"separate": round(_rate(n, 0.012), 1), "skewed": round(_rate(n, 0.010), 1)}
    assert out["median_ms"] == pytest.approx(0.010)
    device = _rate(2 * MIB, 0.008)  # the device's best copy alone
    assert out["device_gbps"] == round(device, 1) and out["of_device"] == round(_rate(n, 0.010) / device, 3)
    # both placements copy the same n bytes of the same sources, over sets beyond L2
    assert len(gpu.seen[("separate", n)]) == len(gpu.seen[("skewed", n)]) == 6
    for a, b in zip(gpu.seen[("separate", n)], gpu.seen[("skewed", n)]):
        assert torch.equal(a, b)


def test_a_device_copy_no_larger_than_the_shapes_counts(gpu):
    n = 4 * MIB  # the clone at this size falls short (placement): the device's 64 and 128 KiB copies are faster
    gpu.ms = {("separate", n): 0.05, ("skewed", n): 0.045, ("separate", MIB): 0.008, ("skewed", MIB): 0.009,
              ("separate", 2 * MIB): 0.0105, ("skewed", 2 * MIB): 0.0100}
    out = timing.clone_bandwidth(_CpuTorch(), None, 2 * n, timing.TimingPlan())
    assert out["best"] == "0.125 MiB skewed" and out["gbps"] == _rate(2 * MIB, 0.0100) > _rate(MIB, 0.008) > _rate(n, 0.045)
    assert set(out["placements_gbps"]) == {"separate", "skewed", "0.0625 MiB separate", "0.0625 MiB skewed",
                                        "0.125 MiB separate", "0.125 MiB skewed"}
    assert out["median_ms"] == pytest.approx(2 * n / (out["gbps"] * 1e9) * 1e3) and out["of_device"] == 1.0


def test_the_clone_follows_the_shapes_method_and_the_device_rate_is_measured_once_per_method(gpu):
    n = MIB
    gpu.ms = {(p, s): 0.01 for p in ("separate", "skewed") for s in (MIB, 2 * MIB)}
    eager = timing.clone_bandwidth(_CpuTorch(), None, 2 * n, timing.TimingPlan(), "cuda_events_l2_flush")
    assert eager["method"] == "cuda_events_l2_flush" and not any(p.use_graphs for p in gpu.plans)
    assert len(gpu.plans) == 3  # the shape's copy, then the device's two sizes
    timing.clone_bandwidth(_CpuTorch(), None, 2 * n, timing.TimingPlan(), "cuda_events_l2_flush")
    assert len(gpu.plans) == 4  # the device's rate for this method is known
    graphed = timing.clone_bandwidth(_CpuTorch(), None, 2 * n, timing.TimingPlan(), "cuda_graph")
    assert graphed["method"] == "cuda_graph" and [p.use_graphs for p in gpu.plans[4:]] == [True] * 3


def test_no_device_rate_without_the_memory_for_it(gpu):
    n = MIB // 2
    gpu.ms = {("separate", n): 0.012, ("skewed", n): 0.010}
    out = timing.clone_bandwidth(_CpuTorch(free=16 * MIB), None, 2 * n, timing.TimingPlan())
    assert "device_gbps" not in out and set(out["placements_gbps"]) == {"separate", "skewed"}


def test_no_reference_for_a_tiny_copy():
    assert timing.clone_bandwidth(_CpuTorch(), None, 1000, timing.TimingPlan()) is None


def _entry(clone: dict, method: str = "cuda_graph", **gbps) -> dict:
    return {"method": method, "notes": [], "clone": clone, "impls": {lab: {"gbps": g} for lab, g in gbps.items()}}


def test_a_fraction_above_one_is_explained_by_the_clone_short_of_the_device():
    entry = _entry({"gbps": 2400.0, "method": "cuda_graph", "best": "skewed", "device_gbps": 2950.0}, best=2712.0, eager=1200.0)
    timing.add_clone_fractions(entry)
    assert entry["impls"]["best"]["frac_clone_bw"] == pytest.approx(1.13) and entry["impls"]["eager"]["frac_clone_bw"] == 0.5
    (note,) = entry["notes"]
    assert note == entry["clone"]["above_one"]
    assert note.startswith("above 1.0 of the clone (best 1.13; clone 2400 GB/s, skewed): the clone reached 0.81 of the "
                           "device's copy rate alone (2950 GB/s); against that rate: best 0.92")


def test_a_fraction_above_one_beside_a_clone_at_the_device_rate_points_at_the_bytes_counted():
    entry = _entry({"gbps": 2900.0, "method": "cuda_graph", "best": "64 MiB skewed", "device_gbps": 2950.0}, best=3567.0)
    timing.add_clone_fractions(entry)
    assert "the spec's bytes_moved counts more traffic than reached DRAM" in entry["clone"]["above_one"]
    assert "against the device's rate: best 1.21" in entry["clone"]["above_one"]


def test_no_note_at_or_below_one_and_a_note_where_the_methods_differ():
    entry = _entry({"gbps": 2900.0, "method": "cuda_graph", "device_gbps": 2950.0}, best=2800.0)
    timing.add_clone_fractions(entry)
    assert entry["notes"] == [] and "above_one" not in entry["clone"]
    entry = _entry({"gbps": 2900.0, "method": "cuda_graph"}, "cuda_events_l2_flush", best=2800.0)
    timing.add_clone_fractions(entry)
    assert entry["notes"] == ["the clone was timed by cuda_graph, the implementations by cuda_events_l2_flush"]
    entry = _entry({"gbps": 2000.0, "method": "cuda_graph"}, best=2800.0)
    timing.add_clone_fractions(entry)
    assert entry["clone"]["above_one"].endswith("no device copy rate was measured beside it (too little free memory)")


def test_the_explanation_reaches_the_report_the_final_table_and_compare():
    from loop.records import report
    from loop.tools import compare, final

    entry = _entry({"gbps": 2400.0, "method": "cuda_graph", "best": "skewed", "device_gbps": 2950.0}, best=2712.0)
    timing.add_clone_fractions(entry)
    why = entry["clone"]["above_one"]
    shape = {"shape": [16384, 16384], "dtype": "bfloat16", "method": "cuda_graph", "notes": entry["notes"],
             "candidate": {"median_ms": 0.4, "gbps": 2712.0, "frac_clone_bw": 1.13}}
    best = types.SimpleNamespace(iteration=3, backends={"ptx": types.SimpleNamespace(shapes=[shape])})
    lines = report._roofline(types.SimpleNamespace(target_backend="ptx"), best)
    assert f"- 16384x16384 bfloat16: {why}" in lines
    assert not [n for n in report._roofline(types.SimpleNamespace(target_backend="ptx"), types.SimpleNamespace(
        iteration=3, backends={"ptx": types.SimpleNamespace(shapes=[{**shape, "notes": []}])})) if n.startswith("- ")]
    raw = {"timing": {"shapes": [{"shape": [16384, 16384], "dtype": "bfloat16", "method": "cuda_graph", "clone": entry["clone"],
                                  "impls": {"best": {"median_ms": 0.4, "frac_clone_bw": 1.13}}}]}}
    assert final.final_rows(raw)["rows"][0]["clone note"] == why
    row = {"shape": "16384x16384", "dtype": "bfloat16", "implementation": "best", "backend": "ptx", "status": "ok",
           "time_ms": 0.4, "gbps": 2712.0, "frac_clone_bw": 1.13, "clone_gbps": 2400.0, "clone_note": why}
    text = compare.render({"op": "add", "device": "H100", "rows": [row], "verified": []})
    assert f"- clone: {why}" in text
