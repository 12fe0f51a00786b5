"""The `triton-whole-row` recipe (a row walked in chunk passes -> the whole row in one block).

Golden rewrites of the reference softmax, layernorm and rmsnorm (from their first versions and
from the autotuned versions a run keeps first), the repeated-value pass on its own, the patterns
it refuses and why, and its place in the priority order. Marked slow: the rewrites pass their
spec in the Triton interpreter through the worker, on both paths of the dispatch (the whole-row
twin, and the chunked kernel for rows past the limit), and compile for sm_90 and sm_100.
"""

from __future__ import annotations

import json
from pathlib import Path

import libcst as cst
import pytest

import playbook
from loop import backends
from loop.cli import main
from loop.measure.launch import run_worker
from loop.common.settings import Settings
from playbook import next_candidate
from playbook.analysis import BOTTLENECK_ORDER, TRITON_PRIORITY, analyze
from playbook.triton.whole_row import dedupe
from tests.conftest import materialise, section

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = REPO_ROOT / "kernels"
RID = "triton-whole-row"


def src(op: str) -> str:
    return (KERNELS / op / f"{op}_triton.py").read_text()


def cands(source: str, recipe_id: str = RID):
    return playbook.get(recipe_id).candidates(source, analyze(source))


def rewrite(source: str) -> str:
    (c,) = cands(source)
    return c.source


def reason(source: str) -> str:
    return playbook.get(RID).skip_reason(source, analyze(source))


def autotuned(op: str) -> str:
    """The kernel as a run keeps it first: the triton-autotune rewrite of its first version."""
    (c,) = playbook.get("triton-autotune").candidates(src(op), analyze(src(op)))
    return c.source


# --------------------------------------------------------------------------- golden rewrites

SOFTMAX_TWIN = '''\
# softmax_kernel with the whole row in one block (BLOCK >= the row width): the row is read once
@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (4, 8, 16, 32)], key=["n_cols"])
@triton.jit
def softmax_kernel_row(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    running_max = tl.full([BLOCK], float("-inf"), tl.float32)
    # BLOCK covers the whole row: each chunk loop of the kernel runs once, at column 0
    start = 0
    cols = start + tl.arange(0, BLOCK)
    x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    running_max = tl.maximum(running_max, x)
    row_max = tl.max(running_max, axis=0)
    partial = tl.zeros([BLOCK], tl.float32)
    partial += tl.exp(x - row_max)
    denom = tl.sum(partial, axis=0)
    y = tl.exp(x - row_max) / denom
    tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


'''

SOFTMAX_RUN = '''\
def run(x, out):
    rows, cols = x.shape
    row_block = triton.next_power_of_2(cols)
    if row_block <= MAX_ROW_BLOCK:  # the whole row in one block, read once
        softmax_kernel_row[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=row_block)
    else:  # wider rows: the chunked kernel
        softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
'''


def test_softmax_becomes_one_pass_with_the_chunked_kernel_kept_for_wide_rows():
    (c,) = cands(src("softmax"))
    assert (c.recipe, c.kind, c.key) == (RID, "whole-row", f"{RID}:softmax_kernel")
    # the second and third passes' `start = 0`, `cols = ...` and load of x
    assert "3 chunk pass(es) become one" in c.title and "6 repeated value(s) computed once" in c.title
    new = c.source
    assert section(new, "# softmax_kernel with the whole row", "def run(") == SOFTMAX_TWIN
    assert new[new.index("def run("):] == SOFTMAX_RUN
    assert "NUM_WARPS = 1\nMAX_ROW_BLOCK = 16384  # widest row the whole-row kernel holds in one block\n" in new
    # the chunked kernel is untouched, before the twin
    original = src("softmax")
    kernel = section(original, "@triton.jit", "def run(")
    assert kernel in new and new.index(kernel) < new.index("def softmax_kernel_row")


