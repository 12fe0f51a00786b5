"""The cuTile structural recipes: cutile-persistent, cutile-grouped, cutile-tf32, cutile-gather-to-tma.

* Golden tests: reference kernel (or a small kernel of the test's own) -> the exact rewrite, and
  the reasons each recipe gives where it proposes nothing.
* Schedule replay (CPU, no GPU): cuTile kernels cannot run here, but a block-to-work mapping can
  be checked without running any tile math. Each kernel is executed block by block as plain
  Python against a recording stand-in for `cuda.tile` (tiles are opaque; `ct.bid`,
  `ct.num_blocks`, `ct.num_tiles` and `ct.cdiv` are real), before and after the rewrite: the
  multiset of (array, tile index) loads and stores must be the same, i.e. every output tile is
  written exactly as before, from the same input tiles.
* Ahead of time (slow): the rewrites compile for sm_90 and sm_100 through `tileloop compile`; the
  TF32 guard leaves fp16 SASS unchanged and puts fp32 on TF32 tensor cores.
"""

from __future__ import annotations

import difflib
import importlib.util
import io
import itertools
import json
import re
import subprocess
import tempfile
import types
from collections import Counter
from pathlib import Path

import pytest

import playbook
from loop.cli import main
from playbook import next_candidate
from playbook.analysis import CUTILE_PRIORITY, analyze
from playbook.base import page_path
from tests.conftest import materialise

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = REPO_ROOT / "kernels"
CUTILE_OPS = sorted(p.parent.name for p in KERNELS.glob("*/*_cutile.py"))
RECIPES = ("cutile-persistent", "cutile-grouped", "cutile-tf32", "cutile-gather-to-tma")


def src(op: str) -> str:
    return (KERNELS / op / f"{op}_cutile.py").read_text()


def cands(recipe_id: str, source: str):
    recipe = playbook.get(recipe_id)
    an = analyze(source)
    return recipe.candidates(source, an) if an.language in recipe.languages and recipe.applies(an) else []


def one(recipe_id: str, source: str, key: str | None = None):
    found = [c for c in cands(recipe_id, source) if key is None or c.key == key]
    assert len(found) == 1, [c.key for c in found]
    return found[0]


def reason(recipe_id: str, source: str) -> str | None:
    return playbook.get(recipe_id).skip_reason(source, analyze(source))


def changes(a: str, b: str) -> tuple[list[str], list[str]]:
    """(removed lines, added lines) of a unified diff without context."""
    removed, added = [], []
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        (removed if line.startswith("-") else added).append(line[1:])
    return removed, added


# --------------------------------------------------------------------------- registry, pages, priority


def test_registered_with_pages_and_kinds_in_the_cutile_priority_tables():
    ids = {r.id for r in playbook.recipes()}
    assert set(RECIPES) <= ids
    for rid in RECIPES:
        assert playbook.get(rid).languages == ("cutile",)
        text = page_path(playbook.get(rid)).read_text()
        assert text.startswith(f"# {rid}\n")
        for section in ("## What it changes", "## When", "## Expected effect", "## Hazards", "## Before / after"):
            assert section in text, (rid, section)
    memory, dot = CUTILE_PRIORITY["norm-like"], CUTILE_PRIORITY["dot"]
    # memory-bound: the autotune space first, then the store path and tile steps, occupancy, gather-to-TMA;
    # a persistent grid (measured 0.25-0.81x on the H200 row kernels) near the end
    assert memory[:4] == ["autotune", "store-tma", "block", "occupancy"]
    assert memory.index("occupancy") < memory.index("tma") < memory.index("persistent")
    assert dot[0] == "tf32"  # perf-knobs, compute-bound: TF32 first (within its tier)
    assert dot.index("block") < dot.index("grouped-ordering") < dot.index("persistent")


