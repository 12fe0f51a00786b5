"""The report's roofline table gives GPU rates only for GPU timings: an interpreter's wall clock
says nothing of bytes or flops per second on a device (it printed `GB/s 0`)."""

from __future__ import annotations

from types import SimpleNamespace

from loop.records.report import NOT_A_RATE, _roofline
from loop.records.results import BackendResult, Record


def _record(label: str) -> Record:
    shape = {"shape": [8192], "dtype": "float32", "method": "cuda_graph",
             "candidate": {"median_ms": 2.5, "gbps": 0.04, "tflops": 3e-6, "frac_clone_bw": None}}
    res = BackendResult("interpreter" if label == "interpreter" else "ptx", True, "ok", "", 2.5, None, "PASS", label,
                        None, [shape])
    return Record(run="r", iteration=1, optimization="x", status="keep", correctness="PASS", latency_ms=2.5,
                  target_backend=res.name, backends={res.name: res}, commit="c", parent="p", hypothesis="", env={},
                  source_hash="h", started="", finished="", wall_s=0.0)


def test_no_rate_is_printed_for_an_interpreter_timing():
    rec = _record("interpreter")
    text = "\n".join(_roofline(SimpleNamespace(target_backend=rec.target_backend), rec))
    assert NOT_A_RATE in text and "| 0 " not in text


def test_a_gpu_timing_keeps_its_rates_with_their_digits():
    rec = _record("gpu")
    text = "\n".join(_roofline(SimpleNamespace(target_backend=rec.target_backend), rec))
    assert NOT_A_RATE not in text and "0.04" in text
