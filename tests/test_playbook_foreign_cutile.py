"""The cuTile playbook on code this project did not write: TileGym 1.5.1's rms_norm and softmax op
modules, unmodified, installed from PyPI for the session.

TileGym's op modules export their backward passes as functions of their own (`rms_norm_backward`),
which nothing in the module calls. Read as entry points, they put the backward kernel on the forward
path, and recipes changed it (seen on an H100: `cutile-latency` and `cutile-approx` rewrote
`_rms_bwd_kernel` beside the forward kernels, in a run whose bench timed the forward pass only, so
that part of the kept change went unmeasured). What must hold: the forward path is read from the
forward functions; no candidate of any cuTile recipe changes a kernel only a backward pass launches;
at least one recipe still proposes for each op.
"""

from __future__ import annotations

import ast

import pytest

import playbook
from playbook.analysis import analyze
from playbook.base import attempt

OPS = ("rms_norm", "softmax")


def kernels(source: str) -> dict[str, str]:
    """The code of every module-level function, by name."""
    tree = ast.parse(source)
    return {s.name: ast.get_source_segment(source, s) for s in tree.body if isinstance(s, ast.FunctionDef)}


def cutile_candidates(source: str) -> dict[str, list]:
    an = analyze(source)
    return {r.id: list(attempt(r, source, an)[0]) if r.applies(an) else [] for r in playbook.recipes()
            if "cutile" in r.languages}


def test_the_backward_kernel_of_tilegym_rms_norm_is_off_the_forward_path(tilegym):
    source = (tilegym / "ops" / "cutile" / "rms_norm.py").read_text()
    an = analyze(source)
    assert an.forward is not None and "_rms_bwd_kernel" not in an.forward, (an.entry, an.forward)
    assert {"_rms_norm_kernel_gather", "_rms_norm_kernel_static_persistent"} <= an.forward
    assert not any("backward" in root for root in an.entry), an.entry


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
def test_no_cutile_candidate_changes_a_backward_kernel_of_tilegym(tilegym, op):
    source = (tilegym / "ops" / "cutile" / f"{op}.py").read_text()
    before = kernels(source)
    backward = {name for name in before if "bwd" in name or "backward" in name}
    proposed = cutile_candidates(source)
    assert any(proposed.values()), "no cuTile recipe proposes anything for TileGym's " + op
    for recipe, candidates in proposed.items():
        for cand in candidates:
            after = kernels(cand.source)
            changed = {name for name in backward if after.get(name) != before[name]}
            assert not changed, (recipe, cand.key, sorted(changed))
