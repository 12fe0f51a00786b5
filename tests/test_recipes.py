"""Golden tests for the playbook recipes: the exact source each candidate proposes, the
candidate's kind/key/title, limits, candidate order, and the recipe registry."""

from __future__ import annotations

from pathlib import Path

import pytest

import playbook
from loop.common.errors import UserError
from playbook import next_candidate
from playbook.analysis import analyze

REPO_ROOT = Path(__file__).resolve().parent.parent
VECTOR_ADD_TRITON = REPO_ROOT / "kernels" / "vector_add" / "vector_add_triton.py"
VECTOR_ADD_CUTILE = REPO_ROOT / "kernels" / "vector_add" / "vector_add_cutile.py"
SOFTMAX_CUTILE = REPO_ROOT / "kernels" / "softmax" / "softmax_cutile.py"


def candidates(recipe_id: str, source: str):
    return playbook.get(recipe_id).candidates(source, analyze(source))


def by_kind(cands) -> dict:
    """The step-up candidate of each kind (launch-param lists step-ups first, then step-downs)."""
    out = {}
    for c in cands:
        out.setdefault(c.kind, c)
    return out


def one_line_changed(source: str, old_line: str, new_line: str) -> str:
    """`source` with the single line equal to `old_line` replaced by `new_line`."""
    lines = source.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip("\n") == old_line]
    assert len(hits) == 1, f"{old_line!r} occurs {len(hits)} times"
    lines[hits[0]] = new_line + "\n"
    return "".join(lines)


def changed_lines(a: str, b: str) -> list[tuple[str, str]]:
    la, lb = a.splitlines(), b.splitlines()
    assert len(la) == len(lb)
    return [(x, y) for x, y in zip(la, lb) if x != y]


# --------------------------------------------------------------------------- launch-param


def test_launch_param_on_vector_add_triton():
    source = VECTOR_ADD_TRITON.read_text()
    cands = by_kind(candidates("launch-param", source))
    assert set(cands) == {"block", "num_warps"}

    block = cands["block"]
    assert block.source == one_line_changed(source, "BLOCK = 128", "BLOCK = 256")
    assert changed_lines(source, block.source) == [("BLOCK = 128", "BLOCK = 256")]
    assert (block.recipe, block.key, block.title) == ("launch-param", "launch-param:BLOCK=256", "BLOCK 128 -> 256")
    assert "128 -> 256" in block.hypothesis

    warps = cands["num_warps"]
    assert warps.source == one_line_changed(source, "NUM_WARPS = 1", "NUM_WARPS = 2")
    assert (warps.key, warps.title) == ("launch-param:num_warps=2", "NUM_WARPS 1 -> 2")


def test_launch_param_changes_the_constant_not_its_uses():
    source = VECTOR_ADD_TRITON.read_text()
    block = by_kind(candidates("launch-param", source))["block"]
    # the grid, the launch keyword and the constexpr parameter all still read BLOCK
    for text in ("triton.cdiv(n, BLOCK)", "BLOCK=BLOCK", "BLOCK: tl.constexpr", "num_warps=NUM_WARPS"):
        assert source.count(text) == block.source.count(text) == 1


LITERAL = """\
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr, N_COLS: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def run(x, out):
    n = out.numel()
    k[(triton.cdiv(n, {BLOCK}),)](x, out, n, BLOCK={BLOCK}, N_COLS=1000, num_warps={WARPS},  # keep me
                                  num_stages={STAGES})
    return out
"""


def literal(block=1024, warps=4, stages=2) -> str:
    return LITERAL.replace("{BLOCK}", str(block)).replace("{WARPS}", str(warps)).replace("{STAGES}", str(stages))


