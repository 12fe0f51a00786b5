"""Whether a change can show in a timing mode: the kinds of differences between two sources
(loop.target.change), and the pure decision over them (loop.decide.measurable), then its place in
decide() and the stop rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.decide import Change, Policy, Progress, decide, measurability, stop_state
from loop.decide.measurable import KINDS, MODES
from loop.target.change import describe

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
VECTOR_ADD = (KERNELS / "vector_add" / "vector_add_triton.py").read_text()
MATMUL = (KERNELS / "matmul" / "matmul_triton.py").read_text()

AUTOTUNED = '''
import triton
import triton.language as tl

CONFIGS = [
    triton.Config({"BLOCK": 128}, num_warps=1),
    triton.Config({"BLOCK": 256}, num_warps=4),
]


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def run(x, y, out):
    n = out.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out
'''


def edit(src: str, old: str, new: str) -> str:
    assert old in src, old
    return src.replace(old, new)


def kinds(before: str, after: str, recipe_kind: str = "") -> list[str]:
    return sorted(describe(before, after, recipe_kind).kinds)


def candidate(recipe_id: str, src: str, key_part: str = ""):
    from playbook import recipes
    from playbook.analysis import analyze

    recipe = next(r for r in recipes() if r.id == recipe_id)
    return next(c for c in recipe.candidates(src, analyze(src)) if key_part in c.key)


# ----------------------------------------------------------------------------- the kinds of a change, from the sources


@pytest.mark.parametrize("old, new", [
    ("BLOCK = 128", "BLOCK = 128  # a comment"),
    ('"""vector_add, first version', '"""vector_add, the first version'),
    ("NUM_WARPS", "WARPS"),  # a constant renamed everywhere: nothing that runs differs
    ("import triton\n", "import triton\nimport functools\n"),  # an import nothing reads
])
def test_formatting_changes_are_formatting(old, new):
    after = VECTOR_ADD.replace(old, new)
    assert after != VECTOR_ADD
    assert kinds(VECTOR_ADD, after) == ["formatting"]


def test_a_launch_setting_through_a_module_constant_is_a_launch_change():
    change = describe(VECTOR_ADD, edit(VECTOR_ADD, "NUM_WARPS = 1", "NUM_WARPS = 4"))
    assert sorted(change.kinds) == ["launch"] and change.details == ("num_warps",)
    change = describe(MATMUL, edit(MATMUL, "NUM_STAGES = 2", "NUM_STAGES = 3"))
    assert sorted(change.kinds) == ["launch"] and change.details == ("num_stages",)
    written = edit(VECTOR_ADD, "num_warps=NUM_WARPS)", "num_warps=NUM_WARPS, num_stages=3)")
    assert describe(VECTOR_ADD, written).details == ("num_stages",)


def test_a_block_size_or_an_operator_is_computed_code():
    assert kinds(VECTOR_ADD, edit(VECTOR_ADD, "BLOCK = 128", "BLOCK = 1024")) == ["code"]
    assert kinds(VECTOR_ADD, edit(VECTOR_ADD, "x + y", "x - y")) == ["code"]
    both = edit(edit(VECTOR_ADD, "BLOCK = 128", "BLOCK = 1024"), "NUM_WARPS = 1", "NUM_WARPS = 4")
    assert kinds(VECTOR_ADD, both) == ["code"]  # code and a launch setting: the code decides that it can show
    assert kinds(VECTOR_ADD, VECTOR_ADD + "\ndef broken(:\n") == ["code"]  # does not parse: nothing to tell
    assert kinds(VECTOR_ADD, VECTOR_ADD) == []  # identical: an A/A check


def test_cache_hints_are_cache_hints():
    after = edit(VECTOR_ADD, "x = tl.load(x_ptr + offs, mask=mask)",
                 "x = tl.load(x_ptr + offs, mask=mask, cache_modifier='.cg')")
    change = describe(VECTOR_ADD, after)
    assert sorted(change.kinds) == ["cache_hint"] and change.details == ("cache_modifier",)
    c = candidate("eviction-policy", VECTOR_ADD)
    assert describe(VECTOR_ADD, c.source).details == ("eviction_policy",)


def test_autotune_configs_beyond_the_first_and_the_first_config():
    beyond = edit(AUTOTUNED, '{"BLOCK": 256}, num_warps=4', '{"BLOCK": 512}, num_warps=8')
    assert kinds(AUTOTUNED, beyond) == ["autotune_configs"]
    added = edit(AUTOTUNED, "num_warps=4),\n]", "num_warps=4),\n    triton.Config({\"BLOCK\": 1024}, num_warps=8),\n]")
    assert kinds(AUTOTUNED, added) == ["autotune_configs"]
    first_block = edit(AUTOTUNED, '{"BLOCK": 128}, num_warps=1', '{"BLOCK": 64}, num_warps=1')
    assert kinds(AUTOTUNED, first_block) == ["code"]  # the interpreter runs the first config: its block size shows
    first_warps = edit(AUTOTUNED, '{"BLOCK": 128}, num_warps=1', '{"BLOCK": 128}, num_warps=2')
    assert kinds(AUTOTUNED, first_warps) == ["launch"]


def test_the_autotune_recipe_whose_first_config_is_the_current_launch():
    c = candidate("triton-autotune", VECTOR_ADD)  # a comprehension whose first config is BLOCK=128, num_warps=1
    assert kinds(VECTOR_ADD, c.source) == ["autotune_configs"]
    other_first = VECTOR_ADD.replace("BLOCK = 128", "BLOCK = 64")  # now its first config changes the block
    assert kinds(other_first, c.source) == ["code"]


def test_a_persistent_rewrite_is_found_from_the_source_alone():
    c = candidate("triton-persistent", VECTOR_ADD)
    assert kinds(VECTOR_ADD, c.source) == ["persistent"]  # no recipe kind given: the diff decides
    assert kinds(VECTOR_ADD, c.source.replace("x + y", "x * y")) == ["code", "persistent"]
    step = candidate("triton-persistent", c.source)  # its programs-per-SM step, on the persistent version
    assert kinds(c.source, step.source) == ["persistent"]
    assert kinds(MATMUL, candidate("triton-persistent", MATMUL).source) == ["code", "persistent"]


def test_a_recipe_kind_may_add_what_the_diff_does_not_show():
    after = edit(VECTOR_ADD, "BLOCK = 128", "BLOCK = 256")
    assert describe(VECTOR_ADD, after, "persistent").kinds == {"code", "persistent"}
    assert describe(VECTOR_ADD, after, "num_warps").kinds == {"code"}  # the source says it is code


# ----------------------------------------------------------------------------- which kinds can show where


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_the_table_of_kinds_and_modes(kind, mode):
    m = measurability(Change(frozenset({kind})), mode)
    expected = kind == "code" or (kind != "formatting" and mode != "interpreter")
    assert m.measurable is expected
    assert m.mode == mode and m.kinds == [kind]
    mode_words = {"interpreter": "interpreter", "gpu": "GPU", "harness": "bench command"}[mode]
    assert mode_words in m.reason
    if not expected:
        assert "cannot show" in m.reason


def test_reasons_name_the_settings_and_mixed_changes():
    m = measurability(Change(frozenset({"launch"}), ("num_warps",)), "interpreter")
    assert not m.measurable and "launch settings (num_warps)" in m.reason and "interpreter" in m.reason
    mixed = measurability(Change(frozenset({"code", "launch"}), ("num_warps",)), "interpreter")
    assert mixed.measurable and "not its part in launch settings" in mixed.reason
    # a persistent grid distorts interpreter timings even beside computed code
    assert not measurability(Change(frozenset({"code", "persistent"})), "interpreter").measurable
    assert measurability(Change(frozenset({"code", "persistent"})), "gpu").measurable
    assert measurability(Change(frozenset()), "interpreter").measurable  # A/A: timed on purpose
    with pytest.raises(ValueError, match="unknown timing mode"):
        measurability(Change(frozenset()), "cpu")
    with pytest.raises(ValueError, match="unknown change kind"):
        Change(frozenset({"warps"}))


# ----------------------------------------------------------------------------- in the decision and the stop rules


def test_decide_unmeasured_after_correctness_and_coverage():
    why = "a change to launch settings cannot show in Triton interpreter timings"
    d = decide(Policy(), unmeasurable=why)
    assert (d.action, d.verdict, d.reason, d.speedup) == ("unmeasured", "unmeasured", why, None)
    assert decide(Policy(), failure="incorrect", unmeasurable=why).action == "revert"  # a wrong change is still wrong
    assert decide(Policy(), failure="compile_error", unmeasurable=why).action == "crash"
    assert decide(Policy(), unexercised=["bwd"], unmeasurable=why).verdict == "unexercised"
    assert decide(Policy(), guard_failures=["ptx: incorrect"], unmeasurable=why).verdict == "guard_failed"


def test_unmeasured_iterations_are_not_counted_by_the_no_gain_rule():
    p = Progress(iterations=4, elapsed_s=1.0, outcomes=("keep", "revert", "unmeasured", "unmeasured"),
                 last_verdict="within_noise", timing="interpreter")
    assert stop_state(Policy(), p).state == "continue"
    p = Progress(iterations=3, elapsed_s=1.0, outcomes=("revert", "unmeasured", "revert"), last_verdict="within_noise",
                 timing="interpreter")
    s = stop_state(Policy(), p)
    assert s.state == "stop" and "no improvement in 2" in s.reason and "interpreter timings" in s.reason
    assert s.timing == "interpreter" and s.to_json()["timing"] == "interpreter"
    crashes = Progress(iterations=3, elapsed_s=1.0, outcomes=("crash", "unmeasured", "crash"), crash_causes=("oom", "oom"))
    assert stop_state(Policy(), crashes).state == "escalate"
    gpu = stop_state(Policy(), Progress(iterations=2, elapsed_s=1.0, outcomes=("revert", "revert"), timing="gpu"))
    assert gpu.state == "stop" and "interpreter" not in gpu.reason and gpu.timing == "gpu"
    limit = stop_state(Policy(max_iters=2), Progress(iterations=2, elapsed_s=1.0, outcomes=("unmeasured", "unmeasured")))
    assert limit.state == "stop" and limit.reason == "reached 2 iterations"  # they still count as iterations
    cpu = stop_state(Policy(max_iters=2), Progress(iterations=2, elapsed_s=1.0, outcomes=("unmeasured",) * 2,
                                                    timing="interpreter"))
    assert cpu.reason == "reached 2 iterations (a run on Triton interpreter timings of the CPU, not GPU timings)"
