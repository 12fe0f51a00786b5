"""Bring your own kernel, on code this project did not write: Liger-Kernel 0.8.5's forward ops
(installed from PyPI at test time), each op module copied unmodified into a user's repository with a
spec of ours beside it (tests/specs/liger/), checked the way a new user would check them.

The fast tier checks the two ends under the Triton interpreter: softmax runs and passes; rms_norm's
kernels call `.to()` on a Python float, which the interpreter cannot run, and check says so in one
problem at the line that failed. It also holds the first steps of a user (the skeleton `tileloop
spec` writes for Liger's rms_norm, and what check says of it) and a first draft with several typical
mistakes, every one named at once. The slow tier checks every spec against Liger's own kernels, made
runnable by the interpreter at test time, so that the specs themselves are proven right on the CPU.
"""

from __future__ import annotations

import json
import re

import pytest

from foreign import SPECS, liger_env, liger_op_repo, user_repo
from loop.cli import main


def check(capsys, target: str) -> tuple[int, dict]:
    code = main(["check", target, "--device", "cpu", "--archs", "none", "--json"])
    return code, json.loads(capsys.readouterr().out)


def line_of(path, text: str, nth: int = 0) -> int:
    """The line number of the `nth` line of `path` that contains `text`."""
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line][nth]


@pytest.fixture
def liger(liger_kernel, monkeypatch, clean_env):
    liger_env(monkeypatch, liger_kernel)
    return liger_kernel


def test_rms_norm_is_one_problem_the_interpreter_construct_at_the_line_that_failed(liger, tmp_path, monkeypatch,
                                                                                    capsys):
    repo = liger_op_repo(tmp_path / "user", liger, "rms_norm")
    monkeypatch.chdir(repo)
    code, out = check(capsys, "ops/rms_norm.py")
    assert code == 2 and len(out["problems"]) == 1, out["problems"]
    (p,) = out["problems"]
    target = repo / "ops" / "rms_norm.py"
    # Llama casting takes the `else` branch: the row kernel's second `eps.to(...)`, not the first one in the file
    row_kernel = line_of(target, "eps = eps.to(tl.float32)", 0)
    assert row_kernel > line_of(target, "eps = eps.to(X_row_dtype)", 0)
    assert p["where"] == f"ops/rms_norm.py:{row_kernel}"
    assert "interpreter cannot run `eps.to(...)` on a scalar argument" in p["what"]
    # the row-blocked kernel (the last correctness shape) fails at its own line, named in the same problem
    assert f"and at line {line_of(target, 'eps = eps.to(tl.float32)', 1)}" in p["what"]
    assert "5 shape/dtype pairs" in p["what"] and "on a GPU" in p["hint"]
    assert [w["what"] for w in out["warnings"]] == ["bfloat16 is not checked on the CPU (the Triton interpreter has "
                                                    "no bfloat16)"]


def test_softmax_passes_check_under_the_interpreter(liger, tmp_path, monkeypatch, capsys):
    repo = liger_op_repo(tmp_path / "user", liger, "softmax")
    monkeypatch.chdir(repo)
    code, out = check(capsys, "ops/softmax.py")
    assert code == 0 and out["ok"] and out["problems"] == [], out["problems"]
    assert out["launched"] == ["_softmax_single_block_forward_kernel"]
    # the multi-block forward kernel is Liger's too; its own block size makes every row one block
    unreached = next(w["what"] for w in out["warnings"] if "no checked shape launches" in w["what"])
    assert "_softmax_multi_block_forward_kernel" in unreached


