"""The repository's own git files, which git reads or runs on every command: `.git/hooks`,
`.git/info` (exclude, attributes, grafts) and `.git/config` (with a worktree's config.worktree).
Kernel code runs as the user and could plant a hook, a filter driver or an fsmonitor command there;
a run snapshots them at its start (`snapshot_git_dir`) and puts them back (`restore_git_dir`) before
each step and after each measurement, by plain file operations, before git reads them. Every git
command tileloop runs also switches them off (`gitops.safe_options`)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from loop.records import gitops

GUARDED = ("hooks", "info", "config", "config.worktree")  # what git runs or reads on every command


def guarded_paths(root: Path) -> dict[str, Path]:
    """`.git/<name>` -> where it is: in the common git dir (shared by every worktree), and a linked
    worktree's own config.worktree."""
    common, own = gitops.git_dirs(root)
    paths = {f".git/{name}": common / name for name in GUARDED}
    if own.resolve() != common.resolve():
        paths[".git/worktree/config.worktree"] = own / "config.worktree"
    return paths


def _listing(path: Path) -> dict[str, tuple]:
    """What a file or folder holds, without following links: relative path -> (kind, mode, content hash)."""
    def entry(p: Path) -> tuple:
        if p.is_symlink():
            return ("link", 0, os.readlink(p))
        if p.is_dir():
            return ("dir", 0, "")
        return ("file", p.stat().st_mode & 0o111, hashlib.sha256(p.read_bytes()).hexdigest())

    if not (path.exists() or path.is_symlink()):
        return {}
    out = {".": entry(path)}
    if out["."][0] == "dir":
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                out[str(p.relative_to(path))] = entry(p)
    return out


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dest, symlinks=True)
    else:
        shutil.copy2(src, dest, follow_symlinks=False)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def snapshot_git_dir(root: Path, dest: Path) -> None:
    """Copy the guarded git files as they are now (the run's start) under `dest`."""
    for name, live in guarded_paths(root).items():
        if live.exists() or live.is_symlink():
            _copy(live, dest / name)


def git_dir_digest(snapshot: Path) -> str:
    """One hash of a snapshot (sealed in the run's state: a snapshot rewritten is not restored from)."""
    return hashlib.sha256(repr(sorted(_listing(snapshot).items())).encode()).hexdigest()


def restore_git_dir(root: Path, snapshot: Path, aside: Path) -> list[str]:
    """Put the guarded git files back as `snapshot` holds them; what differed is moved under `aside`.
    Plain file operations, no git command: they run before git reads a planted file."""
    changed = []
    for name, live in guarded_paths(root).items():
        kept = snapshot / name
        if _listing(live) == _listing(kept):
            continue
        changed.append(name)
        if live.exists() or live.is_symlink():
            aside.mkdir(parents=True, exist_ok=True)
            _copy(live, aside / name)
            _remove(live)
        if kept.exists() or kept.is_symlink():
            _copy(kept, live)
    return changed
