"""Named reference kernels (a spec's `REFERENCES`) beside the target, as `report --measure` and
`compare` time them: Liger-Kernel's softmax (installed from PyPI for the session, run by the
Triton interpreter at small fp32 shapes), one that is not installed (`unavailable`, with the
reason), one that is wrong (`incorrect`, not timed) and one that raises (`runtime_error`, not
timed), through the real worker subprocess."""

from __future__ import annotations

import shutil

import pytest

from conftest import REPO_ROOT
from loop import backends
from loop.common.settings import Settings
from loop.measure.launch import run_worker
from loop.tools.compare import render, run_compare
from loop.tools.final import final_rows

REFERENCES = '''

REFERENCES = {
    "liger": ("liger_kernel.ops.softmax", lambda liger, x, out: liger.LigerSoftmaxFunction.apply(x)),
    "quack": "quack.softmax:softmax",
    "scaled": ("scaled_softmax", lambda mod, x, out: mod.softmax(x)),
    "broken": ("scaled_softmax", lambda mod, x, out: mod.broken(x)),
}
'''
WRONG = '''import torch


def softmax(x):
    return torch.softmax(x, dim=-1) * 1.01


def broken(x):
    raise RuntimeError("no kernel for this shape")
'''


@pytest.fixture
def softmax_dir(tmp_path, env, liger_kernel):
    """kernels/softmax with its Triton target only, small fp32 shapes, REFERENCES, and a wrong
    reference module beside the spec; Liger-Kernel on the workers' path."""
    op = tmp_path / "softmax"
    op.mkdir()
    shutil.copyfile(REPO_ROOT / "kernels" / "softmax" / "softmax_triton.py", op / "softmax_triton.py")
    spec = (REPO_ROOT / "kernels" / "softmax" / "spec.py").read_text()
    spec = spec.replace('DTYPES = ["float16", "bfloat16", "float32"]', 'DTYPES = ["float32"]')
    spec = spec.replace("CORRECTNESS_SHAPES = [(1, 1), (5, 17), (33, 1000), (64, 2053)]", "CORRECTNESS_SHAPES = [(5, 17), (33, 1000)]")
    assert 'DTYPES = ["float32"]' in spec and "CORRECTNESS_SHAPES = [(5, 17), (33, 1000)]" in spec
    (op / "spec.py").write_text(spec + REFERENCES)
    (op / "scaled_softmax.py").write_text(WRONG)
    env.setenv("PYTHONPATH", str(liger_kernel.parent))
    return op


@pytest.mark.slow
def test_references_are_checked_then_timed_beside_the_best_version(softmax_dir, tmp_path):
    job = {"spec": str(softmax_dir / "spec.py"), "target_dir": str(softmax_dir), "device": "cpu", "backend": "interpreter",
           "impls": [{"label": "best", "path": str(softmax_dir / "softmax_triton.py")}], "torch_providers": ["torch_eager"],
           "check": ["best", "torch_eager"], "references": True, "seed": 5, "bench": True,
           "timing": {"min_reps": 5, "max_reps": 6, "budget_s": 0.05}}
    raw = run_worker(tmp_path / "w", job, backends.get("interpreter"), Settings(), tmp_path / "cache", name="final")
    assert raw["status"] == "ok", raw.get("message", "") + raw.get("log_tail", "")
    refs = raw["references"]
    assert refs["liger"] == {"source": "liger_kernel.ops.softmax (adapter in the spec)", "status": "ok", "reason": "", "checks": 2}
    assert refs["quack"]["status"] == "unavailable" and "No module named 'quack'" in refs["quack"]["reason"]
    assert refs["scaled"]["status"] == "incorrect" and "(5, 17) float32" in refs["scaled"]["reason"]
    assert refs["broken"]["status"] == "runtime_error" and "no kernel for this shape" in refs["broken"]["reason"]
    (shape,) = raw["timing"]["shapes"]
    assert set(shape["impls"]) == {"best", "torch_eager", "liger"}  # the wrong one has no time
    assert len(shape["impls"]["liger"]["samples_ms"]) >= 2 and set(shape["recheck"]) == {"best", "torch_eager"}

    (row,) = final_rows(raw)["rows"]
    liger_ms = shape["impls"]["liger"]["median_ms"]
    assert row["liger (ms)"] == f"{liger_ms:.6f}"
    assert row["vs liger"] == f"{liger_ms / shape['impls']['best']['median_ms']:.2f}x"
    assert row["quack (ms)"].startswith("unavailable: ModuleNotFoundError") and row["vs quack"] == "n/a"
    assert row["scaled (ms)"].startswith("incorrect: ") and row["vs scaled"] == "n/a"
    assert row["broken (ms)"].startswith("runtime_error: ") and row["vs broken"] == "n/a"
    assert row["torch.compile (ms)"] == "not timed"


@pytest.mark.slow
def test_compare_names_every_reference_and_why_one_has_no_time(softmax_dir, tmp_path):
    from loop.measure.probe import probe_environment

    env = probe_environment(tmp_path, Settings())
    result = run_compare(softmax_dir, tmp_path, env, "cpu", Settings(), tmp_path / "work", log=lambda *_: None)
    timed = {(r["implementation"], r["reference"]) for r in result["rows"] if r["status"] == "ok"}
    assert timed == {("softmax_triton", False), ("liger", True)}
    liger = next(r for r in result["rows"] if r["implementation"] == "liger")
    assert liger["backend"] == "reference: liger_kernel.ops.softmax (adapter in the spec) (interpreter worker)"
    down = {r["implementation"]: r["status"] for r in result["rows"] if r["status"] != "ok"}
    assert down["quack"].startswith("unavailable: ModuleNotFoundError") and down["scaled"].startswith("incorrect: ")
    text = render(result)
    assert "vs best reference" in text and "unavailable: ModuleNotFoundError: No module named 'quack'" in text


@pytest.mark.parametrize("references, match", [
    ({"liger": "liger_kernel.ops.softmax"}, "'module:function' or \\('module', adapter\\)"),
    ({"liger": ("liger_kernel.ops.softmax", "not callable")}, "'module:function' or"),
    ({"two words": "m:f"}, "must be an identifier"),
    (["m:f"], "must be a dict"),
])
def test_a_malformed_reference_is_the_specs_error(references, match):
    from types import SimpleNamespace

    from loop.common.errors import SpecError
    from loop.common.spec import references_of

    with pytest.raises(SpecError, match=match):
        references_of(SimpleNamespace(REFERENCES=references))
    assert references_of(SimpleNamespace()) == {}


def test_a_reference_named_like_an_implementation_is_the_specs_error(tmp_path):
    from types import SimpleNamespace

    from loop.common.errors import SpecError
    from loop.judge import references

    spec = SimpleNamespace(references={"best": ("m", "f", None)})
    with pytest.raises(SpecError, match="already the name of an implementation"):
        references.start(spec, {}, tmp_path, "final", {"best"})
    assert not list(tmp_path.iterdir())  # refused before any kernel process started


def test_report_measure_refuses_a_run_driven_by_its_own_harness():
    from types import SimpleNamespace

    from loop.common.errors import UserError
    from loop.tools.final import measure_final

    run = SimpleNamespace(state=SimpleNamespace(harness={"test_cmd": "t", "bench_cmd": "b", "bench_repeats": 3}))
    with pytest.raises(UserError, match="has no spec.py"):
        measure_final(run, None)
