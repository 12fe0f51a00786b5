"""The TileLang recipes (playbook/tilelang): golden rewrites of the suite's first TileLang versions (the
matmul, vector_add and softmax found by their names, wherever their folder keeps them), each rewrite parsing and
differing from its source in the one line of its one variable, every value of a sweep likewise; the
bounds the sweeps keep; the forms a recipe reads besides the first versions' (literals, a missing
keyword, an existing swizzle or pass config); the TileLang kernel classes and their priority table;
and `playbook plan`'s explanations. Source-level, tilelang never imported; only the slow tier builds each
candidate with TileLang for sm_90 and sm_100 (skipped, with the reason, where TileLang cannot be imported)."""

from __future__ import annotations

import ast
import difflib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import playbook
from loop.cli import main
from loop.common import tilelang_install
from loop.target.contract import spec_dtypes
from playbook.analysis import TILELANG_PRIORITY, analyze
from playbook.base import ranked
from playbook.tilelang.budget import SMEM_LIMIT, Tile
from playbook.tilelang.program import read

REPO_ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("tilelang-block-size", "tilelang-num-stages", "tilelang-threads", "tilelang-swizzle",
           "tilelang-pass-configs")


def first_version(op: str) -> Path:
    """The suite's first TileLang version of `op`, beside its spec or in a folder of its own."""
    (path,) = [p for p in REPO_ROOT.glob("kernels/*/**/*_tilelang.py") if p.name == f"{op}_tilelang.py"]
    return path


def src(op: str) -> str:
    return first_version(op).read_text()


def changed(before: str, after: str) -> list[str]:
    """The lines a rewrite removes (-) and adds (+)."""
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("---", "+++"))]


def attempt(recipe_id: str, source: str, **kw):
    an = analyze(source, **kw)
    recipe = playbook.get(recipe_id)
    if not recipe.applies(an):
        return [], None
    return recipe.attempt(source, an)


# ------------------------------------------------------------------------------------ golden rewrites

