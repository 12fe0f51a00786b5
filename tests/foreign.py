"""Code this project did not write, installed from PyPI at test time (never copied into the
project): Liger-Kernel's Triton ops and TileGym's cuTile ops, as a user's repository holds them.

`installed(requirement)` pip-installs one pinned distribution, without its dependencies, into a
folder of its own under the pytest session's temporary directory (once per session) and returns
that folder; `user_repo(root, files)` makes a git repository of the given files, committed, the way
a user's project holds an op module and the spec written for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

LIGER = "liger-kernel==0.8.5"
TILEGYM = "tilegym==1.5.1"

_CACHE: dict[str, Path] = {}


def installed(requirement: str, base: Path) -> Path:
    """The folder that `pip install --no-deps --target` of `requirement` filled (its packages at
    the top). Fails the test with pip's output when the install fails: a check that cannot run is
    not a pass."""
    if requirement in _CACHE:
        return _CACHE[requirement]
    dest = base / requirement.replace("==", "-").replace("[", "_").replace("]", "")
    if not dest.exists():
        tmp = dest.with_suffix(".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                              "--disable-pip-version-check", "--target", str(tmp), requirement],
                             capture_output=True, text=True, timeout=600, env={**os.environ, "PIP_NO_INPUT": "1"})
        if out.returncode != 0:
            raise AssertionError(f"pip install {requirement} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        tmp.rename(dest)
    _CACHE[requirement] = dest
    return dest


def git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                         cwd=root, check=True, capture_output=True, text=True)
    return out.stdout


def user_repo(root: Path, files: dict[str, str | Path]) -> Path:
    """A git repository at `root` holding `files` (relative path -> text, or a file to copy), all
    committed on one commit; returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, path)
        else:
            path.write_text(content)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a user's kernel and its spec")
    return root
