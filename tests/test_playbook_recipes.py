"""Golden tests for the playbook's rewrite recipes: for each recipe, reference kernels -> the exact
rewrite (whole file or the exact changed lines), and kernels where it does not apply -> [] with
no error. Also the registry, the pages, the priority order and next_candidate over all recipes."""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path

import pytest

import playbook
from playbook import next_candidate
from playbook.analysis import CUTILE_PRIORITY, PRIORITY, TRITON_PRIORITY, analyze
from playbook.base import page_path

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = REPO_ROOT / "kernels"
NEW_RECIPES = ("triton-autotune", "fast-math", "eviction-policy", "grouped-ordering", "cutile-latency",
               "cutile-store-no-tma", "cutile-approx", "cutile-num-ctas")
ALL_TARGETS = sorted(p for p in KERNELS.glob("*/*_*.py") if p.name != "spec.py")


def src(op: str, lang: str) -> str:
    return (KERNELS / op / f"{op}_{lang}.py").read_text()


def cands(recipe_id: str, source: str):
    recipe = playbook.get(recipe_id)
    an = analyze(source)
    if an.language not in recipe.languages or not recipe.applies(an):
        return []
    return recipe.candidates(source, an)


def one(recipe_id: str, source: str, kind: str | None = None):
    """The single first-line (tier 0) candidate of a kind; step-downs (tier 1) are tested on their own."""
    found = [c for c in cands(recipe_id, source) if (kind is None or c.kind == kind) and c.tier == 0]
    assert len(found) == 1, [c.key for c in found]
    return found[0]


def changes(a: str, b: str) -> tuple[list[str], list[str]]:
    """(removed lines, added lines) of a unified diff without context."""
    removed, added = [], []
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        (removed if line.startswith("-") else added).append(line[1:])
    return removed, added


# --------------------------------------------------------------------------- registry and pages


def test_every_recipe_is_registered_with_id_title_languages_and_a_page():
    ids = [r.id for r in playbook.recipes()]
    assert len(ids) == len(set(ids))
    assert set(NEW_RECIPES) <= set(ids)
    for r in playbook.recipes():
        assert r.title and isinstance(r.title, str)
        assert r.languages and set(r.languages) <= {"triton", "cutile", "tilelang", "cuda"}
        page = page_path(r)
        assert page.is_file(), f"no page for {r.id}"
        text = page.read_text()
        assert text.startswith(f"# {r.id}\n")
        for section in ("## What it changes", "## When", "## Expected effect", "## Hazards", "## Before / after"):
            assert section in text, (r.id, section)


@pytest.mark.parametrize("target", ALL_TARGETS, ids=lambda p: p.name)
def test_every_candidate_on_the_suite_parses_compiles_and_is_well_formed(target):
    source = target.read_text()
    an = analyze(source)
    keys = set()
    for recipe in playbook.recipes():
        if an.language not in recipe.languages or not recipe.applies(an):
            assert recipe.candidates(source, an) == [] or an.language in recipe.languages
            continue
        for c in recipe.candidates(source, an):
            compile(c.source, str(target), "exec")  # valid Python
            assert c.source != source
            assert c.recipe == recipe.id and c.key.startswith(recipe.id + ":") and c.key not in keys
            assert c.title and c.hypothesis and "\n" not in c.hypothesis and "\n" not in c.title
            assert analyze(c.source).language == an.language
            keys.add(c.key)


def test_recipes_answer_empty_on_sources_they_do_not_understand():
    odd = ["x = 1\n", "import triton\n\ndef run():\n    pass\n",
           "import cuda.tile as ct\n\n@ct.kernel\ndef k(x):\n    pass\n",
           "import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x_ptr):\n    pass\n"]
    for source in odd:
        an = analyze(source)
        for rid in NEW_RECIPES:
            assert playbook.get(rid).candidates(source, an) == [], (rid, source)


def test_skip_reason_says_why():
    reason = playbook.get("grouped-ordering").skip_reason(src("attention", "triton"), analyze(src("attention", "triton")))
    assert "pid_bh does not index a tile" in reason
    reason = playbook.get("eviction-policy").skip_reason(src("softmax", "triton"), analyze(src("softmax", "triton")))
    assert reason == "no streaming tl.load without an eviction policy"