def test_the_recipes_apply_to_the_reference_kernels_as_documented():
    applies = {rid: sorted(op for op in CUTILE_OPS if cands(rid, src(op))) for rid in RECIPES}
    assert applies == {
        "cutile-persistent": CUTILE_OPS,  # every reference kernel has a 1-D or 2-D grid and one launch
        "cutile-grouped": ["matmul"],  # attention's grid is (query block, batch * head), not tiles of C
        "cutile-tf32": ["attention", "matmul"],
        "cutile-gather-to-tma": [],  # no reference kernel gathers
    }
    assert reason("cutile-grouped", src("attention")) == (
        "attention_kernel: bid_bh does not index an output tile (ct.store index): not a 2-D tile grid")
    assert reason("cutile-gather-to-tma", src("softmax")) == "softmax_kernel has no ct.gather or ct.scatter"
    assert reason("cutile-tf32", src("softmax")) == "cutile-tf32 does not apply to a cutile norm-like kernel"
    for rid in RECIPES:
        assert cands(rid, (KERNELS / "matmul" / "matmul_triton.py").read_text()) == []


# --------------------------------------------------------------------------- cutile-persistent

SOFTMAX_PERSISTENT = '''\
"""softmax in cuTile, first version: one row per block, the whole row as one tile, default
occupancy, no autotune."""

import functools

import cuda.tile as ct
import torch

BLOCKS_PER_SM = 1  # persistent grid: blocks per SM (the occupancy hint)


def next_power_of_2(n):
    return 1 << (n - 1).bit_length()


@ct.kernel
def softmax_kernel(x, out, TILE_N: ct.Constant[int], num_rows: int):
    # persistent: block b computes rows b, b + num_blocks, b + 2 * num_blocks, ...
    for row in range(ct.bid(0), num_rows, ct.num_blocks(0)):
        tile = ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF)
        tile = ct.astype(tile, ct.float32)
        row_max = ct.max(tile, axis=1, keepdims=True)
        num = ct.exp(tile - row_max)
        den = ct.sum(num, axis=1, keepdims=True)
        ct.store(out, index=(row, 0), tile=ct.astype(num / den, out.dtype))


@functools.cache
def _sm_count(device: int) -> int:
    """Streaming multiprocessors of a device, asked once per device."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def run(x, out):
    rows, cols = x.shape
    blocks = min(rows, _sm_count(torch.cuda.current_device()) * BLOCKS_PER_SM)
    ct.launch(torch.cuda.current_stream(), (blocks, 1, 1), softmax_kernel, (x, out, next_power_of_2(cols), rows))
    return out
'''


def test_persistent_softmax_exact():
    c = one("cutile-persistent", src("softmax"))
    assert c.source == SOFTMAX_PERSISTENT
    assert (c.recipe, c.kind, c.key, c.tier) == ("cutile-persistent", "persistent",
                                                 "cutile-persistent:softmax_kernel", 0)
    assert c.title == "softmax_kernel: persistent grid, min(num_rows, SMs x 1) blocks looping over rows"


def test_persistent_matmul_loops_over_a_linear_tile_id_in_launch_order():
    source = src("matmul")
    removed, added = changes(source, one("cutile-persistent", source).source)
    assert removed[:3] == [
        "def matmul_kernel(a, b, c, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int], TILE_K: ct.Constant[int]):",
        "    bid_m = ct.bid(0)", "    bid_n = ct.bid(1)"]
    assert added[:7] == [
        "", "import functools", "BLOCKS_PER_SM = 1  # persistent grid: blocks per SM (the occupancy hint)",
        "def matmul_kernel(a, b, c, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int], TILE_K: ct.Constant[int], "
        "grid_0: int, grid_1: int):",
        "    # persistent: block b computes tiles b, b + num_blocks, b + 2 * num_blocks, ...",
        "    for work_id in range(ct.bid(0), grid_0 * grid_1, ct.num_blocks(0)):",
        "        bid_m = work_id % grid_0"]
    assert added[7] == "        bid_n = work_id // grid_0"
    assert added[-3:] == [
        "    grid_0, grid_1 = ct.cdiv(M, TILE_M), ct.cdiv(N, TILE_N)",
        "    blocks = min(grid_0 * grid_1, _sm_count(torch.cuda.current_device()) * BLOCKS_PER_SM)",
        "    ct.launch(torch.cuda.current_stream(), (blocks, 1, 1), matmul_kernel, "
        "(a, b, out, TILE_M, TILE_N, TILE_K, grid_0, grid_1))"]
    assert removed[-2:] == [
        "    grid = (ct.cdiv(M, TILE_M), ct.cdiv(N, TILE_N), 1)",
        "    ct.launch(torch.cuda.current_stream(), grid, matmul_kernel, (a, b, out, TILE_M, TILE_N, TILE_K))"]


