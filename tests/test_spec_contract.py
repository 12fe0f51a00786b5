"""The spec contract as users write it: dtypes as torch dtypes or names, shapes as lists, make_inputs
with or without a device, one signature for flops/bytes_moved, every output compared (a tuple, a
dict, or several OUTPUTS buffers), and the entry point named by the spec; each mistake one SpecError
naming the name and the fix. Kernels here are plain torch functions: the harness only calls them."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from loop.worker.correctness import Harness  # noqa: E402
from loop.worker.failures import SpecError  # noqa: E402
from loop.common.spec import Spec  # noqa: E402


def module(name: str, **names) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(names)
    return mod


def make_inputs(shape, dtype, seed):  # no device: tileloop places the tensors
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(shape, generator=g).to(dtype)}


def rms(x):
    x32 = x.float()
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (x32 * rstd).to(x.dtype), rstd


def spec_module(**overrides) -> types.ModuleType:
    names = dict(make_inputs=make_inputs, reference=lambda x: rms(x), CORRECTNESS_SHAPES=[[3, 64], (5, 33)],
                 BENCHMARK_SHAPES=[(64, 1024)], DTYPES=[torch.float32, "float16"],
                 TOLERANCES={torch.float32: (1e-5, 1e-5), "torch.float16": (2e-3, 2e-3)},
                 flops=lambda shape: 3 * shape[0] * shape[1],
                 bytes_moved=lambda shape, dtype: 2 * shape[0] * shape[1] * torch.empty((), dtype=dtype).element_size())
    names.update(overrides)
    return module("spec_under_test", **names)


def test_dtypes_and_shapes_as_pytorch_code_writes_them():
    spec = Spec(torch, spec_module())
    assert spec.dtypes == ["float32", "float16"]
    assert spec.tolerance("float16") == (2e-3, 2e-3) and spec.tolerance("float32") == (1e-5, 1e-5)
    assert spec.correctness_shapes == [(3, 64), (5, 33)] and spec.interpreter_shapes == [(5, 33)]
    assert spec.outputs == ("out",) and spec.entry_name == "run"  # the documented defaults
    assert spec.bytes_moved((64, 1024), "float16") == 2 * 64 * 1024 * 2  # bytes_moved gets a torch.dtype
    assert spec.flops((64, 1024), "float16") == 3 * 64 * 1024  # a one-argument flops works too


@pytest.mark.parametrize("override, message", [
    ({"DTYPES": ["float16", "half-ish"]}, r"DTYPES\[1\]: 'half-ish' is not a torch dtype"),
    ({"TOLERANCES": {"fp16": (1, 1)}}, "TOLERANCES key: 'fp16' is not a torch dtype"),
    ({"TOLERANCES": {"float16": 1e-3}}, r"TOLERANCES\['float16'\] must be \(atol, rtol\)"),
    ({"CORRECTNESS_SHAPES": [(3, 64), "5x33"]}, r"CORRECTNESS_SHAPES\[1\]: '5x33' is not a shape"),
    ({"BENCHMARK_SHAPES": []}, "BENCHMARK_SHAPES must be a non-empty list"),
])
def test_each_mistake_is_one_spec_error_naming_it(override, message):
    with pytest.raises(SpecError, match=message):
        Spec(torch, spec_module(**override))


def test_make_inputs_without_device_is_placed_and_with_device_is_held_to_it():
    placed = Spec(torch, spec_module()).make_inputs((3, 64), "float16", 0, "meta")
    assert placed["x"].device.type == "meta" and placed["x"].dtype == torch.float16

    def careless(shape, dtype, seed, device):  # takes a device and ignores it
        return make_inputs(shape, dtype, seed)

    with pytest.raises(SpecError, match=r"make_inputs\(device='meta'\) returned x on cpu"):
        Spec(torch, spec_module(make_inputs=careless)).make_inputs((3, 64), "float16", 0, "meta")


def test_every_output_is_compared_and_a_wrong_second_one_is_named():
    spec = Spec(torch, spec_module(ENTRY="rms_norm_forward"))
    harness = Harness(torch, spec, "cpu")
    good = module("op", rms_norm_forward=lambda x: rms(x))
    assert harness.check_one(good, "candidate", (5, 33), "float32", 1)["ok"]

    def stale_rstd(x):  # the normalised rows are right, the saved rstd is not
        y, rstd = rms(x)
        return y, rstd * 1.01

    rec = harness.check_one(module("op", rms_norm_forward=stale_rstd), "candidate", (5, 33), "float32", 1)
    assert not rec["ok"] and rec["reason"].startswith("output 1: ")


def test_outputs_by_name_and_in_place_buffers_are_all_compared():
    def inputs_with_buffers(shape, dtype, seed, device):
        x = make_inputs(shape, dtype, seed)["x"].to(device)
        return {"x": x, "y": torch.empty_like(x), "rstd": torch.empty(shape[0], 1, device=device)}

    def reference(x, y, rstd):
        out, r = rms(x)
        return {"y": out, "rstd": r}

    spec = Spec(torch, spec_module(make_inputs=inputs_with_buffers, reference=reference, OUTPUTS=("y", "rstd")))
    harness = Harness(torch, spec, "cpu")

    def writes_both(x, y, rstd):
        out, r = rms(x)
        y.copy_(out)
        rstd.copy_(r)

    def forgets_rstd(x, y, rstd):  # rstd is left poisoned (NaN)
        y.copy_(rms(x)[0])

    assert harness.check_one(module("op", run=writes_both), "candidate", (5, 33), "float32", 2)["ok"]
    rec = harness.check_one(module("op", run=forgets_rstd), "candidate", (5, 33), "float32", 2)
    assert not rec["ok"] and rec["reason"].startswith("rstd: ") and "NaN" in rec["reason"]


def test_an_adapter_in_the_spec_calls_a_library_api_as_is():
    def entry(target, x):  # the library's op takes a weight and an epsilon: the spec supplies them
        return target.LibraryRMSNorm.apply(x, None, 1e-6)

    class LibraryRMSNorm:
        @staticmethod
        def apply(x, weight, eps):
            return rms(x)

    spec = Spec(torch, spec_module(entry=entry))
    rec = Harness(torch, spec, "cpu").check_one(module("lib_op", LibraryRMSNorm=LibraryRMSNorm), "candidate", (3, 64),
                                                "float16", 3)
    assert rec["ok"], rec
    with pytest.raises(SpecError, match="no function 'run'.*ENTRY"):
        Spec(torch, spec_module()).entry(module("lib_op"))


def test_the_static_contract_reads_the_same_forms(tmp_path):
    from loop.common.errors import UserError
    from loop.target.contract import load_kernel, spec_dtypes

    op = tmp_path / "kernels" / "rms"
    op.mkdir(parents=True)
    target = op / "rms_triton.py"
    target.write_text("import triton\n\ndef rms_norm_forward(x):\n    return x\n")
    spec = op / "spec.py"
    body = ("import torch\nDTYPES = [torch.float16, 'bfloat16', 'torch.float32']\nTOLERANCES = {}\nCORRECTNESS_SHAPES = []\n"
            "BENCHMARK_SHAPES = []\ndef make_inputs(shape, dtype, seed): pass\ndef reference(x): pass\n"
            "def flops(shape): pass\ndef bytes_moved(shape, dtype): pass\n")
    spec.write_text(body)
    assert spec_dtypes(spec) == ["float16", "bfloat16", "float32"]
    with pytest.raises(UserError, match="no top-level run") as exc:  # a library module has no run()
        load_kernel(target, tmp_path)
    assert "ENTRY" in exc.value.hint
    spec.write_text(body + "ENTRY = 'rms_norm_forward'\n")
    assert load_kernel(target, tmp_path).language == "triton"
    spec.write_text(body + "ENTRY = 'rms_norm'\n")
    with pytest.raises(UserError, match="no top-level rms_norm"):
        load_kernel(target, tmp_path)
    spec.write_text(body + "def entry(target, x):\n    return target.rms_norm_forward(x)\n")
    assert load_kernel(target, tmp_path).op == "rms"


def test_a_reference_zeros_would_pass_everywhere_is_refused_but_not_one_near_zero_in_part():
    """An all-zero output that passes the whole comparison makes the spec no test; outputs near zero
    on a fifth of the elements do not (zeros fail on the rest), nor do seven outputs near zero by
    chance (Liger's layer_norm at 1x7 fp16 on an H100)."""
    def near_zero_every_fifth(x):
        out = x.float().clone()
        out[..., ::5] = 1e-9
        return out

    zeros = lambda inputs, refs: [(None, torch.zeros_like(inputs["x"]))]  # noqa: E731
    part = Harness(torch, Spec(torch, spec_module(reference=near_zero_every_fifth)), "cpu")
    call = lambda inputs, refs: [(None, near_zero_every_fifth(inputs["x"]))]  # noqa: E731
    assert part.check_with(call, "candidate", (8, 64), "float32", 0)["ok"]
    assert not part.check_with(zeros, "candidate", (8, 64), "float32", 0)["ok"]
    everywhere = Harness(torch, Spec(torch, spec_module(reference=lambda x: x.float() * 1e-9)), "cpu")
    with pytest.raises(SpecError, match="an all-zero output would pass the whole comparison at shape \\(8, 64\\)"):
        everywhere.check_with(zeros, "candidate", (8, 64), "float32", 0)
    assert everywhere.check_with(zeros, "candidate", (1, 7), "float32", 0)["ok"]  # 7 elements: chance