# --------------------------------------------------------------------------- triton-autotune

VECTOR_ADD_AUTOTUNED = '''\
"""vector_add, first version: one small block per program, one warp, no autotune."""

import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": block}, num_warps=warps)
        for block in (128, 256, 512, 1024)
        for warps in (1, 4, 8)
    ],
    key=["n"],
)
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def run(x, y, out):
    n = out.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out
'''


def test_autotune_vector_add_exact():
    c = one("triton-autotune", src("vector_add", "triton"))
    assert c.source == VECTOR_ADD_AUTOTUNED
    assert (c.kind, c.key) == ("autotune", "triton-autotune:add_kernel")
    assert c.title == "add_kernel: @triton.autotune over BLOCK x num_warps (12 configs, key n)"


def test_autotune_softmax_keeps_the_row_grid_and_widens_the_chunk_space_of_its_row_loops():
    source = src("softmax", "triton")
    c = one("triton-autotune", source)
    removed, added = changes(source, c.source)
    assert removed == ["BLOCK = 128", "NUM_WARPS = 1", "",
                       "    softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS)"]
    # a row walked in chunks: chunk x1 ... x32 and up to 16 warps, the pipelining depth left as it was
    assert added == ["@triton.autotune(", "    configs=[",
                     '        triton.Config({"BLOCK": block}, num_warps=warps)',
                     "        for block in (128, 256, 512, 1024, 2048, 4096)", "        for warps in (1, 4, 8, 16)",
                     "    ],", '    key=["n_cols"],', ")",
                     "    softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0))"]
    assert "24 configs" in c.title


def test_autotune_matmul_grid_becomes_a_function_of_meta():
    source = src("matmul", "triton")
    c = one("triton-autotune", source)
    removed, added = changes(source, c.source)
    assert "    grid = lambda meta: (triton.cdiv(M, meta[\"BLOCK_M\"]), triton.cdiv(N, meta[\"BLOCK_N\"]))" in added
    assert ('        triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}, '
            'num_warps=warps, num_stages=stages)') in added
    assert ("        for block_m, block_n, block_k in ((64, 64, 32), (128, 64, 32), (64, 128, 32), (128, 128, 32), "
            "(128, 256, 64), (256, 128, 64))") in added  # doubled tiles, then the large GEMM tiles
    assert "        for warps in (4, 8)" in added and "        for stages in (2, 3)" in added
    assert '    key=["M", "N", "K"],' in added
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "NUM_WARPS", "NUM_STAGES"):
        assert f"{name} = " not in c.source
    assert "                        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))" in added


def test_autotune_attention_keys_on_sizes_and_the_causal_flag_and_keeps_untuned_constexprs():
    c = one("triton-autotune", src("attention", "triton"))
    # not qk_scale (float), not strides; CAUSAL, passed as bool(causal), is in the key: Triton's
    # autotuner caches a pick by the key alone, so without it the causal calls would reuse the
    # config tuned on a non-causal call (seen on an H200: 4 shapes, 2 picks)
    assert '    key=["seq", "heads", "HEAD_DIM", "CAUSAL"],' in c.source
    assert "HEAD_DIM=head_dim, CAUSAL=bool(causal))" in c.source
    assert '    grid = lambda meta: (triton.cdiv(seq, meta["BLOCK_M"]), batch * heads)' in c.source


def test_autotune_leaves_a_constexpr_passed_as_a_literal_out_of_the_key():
    source = src("attention", "triton").replace("CAUSAL=bool(causal)", "CAUSAL=True")
    c = one("triton-autotune", source)
    assert '    key=["seq", "heads", "HEAD_DIM"],' in c.source


def test_tileir_configs_key_on_the_causal_flag_too():
    source = src("attention", "triton")
    found = playbook.get("triton-tileir-configs").candidates(source, analyze(source, backend="tileir", arch="sm_100"))
    c = found[0]
    assert '    key=["seq", "heads", "HEAD_DIM", "CAUSAL"],' in c.source


@pytest.mark.parametrize("op", ["vector_add", "softmax", "layernorm", "rmsnorm", "row_sum", "silu_mul", "matmul",
                                "attention"])