def test_persistent_names_a_computed_extent_and_follows_the_occupancy_hint():
    source = src("vector_add").replace("@ct.kernel\n", "@ct.kernel(occupancy=4)\n")
    c = one("cutile-persistent", source)
    assert "BLOCKS_PER_SM = 4  # persistent grid: blocks per SM (the occupancy hint)" in c.source
    assert "    for bid in range(ct.bid(0), num_items, ct.num_blocks(0)):" in c.source
    assert "    num_items = ct.cdiv(n, TILE)\n    blocks = min(num_items, " in c.source
    assert "(blocks, 1, 1), add_kernel, (x, y, out, TILE, num_items))" in c.source
    assert "SMs x 4" in c.title


def test_persistent_then_blocks_per_sm_doubles_up_to_32():
    source = one("cutile-persistent", src("row_sum")).source
    seen = []
    while found := cands("cutile-persistent", source):
        (c,) = found
        seen.append(c.title)
        assert c.kind == "persistent" and changes(source, c.source)[0][0].startswith("BLOCKS_PER_SM = ")
        source = c.source
    assert seen == [f"BLOCKS_PER_SM {k} -> {2 * k}" for k in (1, 2, 4, 8, 16)]
    assert "BLOCKS_PER_SM is already 32 (at most 32)" in reason("cutile-persistent", source)


PLAN = '''\
import cuda.tile as ct
import torch


@ct.kernel
def scale_kernel(x, out, TILE: ct.Constant[int]):
    """Scales one tile."""
    bid = ct.bid(0)
    ct.store(out, index=(bid,), tile=ct.load(x, index=(bid,), shape=(TILE,)) * 2)


def _launch_plan(cfg, x, out):
    grid = (ct.cdiv(x.numel(), cfg["TILE"]), 1, 1)
    return (grid, scale_kernel, (x, out, cfg["TILE"]), {})
'''


def test_persistent_rewrites_a_launch_plan_and_keeps_the_docstring():
    removed, added = changes(PLAN, one("cutile-persistent", PLAN).source)
    assert "    for bid in range(ct.bid(0), num_items, ct.num_blocks(0)):" in added
    assert '    """Scales one tile."""' not in removed
    assert added[-3:] == ['    num_items = ct.cdiv(x.numel(), cfg["TILE"])',
                          "    blocks = min(num_items, _sm_count(torch.cuda.current_device()) * BLOCKS_PER_SM)",
                          '    return ((blocks, 1, 1), scale_kernel, (x, out, cfg["TILE"], num_items), {})']


@pytest.mark.parametrize("edit,why", [
    (("    bid = ct.bid(0)\n", "    bid = ct.bid(0)\n    if bid > 4:\n        return\n"), "returns early"),
    (("(ct.cdiv(n, TILE), 1, 1)", "(ct.cdiv(n, TILE), 1, 2)"), "has a 3-D grid"),
    (("    return out\n", "    ct.launch(torch.cuda.current_stream(), (1, 1, 1), add_kernel, (x, y, out, TILE))\n"
                          "    return out\n"), "add_kernel is launched 2 times"),
    (("add_kernel, (x, y, out, TILE))", "add_kernel, [x, y, out, TILE])"), "not a tuple literal"),
    (("import torch\n", "import torch as th\n"), "needs `import torch`"),
    (("    n = out.numel()\n", "    n = out.numel()\n    blocks = 0\n"), "already uses blocks"),
    (("    bid = ct.bid(0)\n", "    bid = ct.bid(0) + ct.bid(1)\n"), "reads axis 1 of a 1-D grid"),
])
def test_persistent_skips_with_the_reason(edit, why):
    source = src("vector_add").replace(*edit)
    assert source != src("vector_add")
    assert cands("cutile-persistent", source) == []
    assert why in reason("cutile-persistent", source)


def test_persistent_is_not_applied_twice():
    once = one("cutile-persistent", src("softmax")).source
    assert [c.key for c in cands("cutile-persistent", once)] == ["cutile-persistent:BLOCKS_PER_SM=2"]
    unmarked = once.replace("BLOCKS_PER_SM = 1", "X = 1")  # no step-up left: the kernel itself is refused
    assert "softmax_kernel is already persistent" in reason("cutile-persistent", unmarked)


