"""The playbook on code this project did not write: Liger-Kernel 0.8.5's Triton rms_norm,
layer_norm, softmax and swiglu ops, unmodified, installed from PyPI for the session.

Each op computes its launch settings in a helper (`BLOCK_SIZE, num_warps = calculate_settings(n)`),
launches its kernels from host functions that a `torch.autograd.Function` calls, and has backward
kernels that no forward call runs. What must hold: the analysis finds the forward kernels and the
op's class; at least three recipes propose a candidate for each op; every candidate parses and
leaves the backward code byte for byte as it was; `tileloop playbook plan` lists every Triton
recipe, applicable or with a one-line reason; an entry point named by a spec narrows the forward
path.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest

import playbook
from loop.cli import main
from playbook.analysis import analyze
from playbook.base import attempt
from playbook.cst.entry import entry_beside
from tests.foreign import user_repo

OPS = ("rms_norm", "layer_norm", "softmax", "swiglu")
# read from Liger's source: the kernels each op's forward wrappers launch (backward ones excluded)
FORWARD = {
    "rms_norm": {"_rms_norm_forward_kernel", "_block_rms_norm_forward_kernel"},
    "layer_norm": {"_layer_norm_forward_kernel"},
    "softmax": {"_softmax_single_block_forward_kernel", "_softmax_multi_block_forward_kernel"},
    "swiglu": {"_swiglu_forward_kernel", "_swiglu_forward_kernel_tiled", "_swiglu_fused_gate_up_forward_kernel"},
}
CLASS = {"rms_norm": "norm-like", "layer_norm": "norm-like", "softmax": "norm-like", "swiglu": "element-wise"}
# recipes that must apply to each op (more may)
EXPECTED = {
    "rms_norm": {"eviction-policy", "triton-autotune", "launch-param", "triton-persistent"},
    "layer_norm": {"eviction-policy", "triton-autotune", "launch-param", "triton-persistent"},
    "softmax": {"triton-autotune", "launch-param", "fast-math", "triton-whole-row", "triton-persistent"},
    "swiglu": {"eviction-policy", "triton-autotune", "launch-param", "triton-persistent"},
}


def liger_source(liger_kernel: Path, op: str) -> str:
    return (liger_kernel / "ops" / f"{op}.py").read_text()


def triton_recipes():
    return [r for r in playbook.recipes() if "triton" in r.languages]


@functools.cache
def _candidates(source: str) -> dict[str, tuple]:
    """Each Triton recipe's candidates for `source` (read once per module for the whole file)."""
    an = analyze(source)
    return {r.id: tuple(attempt(r, source, an)[0]) if r.applies(an) else () for r in triton_recipes()}


def definitions(source: str) -> dict[str, str]:
    """The code of every module-level function and of every method (`Cls.name`), by name."""
    tree = ast.parse(source)
    out = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef):
            out[stmt.name] = ast.get_source_segment(source, stmt)
        elif isinstance(stmt, ast.ClassDef):
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef):
                    out[f"{stmt.name}.{item.name}"] = ast.get_source_segment(source, item)
    return out


@pytest.mark.parametrize("op", OPS)
def test_the_analysis_finds_the_forward_kernels_and_the_class(liger_kernel, op):
    an = analyze(liger_source(liger_kernel, op))
    assert an.forward == FORWARD[op]
    assert an.kernel_class == CLASS[op]
    assert all(name.endswith(".forward") for name in an.entry), an.entry  # the autograd Functions' forward


@pytest.mark.parametrize("op", OPS)
def test_three_or_more_recipes_apply_and_change_only_forward_code(liger_kernel, op):
    source = liger_source(liger_kernel, op)
    found = _candidates(source)
    applying = {rid for rid, cands in found.items() if cands}
    assert len(applying) >= 3 and EXPECTED[op] <= applying, sorted(applying)
    before = definitions(source)
    backward = {name for name in before if "backward" in name}  # Liger names every backward function so
    assert backward
    for rid, cands in found.items():
        for c in cands:
            compile(c.source, f"{op}.py", "exec")  # it still parses
            assert c.source != source and c.recipe == rid
            after = definitions(c.source)
            changed = sorted(name for name in backward if after.get(name) != before[name])
            assert not changed, f"{c.key} changes backward code: {changed}"
            # the kernels it changes are forward kernels (new ones, twins and helpers, are new names)
            kernels_changed = {name for name in before if name.startswith("_") and name.endswith(
                ("_kernel", "_kernel_tiled")) and after.get(name) != before[name]}
            assert kernels_changed <= FORWARD[op], (c.key, kernels_changed)


# the plan of two ops in the fast tier, all four in the slow one (each plan reads every recipe again)
PLAN_OPS = [pytest.param(op, marks=() if op in ("softmax", "swiglu") else pytest.mark.slow) for op in OPS]