def test_launch_param_rewrites_literals_in_place():
    source = literal()
    cands = by_kind(candidates("launch-param", source))
    assert set(cands) == {"block", "num_warps", "num_stages"}  # N_COLS=1000 is not a power of two

    launch = "    k[(triton.cdiv(n, 1024),)](x, out, n, BLOCK={b}, N_COLS=1000, num_warps={w},  # keep me"
    assert cands["block"].source == one_line_changed(source, launch.format(b=1024, w=4), launch.format(b=2048, w=4))
    assert cands["block"].title == "BLOCK 1024 -> 2048" and cands["block"].key == "launch-param:BLOCK=2048"
    assert cands["num_warps"].source == one_line_changed(source, launch.format(b=1024, w=4), launch.format(b=1024, w=8))
    assert cands["num_warps"].title == "num_warps 4 -> 8"
    stages = "                                  num_stages={s})"
    assert cands["num_stages"].source == one_line_changed(source, stages.format(s=2), stages.format(s=3))
    assert (cands["num_stages"].title, cands["num_stages"].key) == ("num_stages 2 -> 3", "launch-param:num_stages=3")


def test_launch_param_values_at_their_limits_give_no_step_up():
    cands = candidates("launch-param", literal(block=16384, warps=16, stages=5))
    assert sorted(c.title for c in cands if c.tier < 2) == ["BLOCK 16384 -> 8192", "num_stages 5 -> 4", "num_warps 16 -> 8"]
    # the two-step moves go down only, never past a limit
    assert sorted(c.title for c in cands if c.tier == 2) == ["BLOCK 16384 -> 4096", "num_stages 5 -> 3", "num_warps 16 -> 4"]


def test_launch_param_two_step_moves_come_after_every_one_step_move():
    cands = candidates("launch-param", literal(block=256, warps=2, stages=2))
    tiers = {c.title: c.tier for c in cands}
    assert tiers["BLOCK 256 -> 512"] == 0 and tiers["BLOCK 256 -> 128"] == 1
    assert {t for t, tier in tiers.items() if tier == 2} == {
        "BLOCK 256 -> 1024", "BLOCK 256 -> 64", "num_warps 2 -> 8", "num_stages 2 -> 4"}  # 2 // 4 = 0 warps, 0 stages: none
    assert all("two-step move" in c.hypothesis for c in cands if c.tier == 2)


def test_launch_param_one_below_the_limits():
    cands = by_kind(candidates("launch-param", literal(block=8192, warps=8, stages=4)))
    assert (cands["block"].title, cands["num_warps"].title, cands["num_stages"].title) == (
        "BLOCK 8192 -> 16384", "num_warps 8 -> 16", "num_stages 4 -> 5")


def test_launch_param_constants_at_their_limits_give_no_step_up():
    source = VECTOR_ADD_TRITON.read_text()
    source = one_line_changed(source, "BLOCK = 128", "BLOCK = 16384")
    source = one_line_changed(source, "NUM_WARPS = 1", "NUM_WARPS = 16")
    assert sorted(c.title for c in candidates("launch-param", source) if c.tier < 2) == ["BLOCK 16384 -> 8192", "NUM_WARPS 16 -> 8"]


def test_launch_param_does_not_apply_to_cutile():
    source = VECTOR_ADD_CUTILE.read_text()
    assert not playbook.get("launch-param").applies(analyze(source))


def test_launch_param_literal_changes_only_the_launch_it_names():
    source = """\
import triton
import triton.language as tl


@triton.jit
def k1(x_ptr, BLOCK: tl.constexpr):
    pass


@triton.jit
def k2(x_ptr, BLOCK: tl.constexpr):
    pass


def run(x, out):
    k1[(1,)](x, BLOCK=128)
    k2[(1,)](out, BLOCK=64)
    return out
"""
    block = by_kind(candidates("launch-param", source))["block"]
    assert block.title == "BLOCK 128 -> 256"
    assert changed_lines(source, block.source) == [("    k1[(1,)](x, BLOCK=128)", "    k1[(1,)](x, BLOCK=256)")]


# --------------------------------------------------------------------------- cutile-hint


def test_cutile_hint_occupancy_on_softmax():
    source = SOFTMAX_CUTILE.read_text()
    cands = candidates("cutile-hint", source)
    assert len(cands) == 1  # no tile-size constant is passed to ct.launch
    (c,) = cands
    assert c.source == one_line_changed(source, "@ct.kernel", "@ct.kernel(occupancy=2)")
    assert (c.recipe, c.kind) == ("cutile-hint", "occupancy")
    assert c.key == "cutile-hint:softmax_kernel.occupancy=2"
    assert c.title == "softmax_kernel occupancy auto -> 2"


