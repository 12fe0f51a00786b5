"""A dot kernel's roofline: the judge measures the device's matmul rate (torch.matmul 8192^3 in the
shape's dtype) beside every compute-bound shape, each implementation's fraction of it goes into the
records (`frac_matmul`), the order of a dot kernel's candidates and the report read it."""

from __future__ import annotations

import pytest

from loop.common import timing
from loop.tools.final import final_rows

RATE = {"tflops": 700.0, "median_ms": 1.57, "n": 8192, "dtype": "bfloat16", "method": "cuda_graph"}


def test_a_shape_is_compute_bound_from_its_flops_per_byte():
    mm = 2.0 * 4096 ** 3, 2.0 * 3 * 4096 ** 2  # 1365 FLOP per byte
    assert timing.compute_bound(*mm)
    assert not timing.compute_bound(2.0 * 4096 * 4096, 2.0 * 3 * 4096 * 4096)  # an element-wise op: under 1
    assert not timing.compute_bound(None, 1.0) and not timing.compute_bound(1.0, 0)


def test_each_implementation_gets_its_fraction_of_the_matmul_rate():
    entry = {"matmul": RATE, "impls": {"best": {"tflops": 350.0}, "torch_eager": {"tflops": 700.0}, "slow": {}}}
    timing.add_matmul_fractions(entry)
    assert entry["impls"]["best"]["frac_matmul"] == pytest.approx(0.5)
    assert entry["impls"]["torch_eager"]["frac_matmul"] == pytest.approx(1.0) and "frac_matmul" not in entry["impls"]["slow"]
    bare = {"impls": {"best": {"tflops": 350.0}}}
    timing.add_matmul_fractions(bare)  # no rate measured (a memory-bound shape, the CPU): nothing added
    assert "frac_matmul" not in bare["impls"]["best"]


def test_the_report_names_the_fraction_of_the_matmul_rate_where_it_was_measured():
    def shape(matmul):
        impls = {"best": {"median_ms": 2.0, "frac_matmul": 0.41} if matmul else {"median_ms": 2.0},
                 "torch_eager": {"median_ms": 1.0}, "torch_compile": {"median_ms": 1.1}}
        return {"shape": [8192, 8192, 8192], "dtype": "bfloat16", "method": "cuda_graph", "impls": impls,
                **({"matmul": RATE} if matmul else {})}
    rows = final_rows({"timing": {"shapes": [shape(True), shape(False)]}})["rows"]
    assert rows[0]["best, fraction of the device's matmul rate"] == "0.41 (torch.matmul 8192^3 bfloat16: 700 TFLOP/s)"
    assert "best, fraction of the device's matmul rate" not in rows[1]


@pytest.mark.gpu
def test_on_a_gpu_the_matmul_rate_is_measured_once_per_dtype():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    clock, plan = timing._Clock(torch), timing.TimingPlan()
    first = timing.device_matmul_rate(torch, clock, "bfloat16", plan)
    assert first["n"] == timing.MATMUL_N and first["tflops"] == pytest.approx(2 * first["n"] ** 3 / first["median_ms"] / 1e9)
    assert timing.device_matmul_rate(torch, clock, "bfloat16", plan) is first  # once per process
    assert timing.device_matmul_rate(torch, clock, "int32", plan) is None  # no float matmul to compare with