# --------------------------------------------------------------------------- cutile-grouped


def test_grouped_matmul_exact_lines():
    source = src("matmul")
    c = one("cutile-grouped", source)
    assert (c.kind, c.key, c.tier) == ("grouped-ordering", "cutile-grouped:matmul_kernel.GROUP_SIZE_M=8", 0)
    removed, added = changes(source, c.source)
    assert removed == [
        "def matmul_kernel(a, b, c, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int], TILE_K: ct.Constant[int]):",
        "    bid_m = ct.bid(0)", "    bid_n = ct.bid(1)",
        "    ct.launch(torch.cuda.current_stream(), grid, matmul_kernel, (a, b, out, TILE_M, TILE_N, TILE_K))"]
    assert added == [
        "GROUP_SIZE_M = 8",
        "def matmul_kernel(a, b, c, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int], TILE_K: ct.Constant[int], "
        "GROUP_SIZE_M: ct.Constant[int]):",
        "    # grouped ordering: GROUP_SIZE_M tile rows at a time share their A and B panels in L2",
        "    num_bid_m = ct.num_blocks(0)",
        "    num_bid_n = ct.num_blocks(1)",
        "    bid = ct.bid(1) * num_bid_m + ct.bid(0)  # launch order: axis 0 fastest",
        "    num_bid_in_group = GROUP_SIZE_M * num_bid_n",
        "    group_id = bid // num_bid_in_group",
        "    first_bid_m = group_id * GROUP_SIZE_M",
        "    group_size_m = min(num_bid_m - first_bid_m, GROUP_SIZE_M)",
        "    bid_m = first_bid_m + (bid % num_bid_in_group) % group_size_m",
        "    bid_n = (bid % num_bid_in_group) // group_size_m",
        "    ct.launch(torch.cuda.current_stream(), grid, matmul_kernel, "
        "(a, b, out, TILE_M, TILE_N, TILE_K, GROUP_SIZE_M))"]
    assert cands("cutile-grouped", c.source) == []
    assert reason("cutile-grouped", c.source) == "GROUP_SIZE_M is already defined"


def test_grouped_and_persistent_compose_in_either_order():
    persistent = one("cutile-persistent", src("matmul")).source
    removed, added = changes(persistent, one("cutile-grouped", persistent).source)
    assert "        bid_m = work_id % grid_0" in removed and "        bid_n = work_id // grid_0" in removed
    assert "        num_bid_in_group = GROUP_SIZE_M * grid_1" in added
    assert "        group_size_m = min(grid_0 - first_bid_m, GROUP_SIZE_M)" in added
    grouped = one("cutile-grouped", src("matmul")).source
    both = one("cutile-persistent", grouped, "cutile-persistent:matmul_kernel").source
    assert "        bid = work_id  # launch order: axis 0 fastest" in both  # the linearisation is the work id
    assert "        num_bid_m = grid_0" in both and "ct.bid(1)" not in both


# --------------------------------------------------------------------------- cutile-tf32


def test_tf32_matmul_exact_lines_and_tier():
    source = src("matmul")
    c = one("cutile-tf32", source)
    assert (c.kind, c.key, c.tier) == ("tf32", "cutile-tf32:matmul_kernel", 1)
    assert "spec's DTYPES has float32" in c.hypothesis and "tolerance" in c.hypothesis
    assert changes(source, c.source) == (["        acc = ct.mma(at, bt, acc)"], [
        "    # TF32 tensor cores for fp32 inputs; fp16/bf16 keep their type",
        "    a_mma_dtype = ct.tfloat32 if a.dtype == ct.float32 else a.dtype",
        "    b_mma_dtype = ct.tfloat32 if b.dtype == ct.float32 else b.dtype",
        "        acc = ct.mma(ct.astype(at, a_mma_dtype), ct.astype(bt, b_mma_dtype), acc)"])
    assert reason("cutile-tf32", c.source) == "matmul_kernel already uses ct.tfloat32"