def test_cutile_hint_doubles_an_explicit_occupancy():
    source = one_line_changed(SOFTMAX_CUTILE.read_text(), "@ct.kernel", "@ct.kernel(occupancy=8)")
    (c,) = candidates("cutile-hint", source)
    assert c.source == one_line_changed(source, "@ct.kernel(occupancy=8)", "@ct.kernel(occupancy=16)")
    assert c.title == "softmax_kernel occupancy 8 -> 16"


def test_cutile_hint_at_occupancy_32_proposes_nothing():
    source = one_line_changed(SOFTMAX_CUTILE.read_text(), "@ct.kernel", "@ct.kernel(occupancy=32)")
    assert candidates("cutile-hint", source) == []


def test_cutile_hint_keeps_other_decorator_arguments():
    source = one_line_changed(SOFTMAX_CUTILE.read_text(), "@ct.kernel", "@ct.kernel(num_ctas=2)")
    (c,) = candidates("cutile-hint", source)
    assert c.source == one_line_changed(source, "@ct.kernel(num_ctas=2)", "@ct.kernel(num_ctas=2, occupancy=2)")


def test_cutile_hint_keeps_other_arguments_when_replacing_occupancy():
    source = one_line_changed(SOFTMAX_CUTILE.read_text(), "@ct.kernel", "@ct.kernel(occupancy=4, num_ctas=2)")
    (c,) = candidates("cutile-hint", source)
    ((old, new),) = changed_lines(source, c.source)
    assert new.startswith("@ct.kernel(") and "num_ctas=2" in new and "occupancy=8" in new and "occupancy=4" not in new


def test_cutile_hint_empty_call():
    source = one_line_changed(SOFTMAX_CUTILE.read_text(), "@ct.kernel", "@ct.kernel()")
    (c,) = candidates("cutile-hint", source)
    assert c.source == one_line_changed(source, "@ct.kernel()", "@ct.kernel(occupancy=2)")


def test_cutile_hint_non_literal_occupancy_is_left_alone():
    source = one_line_changed(SOFTMAX_CUTILE.read_text(), "@ct.kernel", "@ct.kernel(occupancy=OCC)")
    assert candidates("cutile-hint", source) == []


def test_cutile_hint_tile_constant_on_vector_add():
    source = VECTOR_ADD_CUTILE.read_text()
    cands = by_kind(candidates("cutile-hint", source))
    assert set(cands) == {"occupancy", "block"}
    tile = cands["block"]
    assert tile.source == one_line_changed(source, "TILE = 128", "TILE = 256")
    assert (tile.key, tile.title) == ("cutile-hint:TILE=256", "TILE 128 -> 256")
    assert cands["occupancy"].source == one_line_changed(source, "@ct.kernel", "@ct.kernel(occupancy=2)")


def test_cutile_hint_tile_constant_limit():
    source = one_line_changed(VECTOR_ADD_CUTILE.read_text(), "TILE = 128", "TILE = 4096")
    assert {c.kind for c in candidates("cutile-hint", source)} == {"occupancy"}
    source = one_line_changed(VECTOR_ADD_CUTILE.read_text(), "TILE = 128", "TILE = 2048")
    assert [c.title for c in candidates("cutile-hint", source) if c.kind == "block"] == ["TILE 2048 -> 4096"]


# --------------------------------------------------------------------------- next_candidate


@pytest.fixture(autouse=False)
def known_recipes(monkeypatch):
    """next_candidate over these two recipes only, so a recipe added to the playbook later does
    not change the expected order here."""
    from playbook import base, recipe

    base.recipes()  # registers every recipe
    monkeypatch.setattr(recipe, "_REGISTRY", {rid: recipe._REGISTRY[rid] for rid in ("launch-param", "cutile-hint")})


def test_next_candidate_follows_priority(known_recipes):
    source = VECTOR_ADD_TRITON.read_text()
    a = analyze(source)
    assert a.kernel_class == "element-wise"
    assert next_candidate(source, a, tried=[], demoted=[]).key == "launch-param:BLOCK=256"