def test_layernorm_keeps_the_load_whose_mask_is_written_differently():
    new = rewrite(src("layernorm"))
    twin = section(new, "def layernorm_kernel_row", "def run(")
    # pass 1's load of x serves pass 2; pass 3 loads it under `mask`, an expression the pass does
    # not prove equal, so that load stays (the compiler may still merge it)
    assert twin.count("x = tl.load(x_row + cols") == 2
    assert twin.count("cols = start + tl.arange(0, BLOCK)") == 1 and twin.count("start = 0") == 1
    assert "    d = tl.where(cols < n_cols, x - mean, 0.0)\n    partial += d * d\n" in twin
    assert "for " not in twin
    assert ("        layernorm_kernel_row[(rows,)](x, weight, bias, out, cols, x.stride(0), out.stride(0), EPS, "
            "BLOCK=row_block)\n" in new)


def test_rmsnorm_twin_reads_the_row_for_its_sum_of_squares_and_again_under_its_mask():
    twin = section(rewrite(src("rmsnorm")), "def rmsnorm_kernel_row", "def run(")
    assert twin.count("tl.load(") == 3 and twin.count("start = 0") == 1
    assert "partial += x * x\n    mean_sq = tl.sum(partial, axis=0) / n_cols\n" in twin


@pytest.mark.parametrize("op", ["softmax", "layernorm", "rmsnorm"])
def test_on_the_autotuned_kernel_the_twin_drops_the_chunk_tuning_and_the_fallback_keeps_it(op):
    source = autotuned(op)
    new = rewrite(source)
    twin = section(new, f"# {op}_kernel with the whole row", "def run(")
    assert twin.count("@triton.autotune") == 1 and '"BLOCK"' not in twin  # warps only: the block is the row
    assert new.count("@triton.autotune") == 2  # the chunked kernel keeps its space
    fallback = section(new, "    else:  # wider rows", "    return out")
    assert f"{op}_kernel[(rows,)](" in fallback and "BLOCK=" not in fallback  # the launch as the autotuner wants it


def test_after_the_rewrite_the_recipe_proposes_nothing_and_autotune_still_tunes_the_chunked_kernel():
    new = rewrite(src("softmax"))
    assert cands(new) == []
    assert reason(new) == ("softmax_kernel already has a whole-row twin; "
                           "softmax_kernel_row is the whole-row twin of softmax_kernel")
    tuned = cands(new, "triton-autotune")
    assert [c.key for c in tuned] == ["triton-autotune:softmax_kernel"]  # the twin is autotuned already


def test_in_place_kernel_gets_the_rule_of_thumb_warps_not_an_autotuner():
    source = src("softmax").replace("out_row = out_ptr + row * stride_out", "out_row = x_ptr + row * stride_out")
    new = rewrite(source)
    assert "@triton.autotune" not in new
    assert ("        row_warps = min(16, max(4, row_block // 512))  # 16 columns per thread (not tuned: the kernel "
            "writes what it reads)\n"
            "        softmax_kernel_row[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=row_block, "
            "num_warps=row_warps)\n") in new


def test_names_the_wrapper_uses_are_not_reused():
    source = src("softmax").replace("    rows, cols = x.shape\n", "    rows, cols = x.shape\n    row_block = 7\n")
    new = rewrite(source)
    assert "    row_block_ = triton.next_power_of_2(cols)\n    if row_block_ <= MAX_ROW_BLOCK:" in new


# --------------------------------------------------------------------------- the repeated-value pass


def stmts(body: str) -> list[cst.BaseStatement]:
    return list(cst.parse_module(body).body)


def code(statements) -> str:
    return cst.Module(list(statements)).code


def test_dedupe_drops_a_recomputed_value_and_keeps_what_may_differ():
    body = ("cols = s + tl.arange(0, B)\n"
            "x = tl.load(p + cols, other=float('-inf'))\n"
            "m = tl.max(x, axis=0)\n"
            "x = tl.load(p + cols, other=float('-inf'))\n"  # same value: dropped
            "tl.store(q + cols, x)\n"
            "x = tl.load(p + cols, other=float('-inf'))\n"  # a store came between: kept
            "s = s + 1\n"
            "cols = s + tl.arange(0, B)\n"  # s changed: kept
            "y = helper(x)\n"
            "y = helper(x)\n"  # a helper may store: kept
            "z = tl.rand(seed, cols)\n"
            "z = tl.rand(seed, cols)\n"  # kept (not pure)
            "acc = acc + x\n"
            "acc = acc + x\n")  # reads what it assigns: kept
    out, dropped = dedupe(stmts(body), "tl")
    assert dropped == 1
    assert code(out) == body.replace("x = tl.load(p + cols, other=float('-inf'))\n", "", 2).replace(
        "m = tl.max(x, axis=0)\n", "x = tl.load(p + cols, other=float('-inf'))\nm = tl.max(x, axis=0)\n", 1)