# (op, recipe) -> [(key, kind, tier, the lines it changes, the sweep's values or None)]
GOLDEN = {
    ("matmul", "tilelang-block-size"): [
        ("tilelang-block-size:BLOCK_M=128", "block", 0, ["-BLOCK_M = 64", "+BLOCK_M = 128"], [128, 256]),
        ("tilelang-block-size:BLOCK_M=32", "block", 1, ["-BLOCK_M = 64", "+BLOCK_M = 32"], None),
        ("tilelang-block-size:BLOCK_N=128", "block", 0, ["-BLOCK_N = 64", "+BLOCK_N = 128"], [128, 256]),
        ("tilelang-block-size:BLOCK_N=32", "block", 1, ["-BLOCK_N = 64", "+BLOCK_N = 32"], None),
        ("tilelang-block-size:BLOCK_K=64", "block", 0, ["-BLOCK_K = 32", "+BLOCK_K = 64"], [64, 128]),
        ("tilelang-block-size:BLOCK_K=16", "block", 1, ["-BLOCK_K = 32", "+BLOCK_K = 16"], None),
    ],
    ("matmul", "tilelang-num-stages"): [
        ("tilelang-num-stages:NUM_STAGES=3", "num_stages", 0, ["-NUM_STAGES = 2", "+NUM_STAGES = 3"], [3, 4, 1]),
    ],
    ("matmul", "tilelang-threads"): [
        ("tilelang-threads:THREADS=256", "num_warps", 0, ["-THREADS = 128", "+THREADS = 256"], None),
    ],
    ("matmul", "tilelang-swizzle"): [
        ("tilelang-swizzle:matmul:panel_size=8", "grouped-ordering", 0, ["+            T.use_swizzle(panel_size=8)"],
         [8, 4, 16]),
    ],
    ("matmul", "tilelang-pass-configs"): [
        ("tilelang-pass-configs:matmul:tl.disable_tma_lower=True", "tma", 0,
         ["-@tilelang.jit", '+@tilelang.jit(pass_configs={"tl.disable_tma_lower": True})'], None),
        ("tilelang-pass-configs:matmul:tl.disable_warp_specialized=True", "warp-specialization", 0,
         ["-@tilelang.jit", '+@tilelang.jit(pass_configs={"tl.disable_warp_specialized": True})'], None),
    ],
    ("vector_add", "tilelang-block-size"): [
        ("tilelang-block-size:BLOCK=256", "block", 0, ["-BLOCK = 128", "+BLOCK = 256"], [256, 512, 1024, 2048]),
    ],
    ("softmax", "tilelang-block-size"): [
        ("tilelang-block-size:BLOCK=256", "block", 0, ["-BLOCK = 128", "+BLOCK = 256"], [256, 512, 1024, 2048]),
    ],
}
# (op, recipe) -> what its reason for proposing nothing says
GOLDEN_SKIPS = {
    ("vector_add", "tilelang-num-stages"): "vector_add: no T.Pipelined loop, nothing to pipeline",
    ("vector_add", "tilelang-threads"): "vector_add: threads 128 -> 256 breaks the warp-count rule: a block of 128 "
                                        "elements leaves some of 256 threads without an element",
    ("vector_add", "tilelang-pass-configs"): "vector_add: no T.copy into T.alloc_shared memory for "
                                             "tl.disable_tma_lower to change; no T.Pipelined loop for "
                                             "tl.disable_warp_specialized to change",
    ("softmax", "tilelang-num-stages"): "softmax: no T.Pipelined loop, nothing to pipeline",
    ("softmax", "tilelang-threads"): "softmax: threads 128 -> 256 breaks the warp-count rule: a block of 128 "
                                     "elements leaves some of 256 threads without an element",
    ("softmax", "tilelang-pass-configs"): "softmax: no T.copy into T.alloc_shared memory for "
                                          "tl.disable_tma_lower to change; no T.Pipelined loop for "
                                          "tl.disable_warp_specialized to change",
}
OPS = ("matmul", "vector_add", "softmax")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("recipe_id", RECIPES)
def test_golden_rewrites_of_the_first_versions(op, recipe_id):
    source = src(op)
    cands, why = attempt(recipe_id, source)
    got = [(c.key, c.kind, c.tier, changed(source, c.source), c.sweep and [v.value for v in c.sweep.values])
           for c in cands]
    assert got == GOLDEN.get((op, recipe_id), [])
    if (op, recipe_id) in GOLDEN_SKIPS:
        assert why == GOLDEN_SKIPS[(op, recipe_id)]


@pytest.mark.parametrize("op", OPS)
def test_every_rewrite_and_every_swept_value_parses_and_changes_one_line(op):
    source = src(op)
    an = analyze(source)
    seen = 0
    for recipe in playbook.recipes():
        if "tilelang" not in recipe.languages or not recipe.applies(an):
            continue
        for cand in recipe.candidates(source, an):
            swept = cand.sweep.values if cand.sweep else ()
            versions = [(cand.key, cand.source)] + [(v.key, v.source) for v in swept]
            for key, rewritten in versions:
                ast.parse(rewritten)
                lines = changed(source, rewritten)
                assert len([x for x in lines if x[0] == "+"]) == 1 and len([x for x in lines if x[0] == "-"]) <= 1, key
                value = key.rpartition("=")[2]
                assert value in lines[-1], (key, lines)
                seen += 1
    assert seen >= (10 if op == "matmul" else 4)


def test_the_sweep_is_led_by_its_step_and_names_its_values():
    cands, _ = attempt("tilelang-num-stages", src("matmul"))
    (cand,) = cands
    assert cand.sweep.values[0].key == cand.key and cand.sweep.values[0].source == cand.source
    assert cand.sweep.title == "NUM_STAGES sweep 2 -> {3,4,1}"
    assert cand.sweep.key == "tilelang-num-stages:NUM_STAGES=sweep(3,4,1)"