def test_tf32_attention_traces_operands_through_reshapes_and_casts():
    source = src("attention")
    removed, added = changes(source, one("cutile-tf32", source).source)
    assert added[1:4] == [f"    {a}_mma_dtype = ct.tfloat32 if {a}.dtype == ct.float32 else {a}.dtype" for a in "qkv"]
    assert "        acc = ct.mma(ct.astype(p, q_mma_dtype), ct.astype(vt, v_mma_dtype), acc * alpha)" in added
    assert "        acc = ct.mma(ct.astype(p, q.dtype), vt, acc * alpha)" in removed


def test_tf32_skips_operands_it_cannot_trace():
    source = src("matmul").replace("acc = ct.mma(at, bt, acc)", "acc = ct.mma(at * 2, bt, acc)")
    assert cands("cutile-tf32", source) == []
    assert reason("cutile-tf32", source) == "matmul_kernel: cannot tell which array the MMA operand `at * 2` comes from"


def test_tf32_is_tried_after_every_first_line_move(monkeypatch):
    from playbook import base, recipe

    base.recipes()
    mine = ("cutile-hint", "cutile-persistent", "cutile-grouped", "cutile-tf32")
    monkeypatch.setattr(recipe, "_REGISTRY", {rid: recipe._REGISTRY[rid] for rid in mine})
    source = src("matmul")
    an = analyze(source)
    tried, kinds = [], []
    while (c := next_candidate(source, an, tried, [])) is not None:
        tried.append(c.key)
        kinds.append(c.kind)
    assert kinds[-1] == "tf32" and kinds.count("tf32") == 1  # the only tier-1 candidate: after every other one
    assert kinds.index("block") < kinds.index("grouped-ordering") < kinds.index("persistent")


# --------------------------------------------------------------------------- cutile-gather-to-tma

GATHER_ADD = '''\
"""vector_add in cuTile with gathers: element indices built per block."""

import cuda.tile as ct
import torch

TILE = 128


@ct.kernel
def add_kernel(x, y, out, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    offs = bid * TILE + ct.arange(TILE, dtype=ct.int32)
    a = ct.gather(x, offs)
    b = ct.gather(y, (offs,), padding_value=0, latency=2)
    ct.scatter(out, offs, a + b)


def run(x, y, out):
    n = out.numel()
    ct.launch(torch.cuda.current_stream(), (ct.cdiv(n, TILE), 1, 1), add_kernel, (x, y, out, TILE))
    return out
'''


def test_gather_to_tma_exact_and_equal_to_the_reference_loads():
    c = one("cutile-gather-to-tma", GATHER_ADD)
    assert (c.kind, c.key, c.title) == ("tma", "cutile-gather-to-tma:tma",
                                        "3 contiguous ct.gather/ct.scatter as ct.load/ct.store (x, y, out)")
    assert changes(GATHER_ADD, c.source) == ([
        "    offs = bid * TILE + ct.arange(TILE, dtype=ct.int32)",
        "    a = ct.gather(x, offs)",
        "    b = ct.gather(y, (offs,), padding_value=0, latency=2)",
        "    ct.scatter(out, offs, a + b)"], [
        "    a = ct.load(x, index=(bid,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)",
        "    b = ct.load(y, index=(bid,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO, latency=2)",
        "    ct.store(out, index=(bid,), tile=a + b)"])
    # the reference vector_add, written with loads from the start, is the same kernel
    reference = [re.sub(r", padding_mode=ct\.PaddingMode\.ZERO|, latency=2", "", line)
                 for line in changes(GATHER_ADD, c.source)[1]]
    assert all(line in src("vector_add").splitlines() for line in reference)
    assert cands("cutile-gather-to-tma", c.source) == []


def test_gather_to_tma_keeps_an_index_that_is_still_read_and_maps_padding_values():
    source = GATHER_ADD.replace("    ct.scatter(out, offs, a + b)\n",
                                "    ct.scatter(out, offs, ct.where(offs < 7, a + b, -a))\n")
    source = source.replace("ct.gather(x, offs)", "ct.gather(x, offs, padding_value=-math.inf)")
    c = one("cutile-gather-to-tma", source)
    assert "    offs = bid * TILE + ct.arange(TILE, dtype=ct.int32)" in c.source
    assert "padding_mode=ct.PaddingMode.NEG_INF" in c.source