def test_dedupe_forgets_everything_at_a_compound_statement():
    body = "c = tl.arange(0, B)\nif flag:\n    c = c + 1\nc = tl.arange(0, B)\n"
    out, dropped = dedupe(stmts(body), "tl")
    assert dropped == 0 and code(out) == body


# --------------------------------------------------------------------------- what it refuses


@pytest.mark.parametrize("op,why", [
    ("row_sum", "row_sum_kernel walks its row in one pass: it reads each value once already"),
    ("silu_mul", "silu_mul_kernel walks its row in one pass"),
    ("vector_add", "add_kernel has no loop over its row"),
])
def test_reference_kernels_it_leaves_alone_say_why(op, why):
    assert cands(src(op)) == []
    assert why in reason(src(op))


@pytest.mark.parametrize("op", ["matmul", "attention"])
def test_dot_kernels_are_not_its_class(op):
    assert cands(src(op)) == []
    assert "a dot kernel's loop walks a reduction dimension" in reason(src(op))


SOFTMAX = src("softmax")


@pytest.mark.parametrize("edit,why", [
    (("        running_max = tl.maximum(running_max, x)\n",
      "        running_max = tl.maximum(running_max, x)\n        if start > 4096:\n            break\n"),
     "a row loop with else, break or continue"),
    (("    denom = tl.sum(partial, axis=0)\n",
      "    denom = tl.sum(partial, axis=0)\n    for i in range(3):\n        denom += 0.0\n"),
     "a loop that is not `for v in range(0, n, BLOCK)`"),
    (("    denom = tl.sum(partial, axis=0)\n    for start in range(0, n_cols, BLOCK):",
      "    denom = tl.sum(partial, axis=0)\n    for start in range(0, stride_x, BLOCK):"),
     "its loops walk different extents (n_cols, BLOCK and stride_x, BLOCK)"),
    (("mask=cols < n_cols)\n\n\ndef run", ")\n\n\ndef run"), "an unmasked tl.store in a row loop"),
    (("        partial += tl.exp(x - row_max)\n", "        partial += tl.exp(x - row_max)\n        start += 1\n"),
     "the loop variable start is assigned in the loop"),
    (("x, out, cols, x.stride(0), out.stride(0), BLOCK=BLOCK", "x, out, 4096, x.stride(0), out.stride(0), BLOCK=BLOCK"),
     "the argument for n_cols (`4096`) is not a tensor size in run"),
    (("    softmax_kernel[(rows,)](x, out, cols", "    y = softmax_kernel[(rows,)](x, out, cols"),
     "the launch of softmax_kernel is not a statement of its own"),
    (("softmax_kernel[(rows,)]", "softmax_kernel[lambda meta: (rows,)]"),
     "the grid of softmax_kernel is a function of the meta-parameters"),
    (("softmax_kernel[(rows,)]", "softmax_kernel[(rows * BLOCK,)]"), "the grid of softmax_kernel reads the chunk BLOCK"),
    (("out.stride(0), BLOCK=BLOCK, num_warps", "out.stride(0), BLOCK, num_warps"), "passes BLOCK by position"),
])
def test_patterns_it_refuses_say_why(edit, why):
    old, new = edit
    assert old in SOFTMAX
    source = SOFTMAX.replace(old, new, 1)
    compile(source, "softmax_triton.py", "exec")
    assert cands(source) == []
    assert why in reason(source)


# --------------------------------------------------------------------------- priority