def test_autotune_space_is_modest_and_contains_the_current_config(op):
    from playbook.triton.autotune_space import block_space, option_space

    c = one("triton-autotune", src(op, "triton"))
    n = int(c.title.split("(")[1].split(" configs")[0])
    assert 1 < n <= 24
    assert block_space([128])[0] == (128,) and block_space([64, 64, 32])[0] == (64, 64, 32)
    warps, stages = option_space(1, None, loop=True, dot=False, n_blocks=4)
    assert 1 in warps and 3 in stages  # the current config (1 warp, default 3 stages) is in the space
    assert block_space([128], wide=True) == [(128,), (256,), (512,), (1024,), (2048,), (4096,)]
    assert block_space([8192], wide=True) == [(512,), (1024,), (2048,), (4096,), (8192,), (16384,)]
    assert option_space(1, None, loop=True, dot=False, n_blocks=6, wide=True) == ([1, 4, 8, 16], [])
    assert option_space(4, 2, loop=True, dot=False, n_blocks=6, wide=True) == ([4, 8, 16], [2])


WITH_LITERALS = '''\
import triton
import triton.language as tl

BLOCK = 256


@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def run(x, out):
    n = out.numel()
    {body}
    return out
'''


@pytest.mark.parametrize("body,why", [
    ("k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, num_warps=4)\n    print(BLOCK)", "BLOCK is read outside"),
    ("nb = triton.cdiv(n, BLOCK)\n    k[(nb,)](x, out, n, BLOCK=BLOCK)", "BLOCK is read outside"),
    ("k[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)", "may depend on the literal"),
    ("k[(1,)](x, out, n, BLOCK=BLOCK)\n    k[(1,)](x, out, n, BLOCK=BLOCK)", "launched 2 times"),
    ("k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, num_warps=w)", "num_warps is neither"),
    ("k[(triton.cdiv(n, BLOCK),)](x, out, 1024, BLOCK=BLOCK)", "no runtime size argument"),
    ("k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, num_ctas=2)", "num_ctas"),
])
def test_autotune_skips_what_it_cannot_rewrite_safely(body, why):
    source = WITH_LITERALS.replace("{body}", body)
    recipe = playbook.get("triton-autotune")
    assert recipe.candidates(source, analyze(source)) == []
    assert why in recipe.skip_reason(source, analyze(source))


def test_autotune_skips_in_place_kernels_and_autotuned_ones():
    in_place = WITH_LITERALS.replace("tl.store(out_ptr + offs,", "tl.store(x_ptr + offs,").replace(
        "{body}", "k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)")
    assert cands("triton-autotune", in_place) == []
    assert "loads and stores the same buffer" in playbook.get("triton-autotune").skip_reason(in_place, analyze(in_place))
    assert cands("triton-autotune", VECTOR_ADD_AUTOTUNED) == []


def test_autotune_literal_block_with_independent_grid_is_tuned():
    source = WITH_LITERALS.replace("{body}", "k[(n,)](x, out, n, BLOCK=256)")
    c = one("triton-autotune", source)
    assert "    k[(n,)](x, out, n)" in c.source
    assert "BLOCK = 256" in c.source  # not read by the launch (a literal is): not the recipe's to delete
    assert "for block in (256, 512, 1024, 2048)" in c.source


# --------------------------------------------------------------------------- fast-math


def test_fast_math_sigmoid_on_silu_mul():
    source = src("silu_mul", "triton")
    c = one("fast-math", source, "sigmoid")
    assert changes(source, c.source) == (["        y = gate / (1.0 + tl.exp(-gate)) * up"],
                                         ["        y = gate * tl.sigmoid(gate) * up"])
    assert (c.key, c.kind) == ("fast-math:sigmoid", "sigmoid")


def test_fast_math_exp2_on_silu_mul_and_softmax():
    source = src("silu_mul", "triton")
    c = one("fast-math", source, "exp2")
    assert changes(source, c.source)[1] == ["        y = gate / (1.0 + tl.exp2(-gate * 1.4426950408889634)) * up"]
    source = src("softmax", "triton")
    c = one("fast-math", source)  # softmax has no sigmoid
    assert changes(source, c.source) == (
        ["        partial += tl.exp(x - row_max)", "        y = tl.exp(x - row_max) / denom"],
        ["        partial += tl.exp2((x - row_max) * 1.4426950408889634)",
         "        y = tl.exp2((x - row_max) * 1.4426950408889634) / denom"])
    assert c.title == "tl.exp(x) -> tl.exp2(x * log2(e)) (2 site(s))"