# ------------------------------------------------------------------------------------ bounds of the sweeps

BIG = src("matmul").replace("BLOCK_K = 32", "BLOCK_K = 128").replace("NUM_STAGES = 2", "NUM_STAGES = 4")


def test_block_sweeps_keep_within_shared_memory_and_the_accumulator_range():
    """A 64x64x128 tile at 4 stages takes 128 KiB: block_M 128 fits (192 KiB), 256 would take 320 KiB, so
    the step to 128 carries no sweep; block_K is at its limit (128), so it has only its step down."""
    tile = Tile(64, 64, 128, 4, 128)
    assert tile.with_value("block_m", 128).fits() and tile.with_value("block_m", 256).smem() > SMEM_LIMIT
    by_key = {c.key: c for c in attempt("tilelang-block-size", BIG)[0]}
    assert by_key["tilelang-block-size:BLOCK_M=128"].sweep is None
    assert "tilelang-block-size:BLOCK_M=256" not in by_key
    assert not any(k.startswith("tilelang-block-size:BLOCK_K=") and int(k.rpartition("=")[2]) > 128 for k in by_key)
    down = by_key["tilelang-block-size:BLOCK_K=64"]
    assert down.tier == 1 and [v.value for v in down.sweep.values] == [64, 32]
    for cand in by_key.values():
        for value in (cand.sweep.values if cand.sweep else ()):
            letter = cand.key.split(":")[1].split("=")[0][-1]
            assert tile.with_value({"M": "block_m", "N": "block_n", "K": "block_k"}[letter], value.value).fits()


def test_num_stages_sweep_leaves_out_what_does_not_fit_shared_memory():
    """256x128x128 takes 96 KiB a stage: of 1..4 only 1 and 2 fit 227 KiB, so from 4 it steps down."""
    big = BIG.replace("BLOCK_M = 64", "BLOCK_M = 256").replace("BLOCK_N = 64", "BLOCK_N = 128")
    (cand,) = attempt("tilelang-num-stages", big)[0]
    tile = Tile(256, 128, 128, 4, 128)
    assert [v for v in range(1, 5) if tile.with_value("stages", v).fits_smem()] == [1, 2]
    assert cand.key == "tilelang-num-stages:NUM_STAGES=2" and [v.value for v in cand.sweep.values] == [2, 1]
    assert "one buffer less" in cand.hypothesis


def test_threads_keep_the_warp_count_rule():
    """The accumulator per thread, block_M * block_N / threads, must stay within 16..128."""
    small = src("matmul").replace("BLOCK_N = 64", "BLOCK_N = 32")
    assert attempt("tilelang-threads", small)[1] == ("matmul: threads 128 -> 256 breaks the warp-count rule: 64x32 "
                                                      "over 256 threads is 8 accumulator values per thread, outside "
                                                      "16-128")
    wide = src("matmul").replace("BLOCK_M = 64", "BLOCK_M = 256").replace("BLOCK_N = 64", "BLOCK_N = 128")
    (up,) = attempt("tilelang-threads", wide)[0]
    assert up.key == "tilelang-threads:THREADS=256" and "two warpgroups" in up.hypothesis
    back = small.replace("THREADS = 128", "THREADS = 256")
    (down,) = attempt("tilelang-threads", back)[0]
    assert changed(back, down.source) == ["-THREADS = 256", "+THREADS = 128"]
    assert attempt("tilelang-threads", wide.replace("THREADS = 128", "THREADS = 256"))[1] == (
        "matmul: threads 256 -> 128 breaks the warp-count rule: 256x128 over 128 threads is 256 accumulator values "
        "per thread, outside 16-128")


# ------------------------------------------------------------------------------------ other forms

