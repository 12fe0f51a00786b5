"""A case in the seed skill's layout (`v0.cu` with `extern "C" void solve(...)`, `ref.py` with
`reference(**kwargs)`) made a CUDA C target and a spec by `tileloop spec <case folder>`, then checked
on the CPU as far as the CPU goes (make_inputs and the case's reference run, the kernel not)."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys

import pytest

from loop.common import nvcc
from loop.common.errors import UserError
from loop.target import cuda_c as cuda_target

# the seed skill's own minimal CUDA template and reference
V0 = '''#include <cuda_runtime.h>

__global__ void kernel(
    const float* in0, const float* in1, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = in0[i] + in1[i];
    }
}

extern "C" void solve(
    float* in0, float* in1, float* out, int n) {
    int threads = 256;
    int blocks = (n + threads - 1) / threads;
    kernel<<<blocks, threads>>>(in0, in1, out, n);
    cudaDeviceSynchronize();
}
'''
REF = '''def reference(**kwargs):
    x = kwargs["in0"]
    y = kwargs["in1"]
    out = kwargs["out"]
    out.copy_(x + y)
'''


def _case(folder, kernel=V0, ref=REF, nested=False):
    (folder / "v0" if nested else folder).mkdir(parents=True, exist_ok=True)
    (folder / "v0" / "v0.cu" if nested else folder / "v0.cu").write_text(kernel)
    (folder / "ref.py").write_text(ref)
    return folder


def _load(spec_path):
    sys.path.insert(0, str(spec_path.parent))
    try:
        spec = importlib.util.spec_from_file_location("case_spec_under_test", spec_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(spec_path.parent))
        sys.modules.pop("ref", None)


@pytest.mark.slow  # runs tileloop check (the fast tier keeps the parsing tests): the fast tier stays under five minutes
def test_tileloop_spec_makes_a_case_a_target_and_check_runs_its_reference_on_the_cpu(tmp_path, capsys):
    pytest.importorskip("torch")
    from loop.cli import main
    from loop.common.settings import load
    from loop.target.check import check

    case = _case(tmp_path / "vec-add")
    assert main(["spec", str(case), "--json"]) == 0
    target, spec = case / "vec_add_cuda.cu", case / "spec.py"
    assert f'"target": "{target}"' in capsys.readouterr().out
    assert target.read_text() == V0 and spec.is_file()
    text = spec.read_text()
    assert "OUTPUTS = ('out',)" in text and "from ref import reference as case_reference" in text
    out = check(target, device="cpu", archs=[], settings=load(), root=case)
    assert out["language"] == "cuda"
    assert [p["what"] for p in out["problems"]] == [next(p["what"] for p in out["problems"] if "flops" in p["what"])]
    spec.write_text(text.replace("return 0  # TODO", "return math.prod(shape)"))
    capsys.readouterr()
    assert main(["check", str(target), "--device", "cpu", "--archs", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["language"] == "cuda", out["problems"]
    assert "the kernel itself was not run" in out["warnings"][0]["what"]
    # the case's reference is the one run: a ref.py that fails is named by check
    (case / "ref.py").write_text(REF.replace("out.copy_(x + y)", 'raise ValueError("the case reference ran")'))
    out = check(target, device="cpu", archs=[], settings=load(), root=case)
    assert not out["ok"] and any("the case reference ran" in p["what"] for p in out["problems"])


def test_the_specs_reference_is_the_cases_on_copies_of_the_inputs(tmp_path):
    torch = pytest.importorskip("torch")
    case = _case(tmp_path / "add", nested=True)  # the skill's output folder: ref.py and v0/v0.cu
    target, spec_path = cuda_target.import_case(case)
    assert target == case / "add_cuda.cu" and target.read_text() == V0
    spec = _load(spec_path)
    inputs = spec.make_inputs((5, 33), torch.float32, 0)
    inputs["out"] = torch.full((5, 33), 7.0)
    got = spec.reference(**inputs)
    assert torch.equal(got, inputs["in0"] + inputs["in1"])
    assert (inputs["out"] == 7.0).all()  # the caller's buffer untouched: the case wrote a copy


def test_a_case_reference_that_returns_its_result_is_compared_as_returned(tmp_path):
    torch = pytest.importorskip("torch")
    case = _case(tmp_path / "add", ref="def reference(**kwargs):\n    return kwargs['in0'] * 2\n")
    _, spec_path = cuda_target.import_case(case)
    spec = _load(spec_path)
    inputs = spec.make_inputs((3, 4), torch.float32, 1)
    assert torch.equal(spec.reference(**inputs), inputs["in0"] * 2)


@pytest.mark.parametrize("ref,outputs", [
    (REF, {"out"}),
    ("def reference(**kw):\n    kw['dst'].copy_(kw['src'])\n", {"dst"}),
    ("def reference(**kw):\n    o = kw.get('y')\n    o[:] = kw['x'] * 2\n", {"y"}),
    ("import torch\ndef reference(**kw):\n    torch.add(kw['a'], kw['b'], out=kw['c'])\n", {"c"}),
    ("def reference(x, out, **kw):\n    out += x\n    out[0] = 1\n", {"out"}),
    ("def reference(**kw):\n    y = kw['x'].exp()\n    return y\n", set()),
])
def test_the_outputs_are_what_the_reference_writes_in_place(ref, outputs):
    assert cuda_target.written_in_place(cuda_target.case_reference(ref, "ref.py")) == outputs


def test_the_outputs_follow_the_reference_not_the_names(tmp_path):
    case = _case(tmp_path / "add", ref=REF.replace('"out"', '"in1"'))  # writes in1, not the buffer named out
    _, spec_path = cuda_target.import_case(case)
    tree = ast.parse(spec_path.read_text())
    outputs = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "OUTPUTS")
    assert ast.literal_eval(outputs) == ("in1",)


@pytest.mark.parametrize("files,message", [
    ({"v0.cu": V0}, "has no ref.py"),
    ({"ref.py": REF}, "has no v0.cu"),
    ({}, "has no v0.cu and no ref.py"),
    ({"v0.cu": V0, "ref.py": "def other(**kwargs):\n    pass\n"}, "defines no reference"),
    ({"v0.cu": V0, "ref.py": "def reference(**kwargs:\n"}, r"ref.py:1: "),
    ({"v0.cu": V0.replace('extern "C" ', ""), "ref.py": REF}, 'declares no extern "C" void solve'),
])
def test_a_folder_that_is_no_case_is_one_line_naming_why(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(UserError, match=message) as info:
        cuda_target.import_case(tmp_path)
    assert "\n" not in info.value.message
    assert not (tmp_path / "spec.py").exists()


def test_an_imported_case_is_not_overwritten_without_force(tmp_path):
    case = _case(tmp_path / "add")
    target, spec = cuda_target.import_case(case)
    spec.write_text("# edited\n")
    with pytest.raises(UserError, match="exist"):
        cuda_target.import_case(case)
    assert spec.read_text() == "# edited\n"
    cuda_target.import_case(case, force=True)
    assert "case_reference" in spec.read_text() and target.read_text() == V0


@pytest.mark.slow
@pytest.mark.skipif(nvcc.toolchain() is None, reason=nvcc.why_none())
def test_an_imported_case_passes_check_with_its_build_for_sm_90(tmp_path):
    """The CPU's whole check of an imported case: the spec's, the case's reference, and nvcc's build."""
    pytest.importorskip("torch")
    from loop.common.settings import load
    from loop.target.check import check

    case = _case(tmp_path / "add")
    target, spec = cuda_target.import_case(case)
    spec.write_text(spec.read_text().replace("return 0  # TODO", "return math.prod(shape)"))
    out = check(target, device="cpu", archs=["sm_90"], settings=load(), root=case)
    assert out["ok"], out["problems"]
    assert "the ahead-of-time build for sm_90" in out["warnings"][0]["what"]
    (case / "add_cuda.cu").write_text(V0.replace("in0[i] + in1[i]", "in0[i] + in2[i]"))
    out = check(target, device="cpu", archs=["sm_90"], settings=load(), root=case)
    assert any("does not compile for sm_90" in p["what"] and "in2" in p["what"] for p in out["problems"])