SIGMOIDS = '''\
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, out_ptr):
    x = tl.load(x_ptr)
    a = 1.0 / (1.0 + tl.exp(-x))
    b = 1 / (tl.math.exp(-(x + 1)) + 1)
    c = x / (1.0 + tl.exp(x))
    tl.store(out_ptr, a + b + c)


def host(x):
    return 1.0 / (1.0 + x.exp())
'''


def test_fast_math_sigmoid_variants_and_non_matches():
    c = one("fast-math", SIGMOIDS, "sigmoid")
    assert changes(SIGMOIDS, c.source) == (["    a = 1.0 / (1.0 + tl.exp(-x))", "    b = 1 / (tl.math.exp(-(x + 1)) + 1)"],
                                           ["    a = tl.sigmoid(x)", "    b = tl.sigmoid(x + 1)"])
    e = one("fast-math", SIGMOIDS, "exp2")  # every tl.exp / tl.math.exp in the kernel, not host code
    assert changes(SIGMOIDS, e.source)[1] == ["    a = 1.0 / (1.0 + tl.exp2(-x * 1.4426950408889634))",
                                              "    b = 1 / (tl.math.exp2(-(x + 1) * 1.4426950408889634) + 1)",
                                              "    c = x / (1.0 + tl.exp2(x * 1.4426950408889634))"]


@pytest.mark.parametrize("op", ["vector_add", "layernorm", "rmsnorm", "row_sum", "matmul"])
def test_fast_math_does_not_apply_without_exp(op):
    assert cands("fast-math", src(op, "triton")) == []


# --------------------------------------------------------------------------- eviction-policy


def test_eviction_vector_add_marks_every_load():
    source = src("vector_add", "triton")
    c = one("eviction-policy", source)
    assert changes(source, c.source) == (
        ["    x = tl.load(x_ptr + offs, mask=mask)", "    y = tl.load(y_ptr + offs, mask=mask)"],
        ['    x = tl.load(x_ptr + offs, mask=mask, eviction_policy="evict_first")',
         '    y = tl.load(y_ptr + offs, mask=mask, eviction_policy="evict_first")'])
    assert (c.key, c.kind) == ("eviction-policy:evict_first", "eviction")
    assert cands("eviction-policy", c.source) == []  # loads that have a policy are left alone


def test_eviction_row_sum_streaming_row():
    source = src("row_sum", "triton")
    c = one("eviction-policy", source)
    assert changes(source, c.source)[1] == [
        '        acc += tl.load(x_row + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_first").to(tl.float32)']


@pytest.mark.parametrize("op", ["softmax", "layernorm", "rmsnorm", "matmul", "attention"])
def test_eviction_leaves_reread_and_shared_data_alone(op):
    # softmax/layernorm/rmsnorm re-read the row in later passes and read weights from every
    # program; dot kernels re-read tiles from other programs
    assert cands("eviction-policy", src(op, "triton")) == []


# --------------------------------------------------------------------------- launch-param: added num_stages


def test_launch_param_adds_num_stages_to_looping_kernels():
    source = src("row_sum", "triton")
    c = one("launch-param", source, "num_stages")
    assert changes(source, c.source) == (
        ["    row_sum_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS)"],
        ["    row_sum_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS, num_stages=4)"])
    assert (c.key, c.title) == ("launch-param:num_stages=4", "row_sum_kernel: num_stages (default 3) -> 4")
    # once explicit, the usual one-step rule takes over
    assert one("launch-param", c.source, "num_stages").title == "num_stages 4 -> 5"


def test_launch_param_adds_no_num_stages_without_a_loop_or_when_present():
    assert [c for c in cands("launch-param", src("vector_add", "triton")) if c.kind == "num_stages"] == []
    matmul = src("matmul", "triton")  # has num_stages=NUM_STAGES already: one step up, nothing added
    c = one("launch-param", matmul, "num_stages")
    assert c.title == "NUM_STAGES 2 -> 3" and c.source.count("num_stages=") == 1


# --------------------------------------------------------------------------- grouped-ordering


