"""Git cannot be used against the run: every git command tileloop runs goes through
`loop.records.gitops` and runs no hook, fsmonitor command or filter driver, wherever one was planted
(.git/hooks, a hooksPath, .git/config, .git/info/attributes, .gitattributes, the global config); the
repository's own git files are put back from the run's snapshot by plain file operations."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

from loop.records import git_files, gitops

ROOT = Path(__file__).resolve().parent.parent
HOOKS = ("post-commit", "post-rewrite", "reference-transaction", "post-checkout", "prepare-commit-msg", "pre-commit",
         "commit-msg", "post-index-change", "pre-auto-gc")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout


def script(path: Path, marker: Path, tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho \"$0\" >> '{marker}'\n{tail}")
    path.chmod(0o755)


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A repository (two commits) where every git command would run something: hooks in .git/hooks and
    in a hooksPath, an fsmonitor command, a filter driver named by .git/info/attributes and by a
    .gitattributes, a second one only in the global configuration. Each writes to `ran`."""
    repo, ran = tmp_path / "repo", tmp_path / "ran.log"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "kernel.py").write_text("BLOCK = 128\n")
    (repo / "spec.py").write_text("SHAPES = [1]\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "first")
    (repo / "kernel.py").write_text("BLOCK = 256\n")
    git(repo, "commit", "-qam", "second")
    for hook in HOOKS:
        script(repo / ".git" / "hooks" / hook, ran)
        script(tmp_path / "elsewhere" / hook, ran)
    script(tmp_path / "fsmonitor", ran, "exit 1\n")
    script(tmp_path / "filter", ran, "cat\n")
    filter_cmd = tmp_path / "filter"
    with open(repo / ".git" / "config", "a") as fh:
        fh.write(f"[core]\n\thooksPath = {tmp_path / 'elsewhere'}\n\tfsmonitor = {tmp_path / 'fsmonitor'}\n"
                 f"[filter \"tidy\"]\n\tclean = {filter_cmd}\n\tsmudge = {filter_cmd}\n\trequired = true\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("*.py filter=tidy\n")
    (repo / ".gitattributes").write_text("spec.py filter=global\n")  # untracked: git reads it all the same
    (tmp_path / "global.gitconfig").write_text(f"[user]\n\tname = t\n\temail = t@t\n"
                                               f"[filter \"global\"]\n\tclean = {filter_cmd}\n\tprocess = {filter_cmd}\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "global.gitconfig"))
    monkeypatch.chdir(repo)
    return repo, ran


def test_every_planted_command_runs_under_plain_git(planted):
    """The plant works: plain git (as tileloop ran it before) runs the hooks, the fsmonitor and the filters."""
    repo, ran = planted
    (repo / "kernel.py").write_text("BLOCK = 512\n")
    git(repo, "commit", "-q", "--no-verify", "-am", "third")
    seen = ran.read_text()
    assert "post-commit" in seen and "reference-transaction" in seen and "prepare-commit-msg" in seen
    assert "fsmonitor" in seen and "filter" in seen


def test_no_git_call_of_tileloop_runs_a_planted_command(planted):
    repo, ran = planted
    head = gitops.head_sha(repo)
    assert gitops.find_root(repo) == repo.resolve() and gitops.current_branch(repo) == "main"
    (repo / "kernel.py").write_text("BLOCK = 512\n")
    (repo / "spec.py").write_text("SHAPES = [2]\n")
    assert gitops.tree_status(repo).modified_tracked == ("kernel.py", "spec.py")
    gitops.set_aside(repo, ["spec.py"], [], repo.parent / "aside")  # git diff, git checkout
    sha = gitops.commit(repo, "third\n\nTileloop-Run: r\n", ["kernel.py"])  # git add, git commit
    sha = gitops.amend_message(repo, "third\n\nTileloop-Run: r\nTileloop-Status: revert\n")
    gitops.update_ref(repo, "refs/tileloop/r/1", sha)
    gitops.reset_hard(repo, head)
    gitops.create_branch(repo, "tileloop/r")
    gitops.checkout(repo, "main")
    gitops.restore_file(repo, sha, "kernel.py")
    assert gitops.show_file(repo, sha, "kernel.py") == "BLOCK = 512\n"
    assert [t for _, _, t in gitops.log_with_trailers(repo, ["refs/tileloop/r/1"])][0]["Tileloop-Status"] == "revert"
    assert gitops.put_branch_back(repo, "tileloop/r", sha) and gitops.current_branch(repo) == "tileloop/r"
    gitops.run_git(repo, "status", "--porcelain")
    gitops.checkout(repo, "main")
    gitops.delete_branch(repo, "tileloop/r")
    gitops.ensure_excluded(repo, "/sandbox/")
    assert not ran.exists(), ran.read_text()


def test_a_filter_driver_git_cannot_be_told_to_drop_is_refused(planted):
    repo, _ = planted
    with open(repo / ".git" / "config", "a") as fh:
        fh.write('[filter "a=b"]\n\tclean = cat\n')
    with pytest.raises(gitops.UserError, match="filter driver"):
        gitops.tree_status(repo)


def test_the_git_files_are_put_back_as_they_were(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".git" / "info" / "exclude").write_text("/sandbox/\n")
    snap, aside = tmp_path / "snapshot", tmp_path / "aside"
    git_files.snapshot_git_dir(repo, snap)
    digest = git_files.git_dir_digest(snap)
    assert git_files.restore_git_dir(repo, snap, aside) == [] and not aside.exists()
    hooks, info = repo / ".git" / "hooks", repo / ".git" / "info"
    script(hooks / "post-commit", tmp_path / "ran")
    os.symlink(tmp_path / "elsewhere", hooks / "post-rewrite")
    sample = hooks / "pre-commit.sample"
    mode = sample.stat().st_mode & 0o777
    sample.chmod(mode ^ 0o111)  # a file's executable bits changed is a change too
    (info / "exclude").unlink()
    (info / "attributes").write_text("* filter=tidy\n")
    (repo / ".git" / "config.worktree").write_text("[core]\n\tfsmonitor = true\n")
    with open(repo / ".git" / "config", "a") as fh:
        fh.write("[core]\n\tfsmonitor = /bin/true\n")
    assert git_files.restore_git_dir(repo, snap, aside) == [".git/hooks", ".git/info", ".git/config",
                                                             ".git/config.worktree"]
    assert not (hooks / "post-commit").exists() and not (hooks / "post-rewrite").is_symlink()
    assert sample.stat().st_mode & 0o777 == mode
    assert (info / "exclude").read_text() == "/sandbox/\n" and not (info / "attributes").exists()
    assert "fsmonitor" not in (repo / ".git" / "config").read_text() and not (repo / ".git" / "config.worktree").exists()
    assert (aside / ".git/hooks" / "post-commit").exists() and (aside / ".git/info" / "attributes").exists()
    assert git_files.git_dir_digest(snap) == digest and git_files.restore_git_dir(repo, snap, aside / "again") == []


def _git_calls(tree: ast.AST) -> list[int]:
    """Lines that import GitPython or start the git binary (a list or tuple whose first item is "git")."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "git" or a.name.startswith("git.") for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "git":
            lines.append(node.lineno)
        elif isinstance(node, (ast.List, ast.Tuple)) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value == "git":
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "open_repo":
            lines.append(node.lineno)
    return lines


def test_every_git_call_goes_through_gitops():
    """No module but gitops imports GitPython, starts git or opens a Repo itself: they would run git
    without the settings that switch planted commands off."""
    found = {}
    for path in sorted((ROOT / "loop").rglob("*.py")) + sorted((ROOT / "playbook").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "loop/records/gitops.py":
            continue
        text = path.read_text()
        if not re.search(r"\bimport git\b|\bfrom git\b|[\"']git[\"']|open_repo", text):
            continue  # nothing to parse: the scan below only confirms these
        lines = _git_calls(ast.parse(text))
        if lines:
            found[rel] = lines
    assert not found, f"git driven outside loop/records/gitops.py: {found}"
    planted = ast.parse('import subprocess\nsubprocess.run(["git", "commit"])\n')
    assert _git_calls(planted) == [2]  # the scan itself sees one
