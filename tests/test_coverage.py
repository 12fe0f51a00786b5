"""Launch coverage: a change that touches only device code no checked shape launches is not kept."""

from __future__ import annotations

import json

import pytest

from loop import decide
from loop.cli import main
from loop.target.coverage import touched, unexercised
from test_check import LIBRARY_OP

HELPER = '''import triton
import triton.language as tl


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def forward_kernel(x_ptr, n):
    tl.store(x_ptr, _twice(tl.load(x_ptr)))


@triton.jit
def backward_kernel(x_ptr, n):
    tl.store(x_ptr, tl.load(x_ptr) * 3)


def run(x):
    forward_kernel[(1,)](x, 1)
'''


def test_only_unlaunched_device_code_is_unexercised():
    launched = ["forward_kernel"]
    back = HELPER.replace("* 3)", "* 4)")
    assert touched(HELPER, back) == ({"backward_kernel"}, False)
    assert unexercised(HELPER, back, launched) == ["backward_kernel"]
    helper = HELPER.replace("return x * 2", "return x + x")  # a helper the launched kernel calls: exercised
    assert unexercised(HELPER, helper, launched) == []
    host = back.replace("forward_kernel[(1,)](x, 1)", "forward_kernel[(1,)](x, 1)\n    return None")
    assert unexercised(HELPER, host, launched) == []  # host code changed too: it may run on any call
    module_level = "BLOCK = 64\n" + back  # a new name bound to a literal does nothing until a function reads it
    assert touched(HELPER, module_level) == ({"backward_kernel"}, False)
    assert unexercised(HELPER, module_level, launched) == ["backward_kernel"]
    for runs_on_import in ("import liger_kernel.ops.utils\n", "BLOCK = compute()\n", "import os\nos.environ['X'] = '1'\n"):
        assert unexercised(HELPER, runs_on_import + back, launched) == [], runs_on_import
    changed_constant = HELPER.replace("import triton\n", "import triton\nBLOCK = 64\n")
    assert unexercised(changed_constant, changed_constant.replace("BLOCK = 64", "BLOCK = 128").replace("* 3)", "* 4)"),
                       launched) == []  # a module-level value changed: it may be read by what ran
    assert unexercised(HELPER, back, ["forward_kernel", "backward_kernel"]) == []
    both = back.replace("tl.store(x_ptr, _twice(tl.load(x_ptr)))", "tl.store(x_ptr, _twice(tl.load(x_ptr)) + 0)")
    assert touched(HELPER, both)[0] == {"forward_kernel", "backward_kernel"}
    assert unexercised(HELPER, both, launched) == []  # part of it ran (an H100 run once reverted such a change)


def test_host_code_counts_as_run_only_when_the_checks_called_it():
    host = HELPER + "\n\ndef run_backward(x):\n    backward_kernel[(1,)](x, 1)\n"
    changed = host.replace("backward_kernel[(1,)](x, 1)", "backward_kernel[(2,)](x, 1)")
    assert touched(host, changed) == ({"run_backward"}, False)
    assert unexercised(host, changed, ["forward_kernel"], called=["run"]) == ["run_backward"]
    assert unexercised(host, changed, ["forward_kernel"], called=["run", "run_backward"]) == []
    assert unexercised(host, changed, ["forward_kernel"]) == []  # who called what unknown: it may have run


def test_the_decision_reverts_an_unexercised_change_before_it_looks_at_speed():
    shape = decide.compare_shape((8,), [2.0] * 10, [1.0] * 10, decide.Policy())  # a 2x "speedup"
    d = decide.decide(decide.Policy(), shapes=[shape], unexercised=["backward_kernel"])
    assert (d.action, d.verdict) == ("revert", "unexercised") and "backward_kernel" in d.reason


@pytest.mark.slow
def test_a_step_that_changes_only_the_backward_kernel_is_not_kept(kernel_repo, capsys):
    from conftest import git

    op = kernel_repo / "kernels" / "scale"
    op.mkdir()
    target = op / "scale_triton.py"
    target.write_text(LIBRARY_OP)
    (op / "spec.py").write_text('''import torch

ENTRY = "scale_forward"
CORRECTNESS_SHAPES = [(1, 7), (5, 33)]
BENCHMARK_SHAPES = [(64, 64)]
INTERPRETER_SHAPES = [(16, 64)]
DTYPES = [torch.float32]
TOLERANCES = {torch.float32: (1e-6, 1e-6)}


def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(shape, generator=g).to(dtype)}


def reference(x):
    return x * 2.0


def flops(shape, dtype):
    return torch.Size(shape).numel()


def bytes_moved(shape, dtype):
    return 2 * torch.Size(shape).numel() * 4
''')
    git(kernel_repo, "add", "-A")
    git(kernel_repo, "commit", "-qm", "scale")
    assert main(["init", "kernels/scale/scale_triton.py", "--device", "cpu", "--archs", "none", "--json"]) == 0
    capsys.readouterr()
    target.write_text(LIBRARY_OP.replace("tl.load(dy_ptr + offs, mask=mask) * alpha",
                                         "tl.load(dy_ptr + offs, mask=mask) * alpha * 1.0"))
    assert main(["step", "-m", "touch the backward kernel only", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["decision"]["verdict"]) == ("revert", "unexercised")
    assert "_scale_backward_kernel" in out["decision"]["reason"]
    # the backward's launch in its host function, which the forward entry point never calls
    target.write_text(LIBRARY_OP.replace("_scale_backward_kernel[(triton.cdiv(n, 128),)](dy, dx, n, alpha, BLOCK=128)",
                                         "_scale_backward_kernel[(triton.cdiv(n, 128),)](dy, dx, n, alpha, BLOCK=128, "
                                         "num_stages=4)"))
    assert main(["step", "-m", "num_stages of the backward launch", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["decision"]["verdict"]) == ("revert", "unexercised") and "scale_backward" in out["decision"]["reason"]