def test_the_skeleton_of_liger_rms_norm_and_what_check_says_of_it(liger, tmp_path, monkeypatch, capsys):
    repo = user_repo(tmp_path / "user", {"ops/rms_norm.py": liger / "ops" / "rms_norm.py"})
    monkeypatch.chdir(repo)
    assert main(["spec", "ops/rms_norm.py", "--entry", "rms_norm_forward"]) == 0
    capsys.readouterr()
    spec = repo / "ops" / "spec.py"
    text = spec.read_text()
    # what the entry returns is quoted, with an adapter that compares only some of it
    assert "#     (Y.view(*shape), X, RSTD, BLOCK_SIZE, num_warps, casting_mode)" in text
    assert "# def entry(target, X, W, eps, offset, casting_mode, row_mode):" in text
    assert '"W": torch.randn(shape[-1]' in text  # a weight is a vector over the last dimension
    code, out = check(capsys, "ops/rms_norm.py")
    assert code == 2
    left = {p["where"]: p["what"] for p in out["problems"]}
    for name in ("eps", "offset", "casting_mode", "row_mode"):  # every value left to fill in, each at its line
        placeholder = '"' + name + '": ...'
        assert f"make_inputs: {name!r} is still `...`" in left[f"ops/spec.py:{line_of(spec, placeholder)}"]
    assert "reference still raises NotImplementedError" in left[f"ops/spec.py:{line_of(spec, 'raise NotImplementedError')}"]
    assert "still returns the template's 0" in left[f"ops/spec.py:{line_of(spec, 'return 0  # TODO')}"]  # flops
    assert len(out["problems"]) == 6


def test_an_autograd_function_as_the_entry_writes_an_adapter_that_check_passes(liger, tmp_path, monkeypatch, capsys):
    repo = user_repo(tmp_path / "user", {"ops/softmax.py": liger / "ops" / "softmax.py"})
    monkeypatch.chdir(repo)
    assert main(["spec", "ops/softmax.py"]) == 2  # no run(): the hint names the functions and the Function class
    assert "classes with a forward: LigerSoftmaxFunction" in capsys.readouterr().err
    assert main(["spec", "ops/softmax.py", "--entry", "LigerSoftmaxFunction"]) == 0
    capsys.readouterr()
    spec = repo / "ops" / "spec.py"
    text = spec.read_text()
    assert "return target.LigerSoftmaxFunction.apply(input_)" in text and "ENTRY" not in text.split("import torch")[1]
    spec.write_text(text.replace('raise NotImplementedError("write softmax in PyTorch here")',
                                 "return torch.softmax(input_, dim=-1)")
                    .replace("torch.float16: (1e-3, 1e-3), torch.float32: (1e-5, 1e-5)",
                             "torch.float16: (1e-6, 1e-2), torch.float32: (1e-9, 1e-5)")
                    .replace("    return 0  # TODO", "    return 5 * shape[0] * shape[1]"))  # flops: max, exp, sum, div
    code, out = check(capsys, "ops/softmax.py")
    assert code == 0 and out["ok"], out["problems"]


DRAFT = '''import torch

CORRECTNESS_SHAPES = [(2, 64), (5, 33), (37, 1000)]
BENCHMARK_SHAPES = [(4096, 4096), (2048, 16384)]
DTYPES = [torch.float16, "float32", "fp16"]
TOLERANCES = {torch.float16: (1e-6, 1e-2), "float32": (1e-8, 1e-5)}


def entry(target, x):
    return target.LigerSoftmaxFunction.apply(x)


def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rows, cols = shape
    heads = 4
    x = torch.randn(rows, heads, cols // heads, generator=g).reshape(rows, cols)
    return {"x": x.to(dtype)}


def flops(shape):
    rows, cols = shape
    return 5 * rows * cols


def bytes_moved(shape, dtype):
    return 2 * torch.Size(shape).numel() * dtype.itemsize
'''