@pytest.mark.parametrize("op", PLAN_OPS)
def test_plan_lists_every_triton_recipe_applicable_or_with_a_one_line_reason(liger_kernel, op, capsys):
    path = liger_kernel / "ops" / f"{op}.py"
    assert main(["playbook", "plan", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ids = [r.id for r in triton_recipes()]
    listed = [a["id"] for a in out["applicable"]] + [n["id"] for n in out["not_applicable"]]
    assert sorted(listed) == sorted(ids) and len(listed) == len(set(listed))
    assert out["kernel_class"] == CLASS[op] and set(out["forward_kernels"]) == FORWARD[op]
    found = _candidates(path.read_text())
    for a in out["applicable"]:
        first = found[a["id"]][0]
        assert (a["candidates"], a["optimization"], a["hypothesis"]) == (len(found[a["id"]]), first.title,
                                                                          first.hypothesis)
    assert len(out["applicable"]) >= 3
    for n in out["not_applicable"]:
        assert n["reason"].strip() and "\n" not in n["reason"], n
        assert not found[n["id"]]


def test_recipes_say_they_leave_backward_kernels_alone(liger_kernel):
    source = liger_source(liger_kernel, "layer_norm")
    an = analyze(source)
    why = playbook.get("triton-whole-row").skip_reason(source, an)
    assert ("_layer_norm_backward_kernel is not on the forward path of LigerLayerNormFunction.forward (launched only "
            "by a backward pass, or not at all): left alone") in why
    # before, launch-param stepped num_stages of this backward kernel and gave no reason on the forward one
    steps = [c for c in _candidates(source)["launch-param"]]
    assert steps and all("_layer_norm_backward_kernel" not in c.title for c in steps)


def test_computed_launch_settings_are_tuned_and_scaled_not_refused(liger_kernel):
    source = liger_source(liger_kernel, "rms_norm")
    found = _candidates(source)
    tuned = {c.key: c for c in found["triton-autotune"]}["triton-autotune:_rms_norm_forward_kernel"]
    assert "num_warps=num_warps" not in tuned.source.split("def rms_norm_forward")[1].split("_block_rms_norm")[0]
    assert "calculate_settings(n_cols)" in tuned.hypothesis and "BLOCK_SIZE stays" in tuned.hypothesis
    keys = {c.key: c for c in found["launch-param"]}
    up = keys["launch-param:_rms_norm_forward_kernel:num_warps=x2"]
    assert "num_warps=min(num_warps * 2, 32)," in up.source and up.tier == 0
    down = keys["launch-param:_rms_norm_forward_kernel:num_warps=x1/2"]
    assert "num_warps=max(num_warps // 2, 1)," in down.source and down.tier == 1 and "fewer threads" in down.hypothesis
    # the rows per program of the block kernel: a literal the wrapper assigns once, passed through **kernel_args
    assert "            BLOCK_ROW = 32\n" in keys["launch-param:BLOCK_ROW=32"].source
    # from the scaled launch the next step is x4, never x2 again
    again = {c.key for c in playbook.get("launch-param").candidates(up.source, analyze(up.source))}
    assert "launch-param:_rms_norm_forward_kernel:num_warps=x4" in again
    assert "launch-param:_rms_norm_forward_kernel:num_warps=x2" not in again
    assert "launch-param:_rms_norm_forward_kernel:num_warps=x2" in playbook.get("launch-param").current_keys(up.source)


@pytest.mark.slow
def test_a_spec_entry_point_narrows_the_forward_path(liger_kernel, tmp_path, capsys):
    source = liger_source(liger_kernel, "swiglu")
    spec = ("import torch\n\n\ndef entry(target, a, b):\n    return target.LigerSiLUMulFunction.apply(a, b)\n")
    repo = user_repo(tmp_path / "user", {"ops/swiglu.py": source, "ops/spec.py": spec})
    target = repo / "ops" / "swiglu.py"
    entry = entry_beside(target)
    assert entry == ("LigerSiLUMulFunction",)
    an = analyze(source, entry=entry)
    assert an.entry == ("LigerSiLUMulFunction.forward",)
    assert an.forward == {"_swiglu_forward_kernel", "_swiglu_forward_kernel_tiled"}
    fused = definitions(source)["_swiglu_fused_gate_up_forward_kernel"]
    for rid in ("triton-autotune", "launch-param", "eviction-policy"):
        cands = playbook.get(rid).candidates(source, an)
        assert cands, rid
        for c in cands:
            assert definitions(c.source)["_swiglu_fused_gate_up_forward_kernel"] == fused, c.key
            assert "_swiglu_fused_gate_up_forward_kernel" not in c.title, c.key
    assert main(["playbook", "plan", str(target), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["entry"] == ["LigerSiLUMulFunction.forward"]
    assert set(out["forward_kernels"]) == {"_swiglu_forward_kernel", "_swiglu_forward_kernel_tiled"}
    # ENTRY naming a host function of the module
    (repo / "ops" / "spec.py").write_text('ENTRY = "swiglu_fused_gate_up_forward"\n')
    an = analyze(source, entry=entry_beside(target))
    assert an.entry == ("swiglu_fused_gate_up_forward",) and an.forward == {"_swiglu_fused_gate_up_forward_kernel"}
