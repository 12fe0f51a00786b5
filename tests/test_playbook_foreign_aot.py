"""Candidates for Liger-Kernel's Triton ops compile ahead of time for sm_90 (slow tier, no GPU).

For each op, a user's repository holds Liger's unmodified module and a spec written here (an
`entry(target, ...)` adapter that calls the op's autograd Function, as a user of the library
would); for every recipe that applies, one of its candidates replaces the module and
`tileloop compile --arch sm_90` builds every kernel the forward call launches, autotune configs
included. The worker imports `liger_kernel`: the install folder goes on PYTHONPATH.
"""

from __future__ import annotations

import json
import os

import pytest

import playbook
from loop.cli import main
from playbook.analysis import analyze
from playbook.base import attempt
from playbook.cst.entry import spec_entry
from tests.foreign import user_repo

COMMON = '''
import torch

CORRECTNESS_SHAPES = [{shape}]
BENCHMARK_SHAPES = [{shape}]
DTYPES = ["float32"]
TOLERANCES = {{"float32": (1e-4, 1e-4)}}
OUTPUTS = ()


def flops(shape):
    return 4 * shape[0] * shape[1]


def bytes_moved(shape, dtype):
    return 3 * shape[0] * shape[1] * 4
'''

# make_inputs, reference and the adapter of each op; each adapter launches every forward kernel
# a run can reach on the CPU (rms_norm's block kernel takes 32768 rows or more)
SPECS = {
    "rms_norm": ("(4, 64)", '''
def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(shape, generator=g, dtype=dtype), "w": torch.randn(shape[1], generator=g, dtype=dtype)}


def reference(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def entry(target, x, w):
    target.LigerRMSNormFunction.apply(x.repeat(8192, 1), w, 1e-6, 0.0, "llama", True, False)  # the block kernel
    return target.LigerRMSNormFunction.apply(x, w, 1e-6)
'''),
    "layer_norm": ("(4, 64)", '''
def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(shape, generator=g, dtype=dtype), "w": torch.randn(shape[1], generator=g, dtype=dtype),
            "b": torch.randn(shape[1], generator=g, dtype=dtype)}


def reference(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-6)


def entry(target, x, w, b):
    return target.LigerLayerNormFunction.apply(x, w, b, 1e-6)
'''),
    "softmax": ("(4, 96)", '''
def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(shape, generator=g, dtype=dtype)}


def reference(x):
    return torch.softmax(x, dim=-1)


def entry(target, x):
    return target.LigerSoftmaxFunction.apply(x)
'''),
    "swiglu": ("(4, 64)", '''
def make_inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(shape, generator=g, dtype=dtype), "b": torch.randn(shape, generator=g, dtype=dtype)}


def reference(a, b):
    return torch.nn.functional.silu(a) * b


def entry(target, a, b):
    target.LigerFusedGateUpSiLUMulFunction.apply(torch.cat([a, b], dim=-1))
    return target.LigerSiLUMulFunction.apply(a, b)
'''),
}
# forward kernels no run of the spec reaches: swiglu's column-tiled kernel is for Blackwell only;
# softmax's multi-block kernel runs only when n_cols > next_power_of_2(n_cols), never (and Liger's
# own version of it does not compile with Triton 3.6: `tl.float32(-float("inf"))` calls a dtype),
# so the recipe that rewrites only it (triton-whole-row) has no candidate to build here
UNREACHED = {"swiglu": ("_swiglu_forward_kernel_tiled",), "softmax": ("_softmax_multi_block_forward_kernel",)}
NOT_BUILT = {"softmax": {"triton-whole-row"}}


def chosen(source: str, entry: tuple[str, ...], op: str) -> tuple[dict, set[str]]:
    """For each recipe that applies: its first candidate that changes a kernel a run of the spec
    launches; and the applying recipes none of whose candidates does."""
    an = analyze(source, entry=entry)
    out, without = {}, set()
    for recipe in playbook.recipes():
        if "triton" not in recipe.languages or not recipe.applies(an):
            continue
        cands = attempt(recipe, source, an)[0]
        usable = [c for c in cands if not any(c.key.endswith(f":{k}") or c.title.startswith(f"{k}:")
                                              for k in UNREACHED.get(op, ()))]
        if usable:
            out[recipe.id] = usable[0]
        elif cands:
            without.add(recipe.id)
    return out, without


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(SPECS))
def test_a_candidate_of_every_applying_recipe_compiles_for_sm_90(op, liger_kernel, tmp_path, env, capsys):
    shape, body = SPECS[op]
    spec = COMMON.format(shape=shape) + body
    source = (liger_kernel / "ops" / f"{op}.py").read_text()
    repo = user_repo(tmp_path / "user", {f"ops/{op}.py": source, "ops/spec.py": spec})
    env.setenv("PYTHONPATH", str(liger_kernel.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.chdir(repo)
    target = repo / "ops" / f"{op}.py"
    found, without = chosen(source, spec_entry(spec), op)
    assert len(found) >= 3 and without == NOT_BUILT.get(op, set()), (sorted(found), without)
    failures = {}
    for rid, cand in found.items():
        target.write_text(cand.source)
        rc = main(["compile", str(target), "--arch", "sm_90", "--json"])
        out = json.loads(capsys.readouterr().out)
        if rc != 0 or not out["ok"]:
            failures[cand.key] = out.get("message") or [k.get("error") for k in out["kernels"] if not k.get("ok")]
            continue
        built = {k["kernel"] for k in out["kernels"]}
        assert built and all(k["ok"] for k in out["kernels"]), (cand.key, out["kernels"])
        if rid == "triton-whole-row":
            assert any(name.endswith("_row") for name in built), (cand.key, built)  # the twin itself was built
    assert not failures, failures