def gather_kernel(*body: str) -> str:
    """A module with one 1-D kernel whose body (after `bid = ct.bid(0)`) is `body`."""
    lines = "".join(f"    {line}\n" for line in body)
    return ("import math\n\nimport cuda.tile as ct\n\n\n@ct.kernel\n"
            f"def k(x, out, TILE: ct.Constant[int]):\n    bid = ct.bid(0)\n{lines}")


OFFS = "offs = bid * TILE + ct.arange(TILE, dtype=ct.int32)"


@pytest.mark.parametrize("body,why", [
    ((OFFS, "a = ct.gather(x, offs, mask=offs < 5)"),
     "k: ct.gather with mask (a mask changes which elements move)"),
    (("offs = bid * TILE + ct.arange(TILE, dtype=ct.int32, start=1)", "ct.scatter(out, offs, 0.5)"),
     "k: the index of ct.scatter(out, ...) is not `block * TILE + ct.arange(TILE)`"),
    (("offs = bid * 64 + ct.arange(TILE, dtype=ct.int32)", "a = ct.gather(x, offs)"),
     "k: the index of ct.gather(x, ...) is not `block * TILE + ct.arange(TILE)`"),
    ((OFFS, "a = ct.gather(x, offs, padding_value=1.5)"), "k: padding_value=1.5 has no ct.PaddingMode"),
    ((OFFS, "ct.scatter(out, offs, 0)"), "k: ct.scatter of a scalar: ct.store needs a tile of the index's shape"),
    ((OFFS, "a = ct.gather(x, (bid, offs))"), "k: ct.gather with a 2-D index: only 1-D contiguous tiles are rewritten"),
    (("offs = ct.arange(TILE, dtype=ct.int32)", "offs = offs + bid * TILE", "a = ct.gather(x, offs)"),
     "k: the index `offs` of ct.gather is not assigned exactly once"),
])
def test_gather_to_tma_skips_what_it_cannot_prove(body, why):
    source = gather_kernel(*body)
    compile(source, "<test>", "exec")
    assert cands("cutile-gather-to-tma", source) == []
    assert reason("cutile-gather-to-tma", source) == why


def test_gather_to_tma_rewrites_the_calls_it_can_prove_and_leaves_the_others():
    source = gather_kernel(OFFS, "a = ct.gather(x, offs, mask=offs < 5)", "ct.scatter(out, offs, a)")
    removed, added = changes(source, one("cutile-gather-to-tma", source).source)
    assert (removed, added) == (["    ct.scatter(out, offs, a)"], ["    ct.store(out, index=(bid,), tile=a)"])
    nested = gather_kernel(OFFS, "ct.scatter(out, offs, ct.gather(x, offs) * 2)")
    assert changes(nested, one("cutile-gather-to-tma", nested).source)[1] == [
        "    ct.store(out, index=(bid,), tile=ct.load(x, index=(bid,), shape=(TILE,), "
        "padding_mode=ct.PaddingMode.ZERO) * 2)"]


# --------------------------------------------------------------------------- schedule replay (CPU)


class _Tile:
    """An opaque tile: every operation on it gives another tile."""

    def __getattr__(self, name):
        return lambda *a, **k: _Tile()

    def __getitem__(self, key):
        return _Tile()

    def _op(self, *other):
        return _Tile()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _op
    __floordiv__ = __mod__ = __pow__ = __and__ = __rand__ = __or__ = __ror__ = _op
    __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __invert__ = _op


