"""An output that does nothing must fail: a spec is refused when the whole comparison would accept
an all-zero output or the poisoned buffers left as they were, with a fix that makes them fail; an
output that is zero on part of its elements (a ReLU's negative half, a GELU's tail) is a fine spec.
The examples under tests/specs/relu and tests/specs/gelu_tanh are the specs a user would write."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import REPO_ROOT  # noqa: E402
from loop.common.harness import NothingPasses  # noqa: E402
from loop.common.outputs import as_outputs, blind_to_nothing  # noqa: E402
from loop.common.spec import Spec  # noqa: E402
from loop.worker.correctness import Harness  # noqa: E402

SPECS = REPO_ROOT / "tests" / "specs"
ALL_DTYPES = ("float16", "bfloat16", "float32")


def load_spec(op: str) -> types.ModuleType:
    loaded = importlib.util.spec_from_file_location(f"example_{op}_spec", SPECS / op / "spec.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def harness_of(module) -> Harness:
    return Harness(torch, Spec(torch, module), "cpu")


def computed_as_a_kernel(fn):
    """The op in fp32, stored in the inputs' dtype: what a correct kernel returns."""
    return lambda inputs, refs: [(None, fn(inputs["x"].float()).to(inputs["x"].dtype))]


def zeros(inputs, refs):
    return [(None, torch.zeros_like(inputs["x"]))]


@pytest.mark.parametrize("op, fn", [("relu", torch.relu),
                                    ("gelu_tanh", lambda x: torch.nn.functional.gelu(x, approximate="tanh"))])
def test_activation_specs_pass_and_an_all_zero_kernel_fails_them(op, fn):
    """A ReLU (half its outputs exactly 0) and a tanh-GELU on 2*randn inputs at bf16 (1e-2, 2e-2):
    each was refused by a guard on the share of elements where zeros pass (50%, 10.1% at (37, 1000))."""
    harness = harness_of(load_spec(op))
    for dtype in ALL_DTYPES:
        for shape in harness.spec.correctness_shapes:
            good = harness.check_with(computed_as_a_kernel(fn), "candidate", shape, dtype, 12345)
            assert good["ok"], (shape, dtype, good)
        bad = harness.check_with(zeros, "candidate", (5, 33), dtype, 12345)
        assert not bad["ok"] and "elements outside" in bad["reason"], (dtype, bad)
    assert harness.notes == []  # nothing to warn of: zeros pass only where the reference is (near) zero


def tiny_spec(reference, tolerances=None, shapes=((8, 64),)):
    def make_inputs(shape, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(shape, generator=g).to(dtype)}

    return types.SimpleNamespace(
        make_inputs=make_inputs, reference=reference, CORRECTNESS_SHAPES=list(shapes), BENCHMARK_SHAPES=[(64, 64)],
        DTYPES=["float32"], TOLERANCES=tolerances or {"float32": (1e-3, 1e-3)},
        flops=lambda shape: 1, bytes_moved=lambda shape, dtype: 1)


def test_outputs_within_atol_everywhere_are_refused_with_an_atol_that_then_works():
    spec = tiny_spec(lambda x: x * 1e-4)
    with pytest.raises(NothingPasses) as refused:
        harness_of(spec).check_with(computed_as_a_kernel(lambda x: x * 1e-4), "candidate", (8, 64), "float32", 3)
    blind = refused.value.blind
    assert blind.what == "an all-zero output" and blind.fix_in == "TOLERANCES"
    assert "whole comparison at shape (8, 64) float32" in str(refused.value) and "fix: " in str(refused.value)
    bound = float(re.search(r"below (\S+) ", blind.fix).group(1))
    assert 0 < bound < 1e-3 and bound == pytest.approx(blind.largest * (1 - 1e-3), rel=0.05)
    fixed = harness_of(tiny_spec(lambda x: x * 1e-4, {"float32": (bound / 2, 1e-3)}))
    assert fixed.check_with(computed_as_a_kernel(lambda x: x * 1e-4), "candidate", (8, 64), "float32", 3)["ok"]
    assert not fixed.check_with(zeros, "candidate", (8, 64), "float32", 3)["ok"]


