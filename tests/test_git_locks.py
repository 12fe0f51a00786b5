"""A lock file git leaves when it is killed outright is removed before a resume touches the tree;
one that a live git command in the worktree holds is left alone."""

from __future__ import annotations

import subprocess

from loop.records import gitops
from tests.conftest import git


def _repo(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    return tmp_path


def test_a_lock_no_git_holds_is_removed_and_checkout_works_again(tmp_path):
    root = _repo(tmp_path)
    lock = root / ".git" / "index.lock"
    lock.touch()
    assert subprocess.run(["git", "checkout", "-q", "-b", "x"], cwd=root, capture_output=True).returncode == 128
    assert gitops.clear_stale_locks(root, grace_s=0.2) == ["index.lock"]
    assert not lock.exists()
    git(root, "checkout", "-q", "-b", "x")


def test_a_lock_is_kept_while_a_git_command_works_in_the_worktree(tmp_path):
    root = _repo(tmp_path)
    lock = root / ".git" / "index.lock"
    lock.touch()
    live = subprocess.Popen(["git", "cat-file", "--batch"], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        assert gitops.clear_stale_locks(root, grace_s=0.2) == []
        assert lock.exists()
    finally:
        live.communicate(b"")
    assert gitops.clear_stale_locks(root, grace_s=0.2) == ["index.lock"]


def test_nothing_to_clear_is_quick(tmp_path):
    assert gitops.clear_stale_locks(_repo(tmp_path)) == []
