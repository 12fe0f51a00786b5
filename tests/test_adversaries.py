"""Adversarial candidates (tests/adversaries/): each skips work or changes nothing and then reaches
into the process it is imported in (the comparison, the reference, the tolerances, torch, the clock,
the incumbent, the result file, the spec on disk). None may be kept: the judge computes references
and verdicts in a process that never imports the target, the incumbent runs in a process of its
own, timings are checked against the judge's clock, and the result never travels through a file a
kernel process can write; in a PID namespace of its own a kernel process cannot signal the judge
(forge_result's kill of its parent: where it can, expected.json's "shared_pid_namespace"). On the CPU
(Triton interpreter) here; on a GPU with `-m gpu`. An expectation's "says" is a phrase its decision's
reason must hold (the check that refused it). TILELOOP_TEST_ADVERSARIES=name,name steps only those
(the honest change after them is still stepped). An expectation with "writable" is stepped with
TILELOOP_READ_ONLY=0: it writes files (a forged result, the spec, git's hooks, the records), which a
read-only view refuses at its import; without one, what it tests is what guards the run behind it."""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import pytest

from loop.cli import main
from loop.common.processes import probe_isolation
from test_e2e_cpu import TARGET, git, small_repo  # noqa: F401  (fixture)

ADVERSARIES = Path(__file__).parent / "adversaries"
EXPECTED = json.loads((ADVERSARIES / "expected.json").read_text())


PLANTED_RAN = "planted-module-ran"  # tests/adversaries/plant_a_module.py's trace of a planted module that ran


@functools.cache
def read_only() -> bool:
    """Whether a judge's kernel processes see the machine read-only here (`tileloop doctor`'s probe)."""
    return (probe_isolation() or {}).get("filesystem") == "read-only"


def nothing_planted_ran(repo: Path, after: str) -> None:
    """No process imported a module a candidate planted (plant_a_module's leave a file where one ran:
    in a later step, a judge or a zygote working in the folder it planted in), and where a kernel
    process sees the machine read-only none was planted."""
    assert not list(repo.rglob(PLANTED_RAN)), after
    planted = [p for p in (repo / "sandbox").rglob("*.py") if p.name in ("statistics.py", "torch.py")]
    assert not (planted and read_only()), (after, planted)


def chosen() -> list[str]:
    """The adversaries to step: those TILELOOP_TEST_ADVERSARIES names (comma-separated), else all."""
    names = [n for n in os.environ.get("TILELOOP_TEST_ADVERSARIES", "").split(",") if n]
    unknown = sorted(set(names) - set(EXPECTED))
    if unknown:
        raise ValueError(f"TILELOOP_TEST_ADVERSARIES names no adversary: {', '.join(unknown)}")
    return sorted(names or EXPECTED)


def test_every_adversary_has_an_expectation():
    assert {p.stem for p in ADVERSARIES.glob("*.py")} == set(EXPECTED)


def step_each(repo: Path, capsys, names: list[str]) -> dict[str, dict]:
    """Step every named adversary as the agent's edit; the tree must come back to the best version."""
    baseline = git(repo, "rev-parse", "HEAD").strip()
    original = (repo / TARGET).read_text()
    spec = (repo / TARGET).parent / "spec.py"
    spec_text = spec.read_text()
    outs = {}
    for name in names:
        shutil.copy(ADVERSARIES / f"{name}.py", repo / TARGET)
        with pytest.MonkeyPatch.context() as patch:
            if EXPECTED[name].get("writable"):  # what guards the run where kernel code can write files: no read-only view
                patch.setenv("TILELOOP_READ_ONLY", "0")
            assert main(["step", "-m", f"adversary: {name}", "--json"]) == 0, name
        outs[name] = json.loads(capsys.readouterr().out)
        if EXPECTED[name]["status"] == "any" and outs[name]["status"] == "keep":
            # the incumbent's own code (its sabotage cannot reach the incumbent): an A/A that noise may keep,
            # which moves the branch to its source; the speedup it was kept at is checked below
            baseline, original = git(repo, "rev-parse", "HEAD").strip(), (repo / TARGET).read_text()
        assert git(repo, "rev-parse", "HEAD").strip() == baseline, (name, outs[name]["status"], outs[name]["decision"])
        assert (repo / TARGET).read_text() == original, name
        assert spec.read_text() == spec_text, name  # a spec rewritten during the measurement is restored
        assert git(repo, "status", "--porcelain", "--untracked-files=no") == "", name
        # git ran nothing a candidate planted (plant_git_hooks leaves hook-ran-* where one ran) and it is gone
        assert not list(repo.glob("hook-ran-*")) and not (repo / ".git" / "hooks" / "post-commit").exists(), name
        nothing_planted_ran(repo, name)
    return outs


def assert_expected(outs: dict[str, dict], device: str = "cpu") -> None:
    """Every adversary's verdict as expected.json says; every miss is listed at once (a kept one first)."""
    kept, other = [], []
    shared = (probe_isolation() or {}).get("pid_namespace") != "own"  # a kernel process can name its parent
    for name, out in outs.items():
        want = EXPECTED[name].get(device, EXPECTED[name])  # an expectation of its own on the GPU, where one differs
        want = want.get("shared_pid_namespace", want) if shared else want
        if want["verdict"] == "no effect":
            # the same code as the incumbent, and a sabotage of the incumbent that cannot reach it: whatever the
            # noise decides, the 3x slower incumbent it tried for must not show (a 3x slowdown reads as >= 3x)
            if not (out["speedup"] is None or out["speedup"] < 1.5):
                kept.append((name, out["decision"]))
            continue
        if out["status"] == "keep":
            kept.append((name, out["decision"]))
        elif (out["status"], out["decision"]["verdict"]) != (want["status"], want["verdict"]) or \
                want.get("says", "") not in out["decision"]["reason"]:
            other.append((name, out["status"], out["decision"]))
    assert not kept, f"kept: {kept}"
    assert not other, f"refused otherwise than expected: {other}"


@pytest.mark.slow
def test_no_adversary_is_kept_under_the_interpreter(small_repo, capsys):
    assert main(["init", TARGET, "--device", "cpu", "--branch", "tileloop/adversaries", "--archs", "none", "--json"]) == 0
    capsys.readouterr()
    honest = (small_repo / TARGET).read_text()
    assert_expected(step_each(small_repo, capsys, chosen()))
    # and an honest change is still kept afterwards: the kernel as it was before the adversaries (one
    # that changed nothing may have been kept as an A/A, its code the incumbent now), 8x fewer programs
    (small_repo / TARGET).write_text(honest.replace("BLOCK = 128", "BLOCK = 1024"))
    assert main(["step", "-m", "BLOCK 128 -> 1024", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "keep", out["decision"]
    nothing_planted_ran(small_repo, "the honest change")


@pytest.mark.gpu
def test_no_adversary_is_kept_on_the_gpu(kernel_repo, capsys):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    assert main(["init", TARGET, "--device", "cuda", "--branch", "tileloop/adversaries", "--archs", "none", "--json"]) == 0
    capsys.readouterr()
    assert_expected(step_each(kernel_repo, capsys, chosen()), device="gpu")