def test_it_follows_the_autotune_space_on_norm_like_kernels_and_leads_when_a_profile_says_why():
    for cls in ("element-wise", "norm-like", "reduction"):
        order = TRITON_PRIORITY[cls]
        assert order.index("autotune") < order.index("tileir-configs") < order.index("whole-row") < order.index("block")
    assert "whole-row" not in TRITON_PRIORITY["dot"]
    assert BOTTLENECK_ORDER["compute-bound"][0][:2] == ("autotune", "whole-row")
    assert BOTTLENECK_ORDER["memory-bound"][0][0] == "whole-row"
    for op in ("softmax", "layernorm", "rmsnorm"):
        source, an = src(op), analyze(src(op))
        first = next_candidate(source, an, [], [])
        assert first.key == f"triton-autotune:{op}_kernel"
        tuned = autotuned(op)
        assert next_candidate(tuned, analyze(tuned), [first.key], []).key == f"{RID}:{op}_kernel"


def test_after_it_the_persistent_grid_goes_to_the_twin_first_and_the_chunked_kernel_waits():
    """The H200 runs spent a move each on the persistent chunked kernel, which no benchmark row
    reached: now it is a second thought (tier 1), after every first-line move."""
    new = rewrite(autotuned("softmax"))
    persistent = {c.key: c for c in cands(new, "triton-persistent")}
    assert persistent["triton-persistent:softmax_kernel_row"].tier == 0
    chunked = persistent["triton-persistent:softmax_kernel"]
    assert chunked.tier == 1 and "(the chunked kernel, for rows past the limit of softmax_kernel_row)" in chunked.title
    tried = ["triton-autotune:softmax_kernel", f"{RID}:softmax_kernel"]
    order = []
    while (c := next_candidate(new, analyze(new), tried, [])) is not None:
        tried.append(c.key)
        order.append(c.key)
    assert order.index("triton-persistent:softmax_kernel_row") < order.index("fast-math:exp2") \
        < order.index("triton-persistent:softmax_kernel")


# --------------------------------------------------------------------------- the rewrites still compute the op


def check_in_interpreter(tmp_path: Path, op: str, source: str) -> list[dict]:
    target = materialise(tmp_path / "k", op, "triton", source)
    job = {"spec": str(target.parent / "spec.py"), "target_dir": str(target.parent), "device": "cpu",
           "backend": "interpreter", "impls": [{"label": "candidate", "path": str(target)}], "check": ["candidate"],
           "seed": 23, "bench": False}
    res = run_worker(tmp_path / "w", job, backends.get("interpreter"), Settings(worker_timeout_s=600),
                     tmp_path / "cache")
    assert res["status"] == "ok", (res.get("message"), res.get("log_tail", "")[-1500:])
    checks = res["correctness"]["checks"]
    assert checks and all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    assert res["proof"]["ran"] == "interpreter"
    return checks


@pytest.mark.slow
@pytest.mark.parametrize("op", ["softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("limit", [16384, 256], ids=["twin", "both-paths"])
def test_rewrite_passes_its_spec_in_the_interpreter(op, limit, tmp_path, env):
    """limit 16384: every correctness shape takes the twin; 256: (1, 1) and (5, 17) take the twin,
    the 1000- and 2053-column rows the chunked kernel."""
    new = rewrite(src(op)).replace("MAX_ROW_BLOCK = 16384", f"MAX_ROW_BLOCK = {limit}")
    check_in_interpreter(tmp_path, op, new)


@pytest.mark.slow
def test_rewrite_of_the_autotuned_softmax_passes_its_spec_in_the_interpreter(tmp_path, env):
    check_in_interpreter(tmp_path, "softmax", rewrite(autotuned("softmax")))


@pytest.mark.slow
@pytest.mark.parametrize("op", ["softmax", "layernorm"])
def test_rewrite_compiles_ahead_of_time_for_hopper_and_blackwell(op, tmp_path, env, capsys):
    target = materialise(tmp_path, op, "triton", rewrite(src(op)))
    rc = main(["compile", str(target), "--arch", "sm_90,sm_100", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"], [k.get("error") for k in out["kernels"] if not k.get("ok")]
    assert {r["arch"] for r in out["kernels"]} == {"sm_90", "sm_100"}