@pytest.mark.slow  # the fast tier stays well under five minutes
def test_a_first_draft_with_typical_mistakes_gets_every_problem_at_once(liger, tmp_path, monkeypatch, capsys):
    """Dtypes in mixed forms with one that is no dtype, make_inputs without a device (accepted) that
    raises at one shape, no reference: each named, with where and a fix, in one check."""
    repo = liger_op_repo(tmp_path / "user", liger, "softmax", DRAFT)
    monkeypatch.chdir(repo)
    code, out = check(capsys, "ops/softmax.py")
    assert code == 2
    by_what = {p["what"]: p for p in out["problems"]}
    assert len(by_what) == 3, list(by_what)
    assert by_what["the spec has no reference"]["where"] == "ops/spec.py"
    dtype = by_what["DTYPES[2]: 'fp16' is not a torch dtype; write torch.float16 or 'float16'"]
    assert dtype["where"] == "ops/spec.py:5" and dtype["hint"]
    (raised,) = [p for p in out["problems"] if p["what"].startswith("RuntimeError")]
    assert raised["where"] == f"ops/spec.py:{line_of(repo / 'ops' / 'spec.py', '.reshape(rows, cols)')}"
    assert raised["what"].endswith("(at 2 shape/dtype pairs: (5, 33) float16, (5, 33) float32)") and raised["hint"]
    assert all(p["hint"] for p in out["problems"])

    # the same draft with the reference written and DTYPES as one dtype alone: the make_inputs mistake is all that is left
    spec = repo / "ops" / "spec.py"
    spec.write_text(spec.read_text().replace('DTYPES = [torch.float16, "float32", "fp16"]', "DTYPES = torch.float16")
                    + "\n\ndef reference(x):\n    return torch.softmax(x, dim=-1)\n")
    code, out = check(capsys, "ops/softmax.py")
    assert code == 2 and len(out["problems"]) == 1, out["problems"]
    assert out["problems"][0]["what"].startswith("RuntimeError") and "(at shape (5, 33) float16)" in out["problems"][0]["what"]


@pytest.mark.slow
def test_a_spec_comparing_fewer_outputs_than_the_entry_returns_is_told_how_to_pick_them(liger, tmp_path, monkeypatch,
                                                                                        capsys):
    spec = tmp_path / "spec.py"
    text = (SPECS / "liger" / "layer_norm.py").read_text()
    text = re.sub(r"\ndef entry\(.*?\n\n\n", "\nENTRY = 'layer_norm_forward'\n\n\n", text, flags=re.S)
    text = re.sub(r"\n# Liger's own, unmodified.*?\nREFERENCES = .*?\n", "\n", text, flags=re.S)  # it names the adapter
    spec.write_text(text.replace("CORRECTNESS_SHAPES = [(1, 7), (5, 33), (37, 1000), (3, 4097)]",
                                       "CORRECTNESS_SHAPES = [(5, 33)]"))
    repo = liger_op_repo(tmp_path / "user", liger, "layer_norm", spec, runnable_on_the_cpu=True)
    monkeypatch.chdir(repo)
    code, out = check(capsys, "ops/layer_norm.py")
    assert code == 2
    (p,) = out["problems"]
    assert "the kernel gave 6 output(s), the reference 3" in p["what"]
    assert "layer_norm_forward() returns" in p["hint"] and "entry(target, **inputs)" in p["hint"]


@pytest.mark.slow
@pytest.mark.parametrize("op, construct, line_text", [
    ("layer_norm", "the libdevice function `rsqrt`", "rstd = rsqrt(var + eps.to(tl.float32))"),
    ("swiglu", "`gate_multiplier.to(...)` on a scalar argument", "* gate_multiplier.to(tl.float32)"),
])
def test_each_unrunnable_op_is_one_problem_at_its_line(liger, tmp_path, monkeypatch, capsys, op, construct, line_text):
    repo = liger_op_repo(tmp_path / "user", liger, op)
    monkeypatch.chdir(repo)
    code, out = check(capsys, f"ops/{op}.py")
    assert code == 2 and len(out["problems"]) == 1, out["problems"]
    (p,) = out["problems"]
    assert construct in p["what"] and p["where"] == f"ops/{op}.py:{line_of(repo / 'ops' / f'{op}.py', line_text)}"