def test_grouped_ordering_on_the_2d_matmul_grid():
    source = src("matmul", "triton")
    c = one("grouped-ordering", source)
    removed, added = changes(source, c.source)
    assert removed == [
        "                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):",
        "    pid_m = tl.program_id(0)", "    pid_n = tl.program_id(1)",
        "                        num_warps=NUM_WARPS, num_stages=NUM_STAGES)"]
    assert added == [
        "GROUP_SIZE_M = 8",
        "                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):",
        "    # grouped ordering: GROUP_SIZE_M tile rows at a time share their A and B panels in L2",
        "    num_pid_m = tl.num_programs(0)",
        "    num_pid_n = tl.num_programs(1)",
        "    pid = tl.program_id(1) * num_pid_m + tl.program_id(0)  # launch order: axis 0 fastest",
        "    num_pid_in_group = GROUP_SIZE_M * num_pid_n",
        "    group_id = pid // num_pid_in_group",
        "    first_pid_m = group_id * GROUP_SIZE_M",
        "    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)",
        "    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m",
        "    pid_n = (pid % num_pid_in_group) // group_size_m",
        "                        num_warps=NUM_WARPS, num_stages=NUM_STAGES, GROUP_SIZE_M=GROUP_SIZE_M)"]
    assert (c.kind, c.key) == ("grouped-ordering", "grouped-ordering:matmul_kernel.GROUP_SIZE_M=8")
    assert cands("grouped-ordering", c.source) == []  # already grouped


ONE_PID = '''\
import triton
import triton.language as tl

BM = 64
BN = 64


@triton.jit
def mm(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    acc = tl.dot(tl.load(a_ptr + pid_m), tl.load(b_ptr + pid_n))
    tl.store(c_ptr, acc)


def run(a, b, c):
    M, K = a.shape
    N = b.shape[1]
    mm[(triton.cdiv(M, BM) * triton.cdiv(N, BN),)](a, b, c, M, N, K, BM=BM, BN=BN)
    return c
'''


def test_grouped_ordering_on_the_one_program_id_split():
    c = one("grouped-ordering", ONE_PID)
    removed, added = changes(ONE_PID, c.source)
    assert removed == ["def mm(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr):",
                       "    pid_m = pid // num_pid_n", "    pid_n = pid % num_pid_n",
                       "    mm[(triton.cdiv(M, BM) * triton.cdiv(N, BN),)](a, b, c, M, N, K, BM=BM, BN=BN)"]
    assert added == ["GROUP_SIZE_M = 8",
                     "def mm(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, GROUP_SIZE_M: tl.constexpr):",
                     "    # grouped ordering: GROUP_SIZE_M tile rows at a time share their A and B panels in L2",
                     "    num_pid_in_group = GROUP_SIZE_M * num_pid_n",
                     "    group_id = pid // num_pid_in_group",
                     "    first_pid_m = group_id * GROUP_SIZE_M",
                     "    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)",
                     "    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m",
                     "    pid_n = (pid % num_pid_in_group) // group_size_m",
                     "    mm[(triton.cdiv(M, BM) * triton.cdiv(N, BN),)](a, b, c, M, N, K, BM=BM, BN=BN, GROUP_SIZE_M=GROUP_SIZE_M)"]


def test_grouped_ordering_skips_non_tile_grids_and_non_dot_kernels():
    assert cands("grouped-ordering", src("attention", "triton")) == []  # (query block, batch*head) grid
    for op in ("vector_add", "softmax"):
        assert cands("grouped-ordering", src(op, "triton")) == []
    no_split = ONE_PID.replace("    pid_n = pid % num_pid_n\n", "    pid_n = pid % 3\n")
    assert cands("grouped-ordering", no_split) == []


# --------------------------------------------------------------------------- cutile-latency


def test_cutile_latency_ladder_on_vector_add():
    source = src("vector_add", "cutile")
    found = cands("cutile-latency", source)
    assert [c.key for c in found] == ["cutile-latency:latency=2", "cutile-latency:latency=4", "cutile-latency:latency=8"]
    assert {c.kind for c in found} == {"latency"}
    assert changes(source, found[0].source) == (
        ["    a = ct.load(x, index=(bid,), shape=(TILE,))", "    b = ct.load(y, index=(bid,), shape=(TILE,))"],
        ["    a = ct.load(x, index=(bid,), shape=(TILE,), latency=2)", "    b = ct.load(y, index=(bid,), shape=(TILE,), latency=2)"])
    # once 2 is in place, 4 and 8 remain
    assert [c.key for c in cands("cutile-latency", found[0].source)] == ["cutile-latency:latency=4", "cutile-latency:latency=8"]
    assert found[0].title == "ct.load latency none -> 2 on 2 streaming load(s) (x, y)"


