"""What a candidate's optimization and hypothesis say must be what its rewrite did: checked here
against the rewritten code itself, on the project's kernels and on Liger-Kernel's.

- triton-whole-row says the row is read once only where the twin loads each row buffer at one
  site (it said so for every twin, while rmsnorm's and layernorm's twins load the row twice);
- launch-param's step downs say fewer warps, smaller blocks, shallower pipelining (they said
  "more" both ways);
- triton-persistent names the setup statements it moved before the loop, and claims none where
  none moved.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from pathlib import Path

import pytest

import playbook
from playbook.analysis import analyze

REPO_ROOT = Path(__file__).resolve().parent.parent


def own(op: str) -> str:
    return (REPO_ROOT / "kernels" / op / f"{op}_triton.py").read_text()


def cands(rid: str, source: str):
    return playbook.get(rid).candidates(source, analyze(source))


def function(source: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)


def loads_of(fn: ast.FunctionDef, param: str) -> int:
    """The tl.load sites of `fn` whose address is computed from `param` (through local assignments)."""
    reads: dict[str, set[str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            names = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
            for target in node.targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        reads.setdefault(t.id, set()).update(names)
    derived, changed = {param}, True
    while changed:
        changed = False
        for name, used in reads.items():
            if name not in derived and used & derived:
                derived.add(name)
                changed = True
    return sum(1 for node in ast.walk(fn) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "load" and node.args
               and {n.id for n in ast.walk(node.args[0]) if isinstance(n, ast.Name)} & derived)


def added_lines(old: str, new: str) -> str:
    before = set(old.splitlines())
    return "\n".join(line for line in new.splitlines() if line not in before)


def check_whole_row_claims(source: str, kernel: str, row: str) -> int:
    (c,) = [c for c in cands("triton-whole-row", source) if c.key == f"triton-whole-row:{kernel}"]
    twin = function(c.source, f"{kernel}_row")
    n = loads_of(twin, row)
    assert n >= 1
    added = added_lines(source, c.source)
    if n == 1:
        assert "each row is loaded once" in c.hypothesis
        assert f"# {kernel} with the whole row in one block" in added and "the row is read once" in added
        assert "# the whole row in one block, read once" in added
    else:
        assert f"{row} is still loaded at {n} sites" in c.hypothesis and f"{row} is still loaded at {n} sites" in added
        assert "read once" not in added and "loaded once" not in c.hypothesis
    return n


@pytest.mark.parametrize("op,expected", [("softmax", 1), ("layernorm", 2), ("rmsnorm", 2)])
def test_whole_row_claims_match_the_loads_of_the_row_in_the_twin(op, expected):
    assert check_whole_row_claims(own(op), f"{op}_kernel", "x_ptr") == expected


def test_whole_row_claims_on_liger_softmax(liger_kernel):
    source = (liger_kernel / "ops" / "softmax.py").read_text()
    assert check_whole_row_claims(source, "_softmax_multi_block_forward_kernel", "X_ptr") == 1


def test_whole_row_in_place_twin_does_not_claim_tuned_warps():
    source = own("softmax").replace("out_row = out_ptr + row * stride_out", "out_row = x_ptr + row * stride_out")
    (c,) = cands("triton-whole-row", source)
    assert "@triton.autotune" not in c.source
    assert "num_warps tuned" not in c.hypothesis and "num_warps = row block / 512, 4 to 16" in c.hypothesis


STEP = re.compile(r"x?(\d+(?:/\d+)?)\)? -> x?(\d+(?:/\d+)?)")  # "4 -> 8", "(default 3) -> 4", "x1 -> x1/2"


def launch_param_cases(liger_kernel: Path) -> list:
    return [own("attention"), own("matmul"), own("softmax"), (liger_kernel / "ops" / "rms_norm.py").read_text()]


def test_launch_param_hypotheses_go_the_way_the_step_goes(liger_kernel):
    seen = {"up": 0, "down": 0}
    for source in launch_param_cases(liger_kernel):
        for c in cands("launch-param", source):
            old, new = (Fraction(v) for v in STEP.search(c.title).groups())
            if new > old:
                seen["up"] += 1
                assert not re.search(r"\b(fewer threads|shallower|fewer registers per program)\b", c.hypothesis), c.key
            else:
                seen["down"] += 1
                assert not re.search(r"\b(more threads|deeper|more bytes in flight)\b", c.hypothesis), c.key
                assert re.search(r"\b(fewer|shallower)\b", c.hypothesis), c.key
    assert seen["up"] and seen["down"]


def persistent_cases(liger_kernel: Path) -> list:
    return [(own("vector_add"), "add_kernel"), (own("rmsnorm"), "rmsnorm_kernel"),
            ((liger_kernel / "ops" / "softmax.py").read_text(), "_softmax_single_block_forward_kernel"),
            ((liger_kernel / "ops" / "swiglu.py").read_text(), "_swiglu_forward_kernel")]


def test_persistent_names_only_setup_it_moved_before_the_loop(liger_kernel):
    moved_somewhere = False
    for source, kernel in persistent_cases(liger_kernel):
        (c,) = [c for c in cands("triton-persistent", source) if c.key == f"triton-persistent:{kernel}"]
        fn = function(c.source, kernel)
        loop_at = next(i for i, s in enumerate(fn.body) if isinstance(s, ast.For))
        before = [t.id for s in fn.body[:loop_at] if isinstance(s, ast.Assign) for t in s.targets
                  if isinstance(t, ast.Name)]
        m = re.search(r"(\d+) setup statement\(s\) \(([^)]*)\) now run once per program", c.hypothesis)
        if before:
            moved_somewhere = True
            assert m and int(m.group(1)) == len(before) and m.group(2).split(", ") == before, (c.key, before)
        else:
            assert m is None and "none moves out of the loop" in c.hypothesis, c.key
    assert moved_somewhere