def test_next_candidate_skips_tried_keys(known_recipes):
    source = VECTOR_ADD_TRITON.read_text()
    a = analyze(source)
    assert next_candidate(source, a, tried=["launch-param:BLOCK=256"], demoted=[]).key == "launch-param:num_warps=2"
    tried = ["launch-param:BLOCK=256", "launch-param:num_warps=2"]
    assert next_candidate(source, a, tried=tried, demoted=[]).key == "launch-param:BLOCK=64"  # second thoughts last
    tried.append("launch-param:BLOCK=64")
    wider = []  # then the two-step moves, block first (priority), until nothing is left
    while (c := next_candidate(source, a, tried=tried, demoted=[])) is not None:
        assert c.tier == 2
        wider.append(c.key)
        tried.append(c.key)
    assert wider == ["launch-param:BLOCK=512", "launch-param:BLOCK=32", "launch-param:num_warps=4"]


def test_next_candidate_puts_demoted_kinds_last(known_recipes):
    source = VECTOR_ADD_TRITON.read_text()
    a = analyze(source)
    assert next_candidate(source, a, tried=[], demoted=["block"]).key == "launch-param:num_warps=2"
    # demoted, not banned: still proposed once the others are tried
    tried = ["launch-param:num_warps=2", "launch-param:num_warps=4"]  # (4: the two-step move of the other kind)
    assert next_candidate(source, a, tried=tried, demoted=["block"]).key == "launch-param:BLOCK=256"


def test_next_candidate_cutile_tries_the_tile_step_before_occupancy(known_recipes):
    source = VECTOR_ADD_CUTILE.read_text()
    a = analyze(source)
    assert next_candidate(source, a, tried=[], demoted=[]).key == "cutile-hint:TILE=256"
    assert next_candidate(source, a, tried=[], demoted=["block"]).kind == "occupancy"
    assert next_candidate(source, a, tried=["cutile-hint:TILE=256"], demoted=[]).key == "cutile-hint:add_kernel.occupancy=2"


def test_next_candidate_only_uses_recipes_of_the_language(known_recipes):
    source = VECTOR_ADD_CUTILE.read_text()
    a = analyze(source)
    keys = []
    while (c := next_candidate(source, a, tried=keys, demoted=[])) is not None:
        keys.append(c.key)
    assert all(k.startswith("cutile-hint:") for k in keys) and len(keys) == 2


# --------------------------------------------------------------------------- registry


def test_get_unknown_recipe_lists_valid_ids():
    with pytest.raises(UserError) as info:
        playbook.get("nope")
    msg = info.value.message
    assert "'nope'" in msg
    for rid in ("launch-param", "cutile-hint"):
        assert rid in msg


def test_registry_ids():
    ids = {r.id for r in playbook.recipes()}
    assert {"launch-param", "cutile-hint"} <= ids
    assert playbook.get("launch-param").languages == ("triton",)
    assert playbook.get("cutile-hint").languages == ("cutile",)


def test_launch_param_steps_down_after_up_and_never_back_to_seen_values():
    from playbook.base import current_keys

    source = VECTOR_ADD_TRITON.read_text().replace("BLOCK = 128", "BLOCK = 512").replace("NUM_WARPS = 1", "NUM_WARPS = 4")
    keys = [c.key for c in candidates("launch-param", source)]
    assert keys.index("launch-param:BLOCK=1024") < keys.index("launch-param:BLOCK=256")
    assert keys.index("launch-param:num_warps=8") < keys.index("launch-param:num_warps=2")
    down = next(c for c in candidates("launch-param", source) if c.key == "launch-param:BLOCK=256")
    assert changed_lines(source, down.source) == [("BLOCK = 512", "BLOCK = 256")] and down.title == "BLOCK 512 -> 256"
    assert {"launch-param:BLOCK=512", "launch-param:num_warps=4"} <= set(current_keys(source))
    floor = VECTOR_ADD_TRITON.read_text().replace("BLOCK = 128", "BLOCK = 16")
    assert "launch-param:BLOCK=8" not in [c.key for c in candidates("launch-param", floor)]


def test_next_candidate_never_asks_skipped_recipes(known_recipes):
    source = VECTOR_ADD_TRITON.read_text()
    a = analyze(source)
    assert next_candidate(source, a, tried=[], demoted=[]).recipe == "launch-param"
    assert next_candidate(source, a, tried=[], demoted=[], skip=["launch-param"]) is None