LITERAL = '''\
import tilelang
import tilelang.language as T


@tilelang.jit(out_idx=[2])
def mm(M, N, K, dtype="float16"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, 128), T.ceildiv(M, 128)) as (bx, by):
            A_s = T.alloc_shared((128, 32), dtype)
            B_s = T.alloc_shared((32, 128), dtype)
            C_l = T.alloc_fragment((128, 128), "float32")
            T.use_swizzle(panel_size=10, enable=False)
            for k in T.Pipelined(T.ceildiv(K, 32)):
                T.copy(A[by * 128, k * 32], A_s)
                T.copy(B[k * 32, bx * 128], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * 128, bx * 128])

    return main


def run(a, b):
    return mm(a.shape[0], b.shape[1], a.shape[1])(a, b)
'''


def test_a_loop_without_num_stages_and_a_kernel_without_threads_get_them_added():
    (stages,) = attempt("tilelang-num-stages", LITERAL)[0]
    assert changed(LITERAL, stages.source) == ["-            for k in T.Pipelined(T.ceildiv(K, 32)):",
                                               "+            for k in T.Pipelined(T.ceildiv(K, 32), num_stages=2):"]
    assert [v.value for v in stages.sweep.values] == [2, 3, 4]
    assert stages.title == "mm num_stages (none: 0) -> 2"
    assert attempt("tilelang-threads", LITERAL)[1] == ("mm: threads 128 (default) -> 256 breaks the warp-count "
                                                        "rule: block_M and block_N are not stated as integers, so the "
                                                        "rule cannot be checked")
    bare = src("matmul").replace(", threads=threads)", ")")
    (threads,) = attempt("tilelang-threads", bare)[0]
    assert [line.strip() for line in changed(bare, threads.source)] == [
        "-        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M)) as (bx, by):",
        "+        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):"]
    assert threads.title == "matmul threads 128 (default) -> 256"


def test_a_disabled_swizzle_is_switched_on_and_a_panel_is_swept():
    (on,) = attempt("tilelang-swizzle", LITERAL)[0]
    assert changed(LITERAL, on.source) == ["-            T.use_swizzle(panel_size=10, enable=False)",
                                           "+            T.use_swizzle(panel_size=10, enable=True)"]
    panel = LITERAL.replace(", enable=False", "")
    (cand,) = attempt("tilelang-swizzle", panel)[0]
    assert [v.value for v in cand.sweep.values] == [8, 4, 16]
    assert changed(panel, cand.source) == ["-            T.use_swizzle(panel_size=10)",
                                           "+            T.use_swizzle(panel_size=8)"]


def test_pass_configs_extend_an_existing_decorator_and_are_not_proposed_twice():
    cands, _ = attempt("tilelang-pass-configs", LITERAL)
    assert changed(LITERAL, cands[0].source) == [
        "-@tilelang.jit(out_idx=[2])", '+@tilelang.jit(out_idx=[2], pass_configs={"tl.disable_tma_lower": True})']
    once = cands[0].source
    again, _ = attempt("tilelang-pass-configs", once)
    assert [c.kind for c in again] == ["warp-specialization"]
    assert changed(once, again[0].source) == [
        '-@tilelang.jit(out_idx=[2], pass_configs={"tl.disable_tma_lower": True})',
        '+@tilelang.jit(out_idx=[2], pass_configs={"tl.disable_tma_lower": True, "tl.disable_warp_specialized": '
        'True})']


def test_pass_configs_do_not_apply_before_hopper():
    an = analyze(src("matmul"), arch="sm_80")
    recipe = playbook.get("tilelang-pass-configs")
    assert not recipe.applies(an) and "sm_90" in recipe.inapplicable(an)
    assert recipe.applies(analyze(src("matmul"), arch="sm_100"))


def test_a_value_kept_is_a_current_key():
    for recipe_id, expected in (("tilelang-block-size", {"BLOCK_M=64", "BLOCK_N=64", "BLOCK_K=32"}),
                                ("tilelang-num-stages", {"NUM_STAGES=2"}), ("tilelang-threads", {"THREADS=128"})):
        keys = playbook.get(recipe_id).current_keys(src("matmul"))
        assert {k.removeprefix(f"{recipe_id}:") for k in keys} == expected


