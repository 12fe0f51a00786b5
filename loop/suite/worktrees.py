"""Where a suite's runs live: a run is found by its target (its id and branch), in the repository or in
the git worktree of the GPU that ran it; a finished run keeps its entry; `--restart` forgets a run
in whichever tree holds it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from loop.records import gitops
from loop.run import state as st

WORKTREES = "suite-worktrees"  # under sandbox/: one git worktree per GPU when the suite runs on several


def git_output(root: Path, *args: str) -> str:
    return gitops.run_git(root, *args)  # no hook or planted configuration runs


def run_id_of(target: str) -> str:
    return f"suite-{Path(target).stem.replace('_', '-')}"


def branch_of(target: str) -> str:
    return f"tileloop/{run_id_of(target)}"


def existing_run(run_root: Path, target: str) -> dict | None:
    """The state of the target's suite run in `run_root` (what its records say included, `state.view`),
    if one was started there."""
    return st.view(run_root, run_id_of(target))


def run_trees(root: Path) -> list[Path]:
    """Where a suite's runs can live: the repository and every worktree a suite made under
    sandbox/suite-worktrees/, whichever GPUs the current call was given."""
    return [root] + sorted(p for p in (root / "sandbox" / WORKTREES).glob("gpu*") if p.is_dir())


def holder_of(root: Path, target: str) -> Path | None:
    """The tree (of `run_trees`) that holds the target's suite run, if one was started anywhere."""
    return next((tree for tree in run_trees(root) if existing_run(tree, target) is not None), None)


def forget_run(trees: list[Path], target: str, out_dir: Path | None = None) -> list[str]:
    """Forget the target's suite run: its branch, its records in each of `trees` (the repository
    and its worktrees), and with `out_dir` its entry, report and log there. What was removed."""
    branch, run_id, gone = branch_of(target), run_id_of(target), []

    def shown(path: Path) -> str:
        return str(path.relative_to(trees[0])) if trees and path.is_relative_to(trees[0]) else str(path)

    for tree in trees:
        if git_output(tree, "rev-parse", "--abbrev-ref", "HEAD") == branch:
            git_output(tree, "checkout", "-q", "--detach")  # a branch checked out anywhere cannot be deleted
        if (tree / "sandbox" / run_id).exists():
            shutil.rmtree(tree / "sandbox" / run_id)
            gone.append(shown(tree / "sandbox" / run_id))
    if trees and git_output(trees[0], "branch", "--list", branch):
        git_output(trees[0], "branch", "-D", branch)
        gone.append(f"branch {branch}")
    if out_dir is not None and out_dir.is_dir():
        for f in sorted([*out_dir.glob(f"{run_id}-*"), *out_dir.glob(f"{run_id}.json"), *out_dir.glob(f"{run_id}.log")]):
            f.unlink()
            gone.append(shown(f))
    return gone


def finished(state: dict) -> bool:
    """A run whose stop rule fired (stop or escalate) and that has no experiment in flight."""
    return (state.get("stopped") or {}).get("state") in ("stop", "escalate") and not state.get("inflight")


def entry_of_finished(path: Path, state: dict) -> dict | None:
    """The suite entry a finished run already has, if it is whole: written after the run stopped
    (as many experiments as the run recorded) and holding a final measurement."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if entry.get("error") or not entry.get("final") or entry.get("final_error"):
        return None
    if entry.get("iterations") != state.get("last_iteration"):
        return None
    return entry