def test_a_reference_zero_everywhere_names_make_inputs_and_a_tiny_shape_is_not_refused_for_chance():
    spec = tiny_spec(lambda x: torch.relu(-x.abs()), shapes=((8, 64), (1, 7)))
    with pytest.raises(NothingPasses) as refused:
        harness_of(spec).check_with(zeros, "candidate", (8, 64), "float32", 0)
    assert refused.value.blind.fix_in == "make_inputs" and "zero everywhere" in refused.value.blind.fix
    # seven outputs can all be zero by chance (a ReLU's, one time in 128): compared, not refused
    assert harness_of(spec).check_with(zeros, "candidate", (1, 7), "float32", 0)["ok"]
    # an rtol of 1 or more accepts zeros against anything, at any size
    loose = tiny_spec(lambda x: x * 3, {"float32": (1e-6, 1.0)}, shapes=((1, 7),))
    with pytest.raises(NothingPasses, match="rtol of float32 in TOLERANCES must be below 1"):
        harness_of(loose).check_with(zeros, "candidate", (1, 7), "float32", 0)


def test_the_whole_comparison_decides_not_each_output_alone():
    """A second output near zero (a mean of many values) is fine: zeros fail on the first."""
    spec = tiny_spec(lambda x: (x * 2, x.mean(-1) * 1e-4))
    call = lambda inputs, refs: [(n, r.clone()) for n, r in refs]  # noqa: E731
    assert harness_of(spec).check_with(call, "candidate", (8, 64), "float32", 0)["ok"]


def test_the_poisoned_buffer_passing_the_comparison_is_refused():
    top = torch.iinfo(torch.int32).max  # what `poison` leaves in an int32 buffer
    refs = as_outputs(torch.full((8, 64), top, dtype=torch.int32))
    blind = blind_to_nothing(torch, refs, 0.0, 0.0, "int32")
    assert blind is not None and blind.what == "the poisoned output left as it was" and blind.fix_in == "make_inputs"
    assert blind_to_nothing(torch, as_outputs(torch.arange(512, dtype=torch.int32)), 0.0, 0.0) is None


def test_a_tolerance_larger_than_most_nonzero_outputs_is_noted_not_refused():
    """Zeros pass on 80% of the elements, none of them zero: a kernel wrong there would pass."""
    def mostly_tiny(x):
        out = x * 1e-5
        out[..., ::5] = x[..., ::5] * 2
        return out

    harness = harness_of(tiny_spec(mostly_tiny))
    assert not harness.check_with(zeros, "candidate", (8, 64), "float32", 0)["ok"]
    assert [(shape, dtype, round(share, 1)) for shape, dtype, share, _ in harness.notes] == [((8, 64), "float32", 0.8)]


def check_json(capsys, target: Path) -> tuple[int, dict]:
    from loop.cli import main

    code = main(["check", str(target), "--device", "cpu", "--archs", "none", "--json"])
    return code, json.loads(capsys.readouterr().out)


ZERO_STORES = {"relu": ("tl.where(x > 0, x, 0.0)", "tl.zeros([BLOCK], dtype=x.dtype)"),
               "gelu_tanh": ("(0.5 * x * (1.0 + tanh)).to(y_ptr.dtype.element_ty)",
                             "tl.zeros([BLOCK], dtype=y_ptr.dtype.element_ty)")}


@pytest.mark.slow
@pytest.mark.parametrize("op", ["relu", "gelu_tanh"])
def test_tileloop_check_passes_an_activation_and_refuses_its_kernel_writing_zeros(op, tmp_path, capsys):
    target = SPECS / op / f"{op}_triton.py"
    code, out = check_json(capsys, target)
    assert code == 0 and out["ok"] and out["problems"] == [], out["problems"]
    assert [w["what"] for w in out["warnings"]] == ["bfloat16 is not checked on the CPU (the Triton interpreter has "
                                                    "no bfloat16)"]
    copy = tmp_path / op
    shutil.copytree(SPECS / op, copy, ignore=shutil.ignore_patterns("__pycache__"))
    kernel = copy / target.name
    stored, zero = ZERO_STORES[op]
    assert stored in kernel.read_text()
    kernel.write_text(kernel.read_text().replace(stored, zero))
    code, out = check_json(capsys, kernel)
    assert code == 2 and not out["ok"]
    shapes = {(p["what"].rsplit("(at shape ", 1)[1]) for p in out["problems"]}
    assert all("outputs do not match the reference" in p["what"] for p in out["problems"])
    assert {"(37, 1000) float16)", "(37, 1000) float32)", "(5, 33) float16)", "(5, 33) float32)"} <= shapes