def test_a_target_without_a_tilelang_kernel_is_refused_with_its_reason():
    source = "import tilelang\n\n\ndef run(x):\n    return x\n"
    assert attempt("tilelang-block-size", source)[1] == "no @tilelang.jit kernel"


# ------------------------------------------------------------------------------------ classes and order

REDUCE = '''\
import tilelang
import tilelang.language as T


@tilelang.jit
def rows(M, N, dtype):
    @T.prim_func
    def main(x: T.Tensor((M, N), dtype), out: T.Tensor((M,), dtype)):
        with T.Kernel(M, threads=128) as bx:
            tile = T.alloc_fragment((N,), dtype)
            total = T.alloc_fragment((1,), dtype)
            T.copy(x[bx, 0], tile)
            T.reduce_sum(tile, total, dim=0)
            out[bx] = total[0]

    return main


def run(x, out):
    rows(x.shape[0], x.shape[1], "float32")(x, out)
    return out
'''


def test_tilelang_kernel_classes():
    assert analyze(src("matmul")).kernel_class == "dot"
    assert analyze(src("matmul")).reasons() == ["matrix product: calls gemm"]
    assert analyze(src("vector_add")).kernel_class == "element-wise"
    assert analyze(REDUCE).kernel_class == "reduction"
    assert analyze(src("softmax")).kernel_class == "norm-like"
    assert analyze(src("softmax")).reasons() == ["no matrix product (T.gemm in any form)",
                                                 "reduction: calls reduce_max, reduce_sum", "normalisation: calls exp"]
    norm = REDUCE.replace("out[bx] = total[0]", "out[bx] = T.rsqrt(total[0])")
    assert analyze(norm).kernel_class == "norm-like"
    # a T.gemm outside the kernels (host code) does not make a kernel a matrix product
    host = src("vector_add").replace("    return out\n", "    T.gemm(x, y, out)\n    return out\n")
    assert analyze(host).kernel_class == "element-wise"


def test_the_tilelang_priority_table_orders_candidates():
    an = analyze(src("matmul"))
    assert an.priority() == TILELANG_PRIORITY["dot"]
    pool = ranked(src("matmul"), an, (), ())
    tiers = [c.tier for c in pool]
    assert tiers == sorted(tiers)  # every step up before a step down
    order = TILELANG_PRIORITY["dot"]
    tier0 = [c.kind for c in pool if c.tier == 0]
    assert tier0 == sorted(tier0, key=order.index) and tier0[0] == "block" and tier0[-1] == "warp-specialization"
    assert analyze(src("vector_add")).priority() == TILELANG_PRIORITY["element-wise"]