def test_cutile_latency_leaves_weight_loads_alone():
    source = src("layernorm", "cutile")
    c = cands("cutile-latency", source)[0]
    removed, added = changes(source, c.source)
    assert len(added) == 1 and "ct.load(x, index=(row, 0)" in added[0] and added[0].count("latency=2") == 1
    assert "index=(0, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)" in c.source
    assert "latency" not in "".join(line for line in c.source.splitlines() if "index=(0, 0)" in line)


def test_cutile_latency_follows_the_block_id_through_locals():
    c = cands("cutile-latency", src("attention", "cutile"))[0]
    assert c.title.endswith("3 streaming load(s) (q, k, v)")  # k/v index (b, h, ...) with b = bid_bh // heads


# --------------------------------------------------------------------------- cutile-store-no-tma


def test_cutile_store_no_tma_on_rmsnorm():
    source = src("rmsnorm", "cutile")
    c = one("cutile-store-no-tma", source)
    assert changes(source, c.source) == (
        ["    ct.store(out, index=(row, 0), tile=ct.astype(y, out.dtype))  # columns past n_cols are not stored"],
        ["    ct.store(out, index=(row, 0), tile=ct.astype(y, out.dtype), allow_tma=False)  # columns past n_cols are not stored"])
    assert (c.kind, c.key) == ("store-tma", "cutile-store-no-tma:allow_tma=False")
    assert cands("cutile-store-no-tma", c.source) == []
    assert cands("cutile-store-no-tma", src("rmsnorm", "triton")) == []


# --------------------------------------------------------------------------- cutile-approx


def test_cutile_approx_on_softmax_three_candidates():
    source = src("softmax", "cutile")
    found = {c.key: c for c in cands("cutile-approx", source)}
    assert list(found) == ["cutile-approx:exp", "cutile-approx:div", "cutile-approx:ftz"]
    assert changes(source, found["cutile-approx:exp"].source) == (
        ["    num = ct.exp(tile - row_max)"], ["    num = ct.exp(tile - row_max, rounding_mode=ct.RoundingMode.APPROX)"])
    assert changes(source, found["cutile-approx:div"].source)[1] == [
        "    ct.store(out, index=(row, 0), tile=ct.astype(ct.truediv(num, den, rounding_mode=ct.RoundingMode.APPROX), out.dtype))"]
    assert changes(source, found["cutile-approx:ftz"].source)[1] == [
        "    row_max = ct.max(tile, axis=1, keepdims=True, flush_to_zero=True)",
        "    den = ct.sum(num, axis=1, keepdims=True, flush_to_zero=True)"]
    assert [c.kind for c in found.values()] == ["approx", "approx", "ftz"]


def test_cutile_approx_touches_only_fp32_operands():
    assert cands("cutile-approx", src("vector_add", "cutile")) == []  # a + b in the storage dtype
    assert cands("cutile-approx", src("matmul", "cutile")) == []
    source = '''\
import cuda.tile as ct


@ct.kernel
def k(x, out, TILE: ct.Constant[int]):
    t = ct.load(x, index=(ct.bid(0),), shape=(TILE,))
    h = ct.exp(t) / ct.sum(t)
    f = ct.astype(t, ct.float32)
    g = ct.exp(f) / ct.sum(f)
    ct.store(out, index=(ct.bid(0),), tile=ct.astype(h + g, out.dtype))
'''
    found = {c.key: c for c in cands("cutile-approx", source)}
    assert changes(source, found["cutile-approx:exp"].source)[1] == [
        "    g = ct.exp(f, rounding_mode=ct.RoundingMode.APPROX) / ct.sum(f)"]
    assert changes(source, found["cutile-approx:div"].source)[1] == [
        "    g = ct.truediv(ct.exp(f), ct.sum(f), rounding_mode=ct.RoundingMode.APPROX)"]
    assert changes(source, found["cutile-approx:ftz"].source)[1] == [
        "    g = ct.exp(f) / ct.sum(f, flush_to_zero=True)"]  # ct.exp has no flush_to_zero