class _RecordingCt(types.SimpleNamespace):
    """The parts of cuda.tile that decide which tiles a block touches are real; the rest is opaque."""

    def __init__(self, real, names):
        super().__init__(PaddingMode=real.PaddingMode, RoundingMode=real.RoundingMode)
        self.names, self.block, self.grid, self.events = names, (0, 0, 0), (1, 1, 1), []

    def __getattr__(self, name):  # ct.exp, ct.full, ct.float32, ...
        return lambda *a, **k: _Tile()

    def bid(self, axis):
        return self.block[axis]

    def num_blocks(self, axis):
        return self.grid[axis]

    def cdiv(self, a, b):
        return -(-a // b)

    def num_tiles(self, array, axis, shape, order="C"):
        return -(-array.shape[axis] // shape[axis])

    def load(self, array, index, shape, **kwargs):
        self.events.append(("load", self.names[id(array)], tuple(index), tuple(shape)))
        return _Tile()

    def store(self, array, index, tile, **kwargs):
        self.events.append(("store", self.names[id(array)], tuple(index)))


def replay(source: str, op: str, shape, tmp_path: Path, monkeypatch, sms: int = 3) -> tuple[list, tuple]:
    """(events in launch order, grid) of `source` run on the spec's inputs for `shape`, block by block."""
    import cuda.tile as ct
    import torch

    path = tmp_path / f"replay_{abs(hash(source))}.py"
    path.write_text(source)
    spec = _load(KERNELS / op / "spec.py", "replay_spec")
    module = _load(path, path.stem)
    launches = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: launches.append((grid, kernel, args)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    props = types.SimpleNamespace(multi_processor_count=sms)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    module.run(**spec.make_inputs(tuple(shape), getattr(torch, spec.DTYPES[0]), 0, device="cpu"))
    (grid, kernel, args), = launches
    pyfunc = kernel._annotated_function.pyfunc
    params = list(pyfunc.__code__.co_varnames[:pyfunc.__code__.co_argcount])
    fake = _RecordingCt(ct, {id(a): p for p, a in zip(params, args)})
    fn = types.FunctionType(pyfunc.__code__, {**pyfunc.__globals__, "ct": fake}, pyfunc.__name__)
    grid = tuple(grid) + (1,) * (3 - len(grid))
    fake.grid = grid
    for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):  # axis 0 fastest
        fake.block = (x, y, z)
        fn(*args)
    return fake.events, grid


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shapes(op: str) -> list:
    return list(_load(KERNELS / op / "spec.py", "shapes_spec").CORRECTNESS_SHAPES)


@pytest.mark.parametrize("op", CUTILE_OPS)
def test_persistent_replays_the_same_tiles_with_fewer_blocks(op, tmp_path, monkeypatch):
    after = one("cutile-persistent", src(op)).source
    looped = False
    for shape in _shapes(op):
        before_events, before_grid = replay(src(op), op, shape, tmp_path, monkeypatch)
        after_events, after_grid = replay(after, op, shape, tmp_path, monkeypatch)
        work = before_grid[0] * before_grid[1] * before_grid[2]
        assert after_grid == (min(work, 3), 1, 1), shape
        assert any(e[0] == "store" for e in before_events)
        assert Counter(after_events) == Counter(before_events), shape
        looped |= work > 3
    assert looped  # some shape has more work than blocks: the loop really iterates


def _stored_tiles(events: list) -> list:
    return [e[2] for e in events if e[0] == "store"]


def test_grouped_replays_the_same_tiles_in_a_different_order(tmp_path, monkeypatch):
    shape = (1000, 300, 96)  # 16 x 5 tiles of 64 x 64: two groups of 8 tile rows
    base = src("matmul")
    before, _ = replay(base, "matmul", shape, tmp_path, monkeypatch)
    grouped, _ = replay(one("cutile-grouped", base).source, "matmul", shape, tmp_path, monkeypatch)
    assert Counter(grouped) == Counter(before)
    tiles = _stored_tiles(grouped)
    assert _stored_tiles(before)[:9] == [(m, 0) for m in range(9)]  # launch order: down the first column
    assert tiles[:9] == [(m, 0) for m in range(8)] + [(0, 1)]  # 8 tile rows, then the next column
    assert set(tiles[:40]) == {(m, n) for m in range(8) for n in range(5)}  # one group: 8 rows x all 5 columns
    persistent = one("cutile-persistent", base).source
    for source in (one("cutile-grouped", persistent).source,
                   one("cutile-persistent", one("cutile-grouped", base).source,
                       "cutile-persistent:matmul_kernel").source):
        after, grid = replay(source, "matmul", shape, tmp_path, monkeypatch, sms=7)
        assert grid == (7, 1, 1) and Counter(after) == Counter(before)


def test_the_replay_catches_a_mapping_that_is_not_a_bijection(tmp_path, monkeypatch):
    after = one("cutile-persistent", src("matmul")).source
    broken = after.replace("bid_n = work_id // grid_0", "bid_n = work_id // grid_1")
    assert broken != after
    shape = (300, 200, 64)  # 5 x 4 tiles: grid_0 != grid_1
    before, _ = replay(src("matmul"), "matmul", shape, tmp_path, monkeypatch)
    wrong, _ = replay(broken, "matmul", shape, tmp_path, monkeypatch)
    assert Counter(wrong) != Counter(before)


# --------------------------------------------------------------------------- ahead of time (slow)


def compiles(target: Path, capsys) -> None:
    rc = main(["compile", str(target), "--arch", "sm_90,sm_100", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"], [k.get("error") for k in out["kernels"] if not k.get("ok")]
    assert {r["arch"] for r in out["kernels"]} == {"sm_90", "sm_100"} and all(r["ok"] for r in out["kernels"])


def _persistent_then_grouped(source: str) -> str:
    return one("cutile-grouped", one("cutile-persistent", source).source).source


AOT_CASES = [  # (case, op, rewrite of the reference source)
    ("persistent-1d", "softmax", lambda s: one("cutile-persistent", s).source),
    ("persistent-1d-loop", "row_sum", lambda s: one("cutile-persistent", s).source),
    ("persistent-2d", "silu_mul", lambda s: one("cutile-persistent", s).source),
    ("grouped", "matmul", lambda s: one("cutile-grouped", s).source),
    ("persistent+grouped", "matmul", _persistent_then_grouped),
    ("tf32", "attention", lambda s: one("cutile-tf32", s).source),
    ("gather", "vector_add", lambda s: GATHER_ADD),
    ("gather-to-tma", "vector_add", lambda s: one("cutile-gather-to-tma", GATHER_ADD).source),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,op,rewrite", AOT_CASES, ids=[c[0] for c in AOT_CASES])
def test_rewrite_compiles_ahead_of_time_for_hopper_and_blackwell(case, op, rewrite, tmp_path, env, capsys):
    compiles(materialise(tmp_path, op, "cutile", rewrite(src(op))), capsys)


def _sass(torch, path: Path, dtype, cap: int = 90) -> list[str]:
    """The SASS of the matmul target at `path` for `dtype`, addresses stripped."""
    import cuda.tile as ct
    from cuda.tile.compilation import export_kernel

    from loop.worker import aot

    module = _load(path, f"sass_{path.parent.name}_{dtype}".replace(".", "_"))
    a, b = torch.randn(129, 65, dtype=dtype), torch.randn(65, 257, dtype=dtype)
    launches = []
    with aot._patched(ct, "launch", lambda s, g, k, args, **kw: launches.append((k, tuple(args)))), \
            aot.fake_cuda(torch, cap):
        module.run(a, b, torch.empty(129, 257, dtype=dtype))
    (kernel, args), = launches
    buf = io.BytesIO()
    signature = aot._cutile_signature(torch, kernel, args)
    export_kernel(kernel, [signature], buf, gpu_code=f"sm_{cap}", output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(buf.getvalue())
        fh.flush()
        text = subprocess.run([aot.cuobjdump(), "-sass", fh.name], capture_output=True, text=True, check=True).stdout
    return [re.sub(r"/\*[0-9a-f]{4}\*/", "", line).strip() for line in text.splitlines()
            if re.search(r"/\*[0-9a-f]{4}\*/", line)]


@pytest.mark.slow
def test_tf32_guard_changes_fp32_code_only(tmp_path, env, capsys):
    torch = pytest.importorskip("torch")
    from loop.worker import aot

    if aot.cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    before = materialise(tmp_path / "before", "matmul", "cutile", src("matmul"), DTYPES=["float16", "float32"])
    after = materialise(tmp_path / "after", "matmul", "cutile", one("cutile-tf32", src("matmul")).source,
                        DTYPES=["float16", "float32"])
    compiles(after, capsys)  # fp16 and fp32, sm_90 and sm_100
    assert _sass(torch, before, torch.float16) == _sass(torch, after, torch.float16)
    fp32_before, fp32_after = _sass(torch, before, torch.float32), _sass(torch, after, torch.float32)
    assert not any(".TF32" in line for line in fp32_before)
    assert any("MMA" in line and ".TF32" in line for line in fp32_after)
