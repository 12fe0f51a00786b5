"""`tileloop check` lists every problem of a target and its spec at once, with file:line and a fix;
`tileloop spec` writes a skeleton from the target's entry point that check then holds to its TODOs;
init refuses on the same problems."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO_ROOT, git
from loop.cli import main
from loop.target.skeleton import entry_parameters, skeleton

# a library-style op module: no run(), its entry point has its own name and a non-tensor argument
LIBRARY_OP = '''import torch
import triton
import triton.language as tl


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)


@triton.jit
def _scale_backward_kernel(dy_ptr, dx_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dx_ptr + offs, tl.load(dy_ptr + offs, mask=mask) * alpha, mask=mask)


def scale_forward(x, alpha=2.0):
    y = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[(triton.cdiv(n, 128),)](x, y, n, alpha, BLOCK=128)
    return y


def scale_backward(dy, alpha=2.0):
    dx = torch.empty_like(dy)
    n = dy.numel()
    _scale_backward_kernel[(triton.cdiv(n, 128),)](dy, dx, n, alpha, BLOCK=128)
    return dx
'''


def test_the_skeleton_follows_the_entry_point():
    params = entry_parameters(LIBRARY_OP, "scale_forward")
    assert params == [("x", None), ("alpha", "2.0")]
    text = skeleton("scale", "scale_forward", params)
    compile(text, "spec.py", "exec")
    assert 'ENTRY = "scale_forward"' in text and '"alpha": 2.0' in text and "def reference(x, alpha):" in text
    assert "NotImplementedError" in text  # what only the user knows fails check until written


@pytest.fixture
def op_repo(kernel_repo):
    op = kernel_repo / "kernels" / "scale"
    op.mkdir()
    (op / "scale_triton.py").write_text(LIBRARY_OP)
    return kernel_repo


def check_json(capsys, *argv) -> tuple[int, dict]:
    code = main(["check", *argv, "--device", "cpu", "--archs", "none", "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_from_spec_to_a_passing_check(op_repo, capsys):
    target = "kernels/scale/scale_triton.py"
    assert main(["spec", target, "--entry", "scale_forward", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    spec = op_repo / written["spec"]
    assert main(["spec", target, "--entry", "scale_forward"]) == 2  # never overwritten without --force
    capsys.readouterr()

    code, first = check_json(capsys, target)  # the skeleton as written: its reference and flops are TODOs
    assert code == 2 and not first["ok"] and first["error"] and first["hint"]
    lines = spec.read_text().splitlines()
    raise_line = next(i for i, t in enumerate(lines, 1) if "raise NotImplementedError" in t)
    flops_line = next(i for i, t in enumerate(lines, 1) if t.strip() == "return 0  # TODO")
    assert [(p["where"], "NotImplementedError" in p["what"]) for p in first["problems"]] == [
        (f"kernels/scale/spec.py:{raise_line}", True), (f"kernels/scale/spec.py:{flops_line}", False)]
    assert first["problems"][1]["what"].startswith("flops still returns the template's 0")
    assert "element count" in first["problems"][1]["hint"]

    text = spec.read_text().replace('raise NotImplementedError("write scale in PyTorch here")', "return x * alpha")
    spec.write_text(text.replace("return 0  # TODO", "return torch.Size(shape).numel()"))
    code, done = check_json(capsys, target)
    assert code == 0 and done["ok"] and done["problems"] == [], done["problems"]
    assert done["launched"] == ["_scale_kernel"]
    # the backward kernel is the target's too, and no checked shape reaches it: named, not an error;
    # bytes_moved's estimate kept its TODO: named too
    assert [w["what"] for w in done["warnings"]] == ["bytes_moved is still the template's estimate (# TODO)",
                                                     "no checked shape launches _scale_backward_kernel"]


def test_every_problem_at_once_with_where_and_a_fix(op_repo, capsys):
    spec = op_repo / "kernels" / "scale" / "spec.py"
    spec.write_text('''import torch

ENTRY = "scale_forward"
CORRECTNESS_SHAPES = [(1, 7), "5x33", (3, 9)]
BENCHMARK_SHAPES = [(64, 64)]
DTYPES = [torch.float32, "fp8ish"]
TOLERANCES = {"float32": (1e-6, 1e-6)}


def make_inputs(shape, dtype, seed):
    return {"x": torch.randn(shape).to(dtype)}


def reference(x):
    return x * 2


def flops(shape):
    return 1


def bytes_moved(shape, dtype):
    return 8
''')
    code, out = check_json(capsys, "kernels/scale/scale_triton.py")
    assert code == 2
    lines = [f"{p['where']}: {p['what']}" for p in out["problems"]]
    assert any(line.startswith("kernels/scale/spec.py:6: DTYPES[1]: 'fp8ish' is not a torch dtype") for line in lines), lines
    assert any(line.startswith("kernels/scale/spec.py:4: CORRECTNESS_SHAPES[1]: '5x33' is not a shape") for line in lines)
    assert len(out["problems"]) == 2 and all(p["hint"] for p in out["problems"])

    spec.write_text(spec.read_text().replace('"5x33"', "(5, 33)").replace(', "fp8ish"', ", torch.float16")
                    .replace("return x * 2", "return x * 2 if x.shape[0] != 5 else x * 3")
                    .replace('def make_inputs(shape, dtype, seed):\n', 'def make_inputs(shape, dtype, seed):\n'
                             '    if shape == (3, 9):\n        raise ValueError("no inputs at this shape yet")\n'))
    code, out = check_json(capsys, "kernels/scale/scale_triton.py")
    assert code == 2
    whats = [p["what"] for p in out["problems"]]
    assert sum("TOLERANCES has no entry for float16" in w for w in whats) == 1
    (problem,) = [p for p in out["problems"] if "TOLERANCES" in p["what"]]
    assert problem["where"] == "kernels/scale/spec.py:7"


def test_a_mismatch_and_a_failing_make_inputs_are_each_named_at_their_shape(op_repo, capsys):
    spec = op_repo / "kernels" / "scale" / "spec.py"
    spec.write_text('''import torch

ENTRY = "scale_forward"
CORRECTNESS_SHAPES = [(1, 7), (5, 33), (3, 9)]
BENCHMARK_SHAPES = [(64, 64)]
DTYPES = [torch.float32, torch.float16]
TOLERANCES = {torch.float32: (1e-6, 1e-6), torch.float16: (1e-3, 1e-3)}


def make_inputs(shape, dtype, seed):
    if shape == (3, 9):
        raise ValueError("no inputs at this shape yet")
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(shape, generator=g).to(dtype)}


def reference(x):
    return x * 2 if x.shape[0] != 5 else x * 3


def flops(shape):
    return 1


def bytes_moved(shape, dtype):
    return 8
''')
    code, out = check_json(capsys, "kernels/scale/scale_triton.py")
    assert code == 2
    # one problem per cause, naming every shape and dtype where it happens (a mismatch says by how much,
    # which differs with each dtype's tolerance)
    mismatches = [p for p in out["problems"] if "outputs do not match the reference" in p["what"]]
    assert sorted(m["what"].rsplit("(at ", 1)[1] for m in mismatches) == ["shape (5, 33) float16)", "shape (5, 33) float32)"]
    (failing,) = [p for p in out["problems"] if "no inputs at this shape yet" in p["what"]]
    assert failing["where"] == "kernels/scale/spec.py:12" and "(3, 9) float32, (3, 9) float16" in failing["what"]
    assert len(out["problems"]) == 3


@pytest.mark.slow
def test_init_refuses_a_spec_with_problems_and_names_them_all(op_repo, capsys):
    spec = op_repo / "kernels" / "scale" / "spec.py"  # another op's spec: its inputs do not fit this entry point
    spec.write_text((REPO_ROOT / "kernels" / "vector_add" / "spec.py").read_text() + '\nENTRY = "scale_forward"\n')
    git(op_repo, "add", "-A")
    git(op_repo, "commit", "-qm", "a spec for another op")
    code = main(["init", "kernels/scale/scale_triton.py", "--device", "cpu", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and "problem(s) in kernels/scale/scale_triton.py" in out["error"]
    assert "tileloop check" in out["hint"]
    (p,) = out["problems"]  # the same failure at every shape and dtype: one line that says so
    assert "the kernel failed" in p["what"] and "unexpected keyword" in p["what"] and "shape/dtype pairs" in p["what"]
    assert not (op_repo / "sandbox" / "CURRENT").exists()
    assert git(op_repo, "branch", "--list", "tileloop/*") == ""


def test_check_outside_a_repository_reads_the_files_where_they_are(tmp_path, capsys):
    op = tmp_path / "vector_add"
    shutil.copytree(REPO_ROOT / "kernels" / "vector_add", op, ignore=shutil.ignore_patterns("__pycache__"))
    code, out = check_json(capsys, str(op / "vector_add_triton.py"))
    assert code == 0 and out["ok"] and out["launched"] == ["add_kernel"]
    assert Path(out["spec"]).name == "spec.py"


def test_the_interpreter_limit_a_failure_points_at_is_named_with_its_line():
    from loop.worker.check_job import interpreter_limits

    source = '''import triton
import triton.language as tl
from triton.language.extra.libdevice import rsqrt


@triton.jit
def norm_kernel(y_ptr, x_ptr, eps, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK)).to(tl.float32)
    eps = eps.to(tl.float32)
    tl.store(y_ptr + tl.arange(0, BLOCK), x * rsqrt(tl.sum(x * x) + eps))
'''
    assert interpreter_limits(source, "InterpreterError: AttributeError(\"'float' object has no attribute 'to'\")") == (
        "`eps.to(...)` on a scalar argument (a Python number there)", 9)
    # a libdevice function is named at its call, not at its import
    assert interpreter_limits(source, "InterpreterError: TypeError('cannot convert None')") == (
        "the libdevice function `rsqrt`", 10)
    # the line that failed decides, whatever the message: the kernel got past its `.to()` there
    assert interpreter_limits(source, "InterpreterError: AttributeError(\"'float' object has no attribute 'to'\")",
                              line=10) == ("the libdevice function `rsqrt`", 10)
    only_imported = source.replace("x * rsqrt(tl.sum(x * x) + eps)", "x").replace("    eps = eps.to(tl.float32)\n", "")
    assert interpreter_limits(only_imported, "InterpreterError: TypeError('x')") == ("libdevice functions", 3)
    assert interpreter_limits("import triton\n", "anything") is None