def test_cutile_option_tables_match_the_installed_signatures():
    ct = pytest.importorskip("cuda.tile")
    from playbook.cutile.approx import APPROX_TRANSCENDENTAL, FTZ_OPS

    ftz = {n for n in dir(ct) if not n.startswith("_") and callable(getattr(ct, n))
           and _has_param(getattr(ct, n), "flush_to_zero")}
    assert set(FTZ_OPS) == ftz
    for name in (*APPROX_TRANSCENDENTAL, "truediv"):
        assert _has_param(getattr(ct, name), "rounding_mode"), name
    assert not _has_param(ct.exp, "flush_to_zero") and not _has_param(ct.exp2, "rounding_mode")
    assert ct.RoundingMode.APPROX
    for name in ("latency", "allow_tma"):
        assert _has_param(ct.load, name) and _has_param(ct.store, name)


def _has_param(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------- cutile-num-ctas


def test_cutile_num_ctas_on_matmul_only():
    source = src("matmul", "cutile")
    c = one("cutile-num-ctas", source)
    assert changes(source, c.source) == (["@ct.kernel"], ["@ct.kernel(num_ctas=2)"])
    assert (c.kind, c.key) == ("num_ctas", "cutile-num-ctas:matmul_kernel.num_ctas=2")
    assert cands("cutile-num-ctas", c.source) == []
    assert cands("cutile-num-ctas", src("softmax", "cutile")) == []  # not an MMA kernel
    with_occ = source.replace("@ct.kernel\n", "@ct.kernel(occupancy=2)\n")
    assert changes(with_occ, one("cutile-num-ctas", with_occ).source)[1] == ["@ct.kernel(occupancy=2, num_ctas=2)"]


# --------------------------------------------------------------------------- priority and next_candidate


@pytest.mark.slow  # the fast tier stays well under five minutes
def test_priority_tables_cover_every_kind_the_recipes_emit():
    kinds: dict[str, set[str]] = {language: set() for language in PRIORITY}
    for target in ALL_TARGETS:
        source = target.read_text()
        an = analyze(source)
        for recipe in playbook.recipes():
            if an.language in recipe.languages and recipe.applies(an):
                kinds[an.language].update(c.kind for c in recipe.candidates(source, an))
    assert kinds["triton"] and kinds["cutile"] and kinds["tilelang"]  # every language's kernels were read
    for language, emitted in kinds.items():
        assert emitted <= set().union(*PRIORITY[language].values()), language
    mem = TRITON_PRIORITY["element-wise"]
    assert mem[:8] == ["autotune", "tileir-configs", "whole-row", "block", "persistent", "num_warps", "eviction",
                       "num_stages"]
    dot = ["autotune", "tma", "grouped-ordering", "num_stages"]
    assert [k for k in TRITON_PRIORITY["dot"] if k in dot] == dot
    for cls, order in CUTILE_PRIORITY.items():
        assert order.index("autotune") < order.index("occupancy") and order.index("autotune") < order.index("block")
        assert order.index("latency") < order.index("approx")
    for cls in ("element-wise", "norm-like", "reduction"):  # occupancy before a persistent grid sized by it
        assert CUTILE_PRIORITY[cls].index("occupancy") < CUTILE_PRIORITY[cls].index("persistent")


def drain(source: str, demoted=(), limit: int = 99) -> list:
    an = analyze(source)
    tried, out = [], []
    while len(out) < limit and (c := next_candidate(source, an, tried, list(demoted))) is not None:
        tried.append(c.key)
        out.append(c)
    return out


def test_next_candidate_order_over_all_recipes_for_a_memory_bound_triton_kernel():
    order = [c.key for c in drain(src("row_sum", "triton"))]
    assert order == ["triton-autotune:row_sum_kernel", "launch-param:BLOCK=256", "triton-persistent:row_sum_kernel",
                     "launch-param:num_warps=2", "eviction-policy:evict_first", "launch-param:num_stages=4",
                     "launch-param:BLOCK=64",  # second thoughts (one step down) after every first-line move
                     "launch-param:BLOCK=512", "launch-param:BLOCK=32", "launch-param:num_warps=4"]  # two-step moves last


@pytest.mark.slow  # the fast tier stays well under five minutes
def test_next_candidate_order_for_dot_and_cutile_kernels():
    dot = ["autotune", "tma", "grouped-ordering", "num_stages"]
    assert [c.kind for c in drain(src("matmul", "triton"), limit=6) if c.kind in dot][:4] == dot
    kinds = [c.kind for c in drain(src("softmax", "cutile"))]
    assert kinds.index("autotune") < kinds.index("occupancy")
    assert kinds.index("latency") < kinds.index("approx") < kinds.index("ftz")
    mm = [c.kind for c in drain(src("matmul", "cutile"))]
    assert [k for k in mm if k in ("autotune", "occupancy", "block")][:5] == ["autotune", "occupancy", "block", "block",
                                                                            "block"]


def test_next_candidate_demoted_kinds_go_last_and_tried_keys_are_skipped():
    order = drain(src("row_sum", "triton"), demoted=["block", "autotune"])
    kinds = [c.kind for c in order]
    assert kinds[:5] == ["persistent", "num_warps", "eviction", "num_stages", "num_warps"]  # the others first, by tier
    assert kinds[5:] == ["autotune", "block", "block", "block", "block"]  # demoted last, by tier among themselves
    an = analyze(src("row_sum", "triton"))
    c = next_candidate(src("row_sum", "triton"), an, ["triton-autotune:row_sum_kernel"], [])
    assert c.key == "launch-param:BLOCK=256"


def test_playbook_apply_says_why_a_recipe_proposes_nothing(capsys):
    """`playbook apply --dry-run` on a kernel a recipe does not fit: no candidate, and the recipe's own reason."""
    import json

    from loop.cli import main

    target = str(REPO_ROOT / "kernels" / "attention" / "attention_triton.py")
    assert main(["playbook", "apply", "triton-tensor-descriptor", target, "--dry-run", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["candidates"] == []
    assert "did not recognise its pattern" in payload["note"] and "starts from `q_base`" in payload["note"]
    assert main(["playbook", "apply", "triton-persistent", target, "--dry-run", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["candidates"]) == 1 and payload["note"] == "1 candidate(s)"


def test_why_nothing_gives_each_recipe_its_reason():
    """On the autotuned attention kernel (where a GPU run found the playbook exhausted): per recipe, why."""
    from playbook.analysis import analyze
    from playbook.base import why_nothing

    src = (REPO_ROOT / "kernels" / "attention" / "attention_triton.py").read_text()
    (cand,) = [c for c in playbook.get("triton-autotune").candidates(src, analyze(src))]
    tuned = cand.source
    why = why_nothing(tuned, analyze(tuned), tried=[cand.key], skip=["fast-math"])
    assert why["fast-math"] == "skipped (--skip-recipe)"
    assert why["eviction-policy"] == "does not apply to a triton dot kernel"
    assert "already autotuned" in why["triton-autotune"]
    assert "starts from `q_base`, not from a pointer argument" in why["triton-tensor-descriptor"]
    assert set(why) == {r.id for r in playbook.recipes() if "triton" in r.languages}
    fresh = why_nothing(src, analyze(src), tried=[])
    assert fresh["triton-autotune"] == "1 of 1 candidate(s) untried"


def test_why_nothing_says_fast_math_found_no_exp_once_exp2_replaced_them():
    """A GPU run of Triton softmax kept the exp2 rewrite; its exhausted stop then said fast-math
    'does not apply to a triton norm-like kernel', which read as if it had never applied."""
    from playbook.analysis import analyze
    from playbook.base import why_nothing

    src = (REPO_ROOT / "kernels" / "softmax" / "softmax_triton.py").read_text()
    assert why_nothing(src, analyze(src), tried=[])["fast-math"] == "1 of 1 candidate(s) untried"
    (cand,) = [c for c in playbook.get("fast-math").candidates(src, analyze(src))]
    after = why_nothing(cand.source, analyze(cand.source), tried=[cand.key])
    assert after["fast-math"] == "no tl.exp call in the kernel (none, or an earlier rewrite replaced them)"
    assert after["grouped-ordering"] == "does not apply to a triton norm-like kernel"