@pytest.mark.slow
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax", "swiglu"])
def test_each_spec_holds_against_liger_own_kernels_on_the_cpu(liger, tmp_path, monkeypatch, capsys, op):
    """Every output of every spec compared with Liger's kernels, run by the interpreter (the two constructs
    it cannot run replaced at test time): the specs are right, not merely well-formed."""
    repo = liger_op_repo(tmp_path / "user", liger, op, runnable_on_the_cpu=True)
    monkeypatch.chdir(repo)
    code, out = check(capsys, f"ops/{op}.py")
    assert code == 0 and out["ok"], out["problems"]
    forward = {"rms_norm": ["_block_rms_norm_forward_kernel", "_rms_norm_forward_kernel"],
               "layer_norm": ["_layer_norm_forward_kernel"], "softmax": ["_softmax_single_block_forward_kernel"],
               "swiglu": ["_swiglu_forward_kernel"]}[op]
    assert out["launched"] == forward
    # a wrong reference is caught: the specs are tests, not formalities
    spec = repo / "ops" / "spec.py"
    spec.write_text(spec.read_text().replace("def reference(", "def _right(") +
                    "\n\ndef reference(**inputs):\n    out = _right(**inputs)\n"
                    "    return tuple(o * 1.05 for o in out) if isinstance(out, tuple) else out * 1.05\n")
    code, out = check(capsys, f"ops/{op}.py")
    assert code == 2 and all("outputs do not match the reference" in p["what"] for p in out["problems"])


@pytest.mark.slow
def test_what_the_interpreter_cannot_run_is_still_built_for_the_gpu(liger, tmp_path, monkeypatch, capsys):
    """The interpreter's limit is no reason to skip the ahead-of-time build: it is the CPU's only proof
    that such a kernel compiles. A target that does not build is named too."""
    repo = liger_op_repo(tmp_path / "user", liger, "rms_norm")
    monkeypatch.chdir(repo)
    code = main(["check", "ops/rms_norm.py", "--device", "cpu", "--archs", "sm_90", "--json"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "building ops/rms_norm.py ahead of time for sm_90" in captured.err
    assert code == 2 and len(out["problems"]) == 1 and "interpreter cannot run" in out["problems"][0]["what"]

    target = repo / "ops" / "rms_norm.py"  # a kernel that cannot compile: the build says so, beside the limit
    target.write_text(target.read_text().replace("mean_square = tl.sum(X_row * X_row, axis=0) / n_cols",
                                                 "mean_square = tl.sum(X_row * X_row, axis=0) / n_cols + undefined_name", 1))
    code = main(["check", "ops/rms_norm.py", "--device", "cpu", "--archs", "sm_90", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and any("does not compile for sm_90" in p["what"] for p in out["problems"]), out["problems"]


@pytest.mark.slow
def test_a_reference_failing_at_a_shape_does_not_hide_the_kernel_there(liger, tmp_path, monkeypatch, capsys):
    text = (SPECS / "liger" / "rms_norm.py").read_text().replace(
        "    rstd = torch.rsqrt(", "    if X.shape == (5, 33):\n        raise ValueError('not yet at this shape')\n"
                                  "    rstd = torch.rsqrt(")
    repo = liger_op_repo(tmp_path / "user", liger, "rms_norm", text)
    monkeypatch.chdir(repo)
    code, out = check(capsys, "ops/rms_norm.py")
    assert code == 2 and len(out["problems"]) == 2, out["problems"]
    failing, limit = sorted(out["problems"], key=lambda p: "interpreter" in p["what"])
    assert failing["what"] == "ValueError: not yet at this shape (at shape (5, 33) float16)"
    assert failing["where"] == f"ops/spec.py:{line_of(repo / 'ops' / 'spec.py', 'raise ValueError')}"
    assert "(5, 33) float16" in limit["what"] and "5 shape/dtype pairs" in limit["what"]  # the kernel was tried there too