def test_the_recipes_never_import_tilelang():
    script = ("import sys\nimport playbook\nfrom playbook.analysis import analyze\n"
              f"source = open({str(first_version('matmul'))!r}).read()\nan = analyze(source)\n"
              "n = sum(len(r.candidates(source, an)) for r in playbook.recipes() if 'tilelang' in r.languages)\n"
              "print(n, 'tilelang' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    count, imported = out.stdout.split()
    assert int(count) > 0 and imported == "False"


# ------------------------------------------------------------------------------------ playbook plan


def plan(capsys, op: str) -> dict:
    assert main(["playbook", "plan", str(first_version(op)), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_explains_every_tilelang_recipe_for_the_matmul(capsys):
    out = plan(capsys, "matmul")
    assert (out["language"], out["kernel_class"]) == ("tilelang", "dot")
    assert [a["id"] for a in out["applicable"]] == list(RECIPES) and out["not_applicable"] == []
    assert all(a["hypothesis"] for a in out["applicable"])
    first = [row for row in out["plan"]["order"]][0]
    assert "BLOCK_M 64 -> 128" in json.dumps(first)


def test_plan_says_why_each_recipe_does_not_apply_to_vector_add(capsys):
    out = plan(capsys, "vector_add")
    assert (out["language"], out["kernel_class"]) == ("tilelang", "element-wise")
    assert [a["id"] for a in out["applicable"]] == ["tilelang-block-size"]
    reasons = {n["id"]: n["reason"] for n in out["not_applicable"]}
    assert set(reasons) == set(RECIPES) - {"tilelang-block-size"}
    for recipe_id in ("tilelang-num-stages", "tilelang-threads", "tilelang-pass-configs"):
        assert reasons[recipe_id] == GOLDEN_SKIPS[("vector_add", recipe_id)]
    assert reasons["tilelang-swizzle"].startswith("does not apply to a tilelang element-wise kernel")


def test_plan_lists_the_block_size_sweep_for_the_softmax_and_says_why_the_rest_do_not_apply(capsys):
    out = plan(capsys, "softmax")
    assert (out["language"], out["kernel_class"]) == ("tilelang", "norm-like")
    assert [a["id"] for a in out["applicable"]] == ["tilelang-block-size"]
    assert [(row["recipe"], row["optimization"]) for row in out["plan"]["order"]] == [
        ("tilelang-block-size", "BLOCK 128 -> 256")]
    reasons = {n["id"]: n["reason"] for n in out["not_applicable"]}
    assert set(reasons) == set(RECIPES) - {"tilelang-block-size"}
    for recipe_id in ("tilelang-num-stages", "tilelang-threads", "tilelang-pass-configs"):
        assert reasons[recipe_id] == GOLDEN_SKIPS[("softmax", recipe_id)]
    assert reasons["tilelang-swizzle"].startswith("does not apply to a tilelang norm-like kernel")


def test_the_reading_follows_the_compile_call_to_the_module_constants():
    program = read(src("matmul"))
    (kernel,) = program.kernels.values()
    assert kernel.compile_call is not None
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "NUM_STAGES", "THREADS"} <= set(program.constants)


# ------------------------------------------------------------------------------------ built (slow tier)

FIRST_CANDIDATES = [(op, key) for op in OPS for (o, _), rows in GOLDEN.items() if o == op
                    for key, *_ in rows]
# matmul's eleven candidates build in float16 only: bfloat16, its spec's other dtype, has the same width, so
# the same tiles, shared memory and pipeline, and its builds were half of each case's time; the first
# version builds in both (tests/test_tilelang.py).
BUILD_DTYPES = {"matmul": ["float16"]}


@pytest.mark.slow
@pytest.mark.skipif(not tilelang_install.status()["importable"],
                    reason=f"tilelang: {tilelang_install.status()['reason']} (CI installs the extra)")
@pytest.mark.parametrize("op,key", FIRST_CANDIDATES, ids=[f"{op}-{key}" for op, key in FIRST_CANDIDATES])
def test_every_candidate_builds_for_sm_90_and_sm_100(op, key, tmp_path, capsys):
    """`tileloop compile --json` (the compile gate's worker) on each candidate of each first version, with its spec
    (matmul's in BUILD_DTYPES' dtype)."""
    target = first_version(op)
    an = analyze(target.read_text())
    (cand,) = [c for r in playbook.recipes() if "tilelang" in r.languages and r.applies(an)
               for c in r.candidates(target.read_text(), an) if c.key == key]
    folder = tmp_path / op
    shutil.copytree(target.parent, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / target.name).write_text(cand.source)
    if op in BUILD_DTYPES:
        spec = folder / "spec.py"
        text, n = re.subn(r"^DTYPES = .*$", f"DTYPES = {BUILD_DTYPES[op]!r}", spec.read_text(), count=1, flags=re.M)
        assert n == 1, spec
        spec.write_text(text)
    assert main(["compile", str(folder / target.name), "--arch", "sm_90,sm_100", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"], payload["message"]
    assert {r["arch"] for r in payload["kernels"]} == {"sm_90", "sm_100"} and all(r["ok"] for r in payload["kernels"])
    assert {r["dtype"] for r in payload["kernels"]} == set(spec_dtypes(folder / "spec.py"))
